#include "kernels/cuda/gemv.cuh"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <stdexcept>
#include <string>

#include "kernels/cuda/cuda_check.cuh"
#include "kernels/cuda/gemv_chunks.cuh"
#include "kernels/cuda/launch_overlap.cuh"
#include "kernels/cuda/paged_kv_device.cuh"

namespace tokenfab::kernels {

namespace {

using gemv_detail::Chunk;

constexpr int kWarp = 32;
constexpr int kWarps = 4;  // per block
constexpr int kThreads = kWarps * kWarp;
constexpr int kVec = 8;               // weights per step of the arithmetic
constexpr int64_t kWidePairs = 4096;  // from this many output pairs, two pairs per warp

__device__ float warp_sum(float v) {
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
__device__ void rotate(float& a, float& b, float c, float s) {
  const float x = a, y = b;
  a = __fsub_rn(__fmul_rn(x, c), __fmul_rn(y, s));
  b = __fadd_rn(__fmul_rn(x, s), __fmul_rn(y, c));
}

// Row r's outputs j0 and j1 (has1: j1 exists) of the product, y0 and y1, through the epilogue.
__device__ void finish(const GemvArgs& a, int r, int64_t j0, int64_t j1, bool has1, float y0,
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

// Grid: one block per kWarps·P output pairs (S = 1), or per P pairs (S = kWarps); kThreads
// threads. With S = 1 each warp owns P pairs (2·P weight rows), so that every activation load
// serves 2·P rows, and a lane takes the chunks lane, lane + 32, … of the rows. With S = kWarps
// (narrow matrices of long rows: four times the warps streaming) the block's warps share the
// pairs, warp w taking the chunks 32·w + lane, 32·w + lane + 128, …, and their sums meet in shared
// memory, added in warp order. Either way a row's sums do not depend on how many x rows the call
// has, so a row comes out the same, bit for bit, at any m. Before it waits for the previous kernel
// (a.overlap) a warp issues its first chunks' loads and prefetches the rest of its rows into L2
// (calls of up to kGemvL2PrefetchBytes); the arithmetic, and so every output, is the same with and
// without the overlap.
template <GemvWeights F, int M, int P, int S>
__global__ void __launch_bounds__(kThreads) gemv_kernel(GemvArgs a) {
  using C = Chunk<F>;
  constexpr int R = 2 * P;
  constexpr int kUnroll = (M <= 2 ? 4 : 2) / P;  // chunks in flight per lane (P is 1 or 2)
  static_assert(S == 1 || S == kWarps, "a pair group is one warp's or the whole block's");
  __shared__ float inv_rms[M];
  __shared__ float partial[S][R][M];  // S = kWarps: each warp's sums, lane r's of x row r
  const int lane = threadIdx.x % kWarp;
  const int warp = threadIdx.x / kWarp;
  const bool swiglu = a.epilogue == GemvEpilogue::kSwiGlu;
  const int64_t n_pairs = swiglu ? a.n / 2 : (a.n + 1) / 2;
  const int64_t p0 = (static_cast<int64_t>(blockIdx.x) * (kWarps / S) + (S == 1 ? warp : 0)) * P;
  const bool active = p0 < n_pairs;  // the same for the whole block when S = kWarps
  int64_t j0[P], j1[P], rows[R];
  bool has1[P];
#pragma unroll
  for (int q = 0; q < P; ++q) {
    const int64_t p = min(p0 + q, n_pairs - 1);  // a missing pair repeats the last (not written)
    j0[q] = swiglu ? p : 2 * p;
    j1[q] = swiglu ? p + a.n / 2 : 2 * p + 1;
    has1[q] = j1[q] < a.n;
    rows[2 * q] = j0[q];
    rows[2 * q + 1] = has1[q] ? j1[q] : j0[q];
  }
  const int64_t n_vec = a.k / C::kElems;                     // chunks per weight row
  const int64_t first = (S == 1 ? 0 : warp * kWarp) + lane;  // this lane's first chunk
  constexpr int64_t kStride = kWarp * S;                     // and the distance to its next
  C raw[kUnroll][R];
  if (active) {
    load_chunks<R, kUnroll>(a, rows, first, kStride, n_vec, raw);
    // The rest of the rows' bytes past the first chunks, a 128-byte line a lane, into L2.
    const int64_t row_bytes = C::row_bytes(a);
    if (a.n * row_bytes <= kGemvL2PrefetchBytes) {
      const int64_t loaded = kUnroll * kStride * (row_bytes / n_vec);
      for (int64_t b = loaded + first * 128; b < row_bytes; b += kStride * 128) {
#pragma unroll
        for (int q = 0; q < R; ++q) {
          const char* line = static_cast<const char*>(C::row_start(a, rows[q])) + b;
          asm volatile("prefetch.global.L2 [%0];" ::"l"(line));
        }
      }
    }
  }
  overlap_release();
  overlap_wait();

  if (a.norm != nullptr) {  // a warp per x row: 1/√(mean(x²) + eps), as the CPU rms_norm
    for (int r = warp; r < a.m; r += kWarps) {
      const float* xr = a.x + r * a.x_stride;
      float ss = 0.0f;
      for (int64_t i = lane; i < a.k; i += kWarp) ss = fmaf(xr[i], xr[i], ss);
      ss = warp_sum(ss);
      if (lane == 0) inv_rms[r] = 1.0f / sqrtf(ss / static_cast<float>(a.k) + a.eps);
    }
    __syncthreads();
  }
  if (!active) return;

  float acc[R][M];
#pragma unroll
  for (int q = 0; q < R; ++q)
#pragma unroll
    for (int r = 0; r < M; ++r) acc[q][r] = 0.0f;
  // kUnroll chunks at a time: all their loads are issued before the arithmetic (the first
  // batch's before the wait).
  for (int64_t v0 = first; v0 < n_vec; v0 += kUnroll * kStride) {
    if (v0 != first) load_chunks<R, kUnroll>(a, rows, v0, kStride, n_vec, raw);
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t v = v0 + u * kStride;
      if (v < n_vec) accumulate<M, R>(a, inv_rms, v * C::kElems, raw[u], acc);
    }
  }

  // Every lane ends with every sum of its warp; lane r keeps x row r's.
  float y[R];
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
  if constexpr (S > 1) {  // the warps' sums, added in warp order by warp 0
    if (lane < M) {
#pragma unroll
      for (int q = 0; q < R; ++q) partial[warp][q][lane] = y[q];
    }
    __syncthreads();
    if (warp != 0) return;
    if (lane < M) {
#pragma unroll
      for (int q = 0; q < R; ++q) {
        float sum = partial[0][q][lane];
#pragma unroll
        for (int w = 1; w < S; ++w) sum += partial[w][q][lane];
        y[q] = sum;
      }
    }
  }
  if (lane >= a.m) return;
#pragma unroll
  for (int q = 0; q < P; ++q)
    if (p0 + q < n_pairs) finish(a, lane, j0[q], j1[q], has1[q], y[2 * q], y[2 * q + 1]);
}

template <GemvWeights F, int M>
void launch_rows(const GemvArgs& a, int64_t pairs, cudaStream_t stream) {
  // Two pairs per warp for wide matrices (fewer activation loads per weight byte); one for narrow
  // ones, whose few warps would otherwise leave SMs idle, and for narrow ones whose rows give
  // every lane of four warps a chunk, a block's four warps per pair (gemv_split_k). The choice
  // depends on the matrix alone, never on m.
  const bool wide = pairs >= kWidePairs;
  const bool split = gemv_split_k(a.weights, pairs, a.k) && a.split_k;
  const int64_t per_block = split ? 1 : (wide ? 2 : 1) * kWarps;
  const dim3 grid(static_cast<unsigned>((pairs + per_block - 1) / per_block));
  if (split) {
    launch_kernel(gemv_kernel<F, M, 1, kWarps>, grid, dim3(kThreads), stream, a.overlap, a);
  } else if (wide) {
    launch_kernel(gemv_kernel<F, M, 2, 1>, grid, dim3(kThreads), stream, a.overlap, a);
  } else {
    launch_kernel(gemv_kernel<F, M, 1, 1>, grid, dim3(kThreads), stream, a.overlap, a);
  }
}

template <GemvWeights F>
void launch_format(const GemvArgs& a, int64_t pairs, cudaStream_t stream) {
  if (a.m <= 1) {
    launch_rows<F, 1>(a, pairs, stream);
  } else if (a.m <= 2) {
    launch_rows<F, 2>(a, pairs, stream);
  } else if (a.m <= 4) {
    launch_rows<F, 4>(a, pairs, stream);
  } else {
    launch_rows<F, kGemvMaxRows>(a, pairs, stream);
  }
}

}  // namespace

bool gemv_split_k(GemvWeights weights, int64_t pairs, int64_t k) {
  const int64_t elems = weights == GemvWeights::kBf16 ? 8 : 32;  // per chunk (gemv_chunks.cuh)
  return pairs < kWidePairs && k / elems >= int64_t{kWarp} * kWarps;
}

bool gemv_supports(const float* x, int64_t x_stride, int m, const uint16_t* w, int64_t k) {
  return m >= 1 && m <= kGemvMaxRows && k > 0 && k % kVec == 0 && x_stride % 4 == 0 &&
         x_stride >= k && reinterpret_cast<uintptr_t>(x) % 16 == 0 &&
         reinterpret_cast<uintptr_t>(w) % 16 == 0;
}

void launch_gemv(const GemvArgs& a, cudaStream_t stream) {
  const std::string where = "launch_gemv: ";
  if (!gemv_supports(a.x, a.x_stride, a.m, a.w, a.k) || a.n <= 0)
    throw std::invalid_argument(
        where + "unsupported shape: m " + std::to_string(a.m) + ", n " + std::to_string(a.n) +
        ", k " + std::to_string(a.k) + ", x_stride " + std::to_string(a.x_stride) + " (m in 1.." +
        std::to_string(kGemvMaxRows) + ", k a multiple of 8, 16-byte aligned x and w)");
  if (a.norm != nullptr && reinterpret_cast<uintptr_t>(a.norm) % 16 != 0)
    throw std::invalid_argument(where + "the norm weight is not 16-byte aligned");
  if (a.weights != GemvWeights::kBf16 && (a.k % 32 != 0 || a.q == nullptr || a.scales == nullptr ||
                                          reinterpret_cast<uintptr_t>(a.q) % 16 != 0 ||
                                          reinterpret_cast<uintptr_t>(a.scales) % 4 != 0))
    throw std::invalid_argument(where + "block weights need k a multiple of 32 (k " +
                                std::to_string(a.k) +
                                ") and 16-byte aligned quants with their scales");
  const int64_t out_cols = a.epilogue == GemvEpilogue::kSwiGlu ? a.n / 2 : a.n;
  if (a.out == nullptr || a.out_stride < out_cols)
    throw std::invalid_argument(where + "out_stride " + std::to_string(a.out_stride) +
                                " is shorter than a row of " + std::to_string(out_cols));
  if (a.epilogue == GemvEpilogue::kSwiGlu && a.n % 2 != 0)
    throw std::invalid_argument(where + "SwiGLU needs an even n, not " + std::to_string(a.n));
  if (a.epilogue == GemvEpilogue::kRopeKv &&
      (a.head_dim <= 0 || a.head_dim % 2 != 0 || a.rot_dim < 0 || a.rot_dim % 2 != 0 ||
       a.rot_dim > a.head_dim || a.q_dim % a.head_dim != 0 || a.kv_dim % a.head_dim != 0 ||
       a.n != static_cast<int64_t>(a.q_dim) + 2 * static_cast<int64_t>(a.kv_dim) ||
       a.n_kv_head * a.head_dim != a.kv_dim || a.block_size <= 0 ||
       (a.rot_dim > 0 && a.rope == nullptr) || a.kv_slots == nullptr || a.k_pool == nullptr ||
       a.v_pool == nullptr))
    throw std::invalid_argument(
        where + "RoPE/KV epilogue: n " + std::to_string(a.n) + " is not q_dim " +
        std::to_string(a.q_dim) + " + 2·kv_dim " + std::to_string(a.kv_dim) + " of even heads of " +
        std::to_string(a.head_dim) + " (rot_dim " + std::to_string(a.rot_dim) +
        "), or the angles, a slot or a pool is missing");
  const int64_t pairs = a.epilogue == GemvEpilogue::kSwiGlu ? a.n / 2 : (a.n + 1) / 2;
  if ((pairs + kWarps - 1) / kWarps > 0x7fffffff)
    throw std::invalid_argument(where + "n exceeds one grid");
  switch (a.weights) {
    case GemvWeights::kBf16:
      launch_format<GemvWeights::kBf16>(a, pairs, stream);
      break;
    case GemvWeights::kQ4:
      launch_format<GemvWeights::kQ4>(a, pairs, stream);
      break;
    case GemvWeights::kQ8:
      launch_format<GemvWeights::kQ8>(a, pairs, stream);
      break;
  }
  TOKENFAB_CUDA_CHECK(cudaGetLastError());
}

}  // namespace tokenfab::kernels
