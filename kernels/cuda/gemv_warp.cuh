#pragma once
// The warp arithmetic of the decode GEMV (gemv.cu), shared with the fused decode layers
// (decode_layers.cu), so that both compute a row's products, norms and epilogues the same way, bit
// for bit: the chunked multiply-adds, the RMSNorm scale of an x row, and the epilogues (store,
// residual add, SwiGLU, RoPE with the KV store). Include from .cu files only.

#include <cuda_fp16.h>

#include <cstdint>

#include "kernels/cuda/gemv.cuh"
#include "kernels/cuda/gemv_chunks.cuh"
#include "kernels/cuda/paged_kv_device.cuh"

namespace tokenfab::kernels::gemv_detail {

inline constexpr int kWarp = 32;
inline constexpr int kVec = 8;  // weights per step of the arithmetic

__device__ inline float warp_sum(float v) {
  for (int offset = kWarp / 2; offset > 0; offset /= 2)
    v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

// Adds the chunk at kk (C::kElems weights of each of the warp's R rows, eight at a time) times
// every x row.
template <int M, int R, class C>
__device__ void accumulate(const GemvArgs& a, const float* inv_rms, int64_t kk, const C (&raw)[R],
                           float (&acc)[R][M]) {
#pragma unroll
  for (int part = 0; part < C::kElems / kVec; ++part) {
    const int64_t k8 = kk + part * kVec;
    float w[R][kVec], g[kVec];
#pragma unroll
    for (int q = 0; q < R; ++q) raw[q].weights(part, w[q]);
    if (a.norm != nullptr) {
      const float4 g0 = __ldg(reinterpret_cast<const float4*>(a.norm + k8));
      const float4 g1 = __ldg(reinterpret_cast<const float4*>(a.norm + k8 + 4));
      g[0] = g0.x, g[1] = g0.y, g[2] = g0.z, g[3] = g0.w;
      g[4] = g1.x, g[5] = g1.y, g[6] = g1.z, g[7] = g1.w;
    }
#pragma unroll
    for (int r = 0; r < M; ++r) {
      if (r >= a.m) break;
      const float* xr = a.x + r * a.x_stride + k8;
      const float4 x0 = *reinterpret_cast<const float4*>(xr);
      const float4 x1 = *reinterpret_cast<const float4*>(xr + 4);
      float xs[kVec] = {x0.x, x0.y, x0.z, x0.w, x1.x, x1.y, x1.z, x1.w};
      if (a.norm != nullptr) {
#pragma unroll
        for (int t = 0; t < kVec; ++t) xs[t] = xs[t] * inv_rms[r] * g[t];  // the CPU's x·scale·w
      }
#pragma unroll
      for (int t = 0; t < kVec; ++t) {
#pragma unroll
        for (int q = 0; q < R; ++q) acc[q][r] = fmaf(w[q][t], xs[t], acc[q][r]);
      }
    }
  }
}

// The RoPE rotation of the pair (a, b) by the angle whose cosine and sine are c and s: the CPU's
// rope, with separately rounded products (no fused multiply-add there).
__device__ inline void rotate(float& a, float& b, float c, float s) {
  const float x = a, y = b;
  a = __fsub_rn(__fmul_rn(x, c), __fmul_rn(y, s));
  b = __fadd_rn(__fmul_rn(x, s), __fmul_rn(y, c));
}

// Row r's outputs j0 and j1 (has1: j1 exists) of the product, y0 and y1, through the epilogue.
__device__ inline void finish(const GemvArgs& a, int r, int64_t j0, int64_t j1, bool has1, float y0,
                              float y1) {
  float* out = a.out + r * a.out_stride;
  switch (a.epilogue) {
    case GemvEpilogue::kStore:
      out[j0] = y0;
      if (has1) out[j1] = y1;
      break;
    case GemvEpilogue::kAdd:
      out[j0] += y0;
      if (has1) out[j1] += y1;
      break;
    case GemvEpilogue::kSwiGlu:  // j0 = gate row, j1 = its up row
      out[j0] = y0 / (1.0f + expf(-y0)) * y1;
      break;
    case GemvEpilogue::kRopeKv: {  // j0 even, j1 = j0 + 1: one element pair of one head
      const int64_t qk_end = static_cast<int64_t>(a.q_dim) + a.kv_dim;
      const int64_t base = j0 < a.q_dim ? 0 : (j0 < qk_end ? a.q_dim : qk_end);
      const int d = static_cast<int>((j0 - base) % a.head_dim);
      if (j0 < qk_end && d < a.rot_dim) {
        const float* angles = a.rope + static_cast<int64_t>(r) * a.rot_dim;  // cos, then sin
        rotate(y0, y1, angles[d / 2], angles[a.rot_dim / 2 + d / 2]);
      }
      out[j0] = y0;
      out[j1] = y1;
      if (j0 >= a.q_dim) {  // k or v: into the pool, fp16
        const int64_t c = j0 - base;
        const int64_t slot = a.kv_slots[r];
        const int64_t dst = cuda_detail::pool_row(slot / a.block_size, slot % a.block_size,
                                                  static_cast<int>(c / a.head_dim), a.n_kv_head,
                                                  a.block_size, a.head_dim) +
                            d;
        uint16_t* pool = j0 < qk_end ? a.k_pool : a.v_pool;
        pool[dst] = __half_as_ushort(__float2half_rn(y0));
        pool[dst + 1] = __half_as_ushort(__float2half_rn(y1));
      }
      break;
    }
  }
}

// Issues the weight loads of the chunks at v0, v0 + stride, … (kUnroll of them) of the warp's R
// rows; chunks past the row's end are left unloaded.
template <int R, int kUnroll, class C>
__device__ void load_chunks(const GemvArgs& a, const int64_t (&rows)[R], int64_t v0, int64_t stride,
                            int64_t n_vec, C (&raw)[kUnroll][R]) {
#pragma unroll
  for (int u = 0; u < kUnroll; ++u) {
    const int64_t v = v0 + u * stride;
    if (v < n_vec) {
#pragma unroll
      for (int q = 0; q < R; ++q) raw[u][q].load(a, rows[q], v);
    }
  }
}

// acc[q][r] = this lane's share of weight row rows[q] times x row r: the chunks first,
// first + stride, … of the rows (n_vec chunks a row), kUnroll at a time with all their loads issued
// before the arithmetic. With first_loaded, raw already holds the first kUnroll chunks (issued
// early, before a wait); otherwise they are loaded here.
template <int M, int R, int kUnroll, class C>
__device__ void row_products(const GemvArgs& a, const float* inv_rms, const int64_t (&rows)[R],
                             int64_t first, int64_t stride, int64_t n_vec, C (&raw)[kUnroll][R],
                             bool first_loaded, float (&acc)[R][M]) {
#pragma unroll
  for (int q = 0; q < R; ++q)
#pragma unroll
    for (int r = 0; r < M; ++r) acc[q][r] = 0.0f;
  for (int64_t v0 = first; v0 < n_vec; v0 += kUnroll * stride) {
    if (v0 != first || !first_loaded) load_chunks<R, kUnroll>(a, rows, v0, stride, n_vec, raw);
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t v = v0 + u * stride;
      if (v < n_vec) accumulate<M, R>(a, inv_rms, v * C::kElems, raw[u], acc);
    }
  }
}

// The warp's sums of acc over its lanes: every lane ends with every sum, and lane r keeps x row
// r's in y (the rows' sums, y[q] for weight row q; 0 on lanes past M).
template <int M, int R>
__device__ void lane_row_sums(const float (&acc)[R][M], float (&y)[R], int lane) {
#pragma unroll
  for (int q = 0; q < R; ++q) y[q] = 0.0f;
#pragma unroll
  for (int r = 0; r < M; ++r) {
#pragma unroll
    for (int q = 0; q < R; ++q) {
      const float sum = warp_sum(acc[q][r]);
      if (lane == r) y[q] = sum;
    }
  }
}

// 1/√(mean(x²) + eps) of the row xr of k floats, as the CPU rms_norm computes it (IEEE sqrt and
// division), summed by one warp: lane i takes elements i, i + 32, …; every lane gets the result.
__device__ inline float row_inv_rms(const float* xr, int64_t k, float eps, int lane) {
  float ss = 0.0f;
  for (int64_t i = lane; i < k; i += kWarp) ss = fmaf(xr[i], xr[i], ss);
  ss = warp_sum(ss);
  return 1.0f / sqrtf(ss / static_cast<float>(k) + eps);
}

}  // namespace tokenfab::kernels::gemv_detail
