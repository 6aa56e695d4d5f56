#include "kernels/cuda/gemv.cuh"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <stdexcept>
#include <string>

#include "kernels/cuda/cuda_check.cuh"
#include "kernels/cuda/gemv_warp.cuh"
#include "kernels/cuda/launch_overlap.cuh"

namespace tokenfab::kernels {

namespace {

using gemv_detail::Chunk;
using gemv_detail::finish;
using gemv_detail::kVec;
using gemv_detail::kWarp;
using gemv_detail::lane_row_sums;
using gemv_detail::load_chunks;
using gemv_detail::row_inv_rms;
using gemv_detail::row_products;

constexpr int kWarps = 4;  // per block
constexpr int kThreads = kWarps * kWarp;
constexpr int64_t kWidePairs = 4096;  // from this many output pairs, two pairs per warp

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
      const float inv = row_inv_rms(a.x + r * a.x_stride, a.k, a.eps, lane);
      if (lane == 0) inv_rms[r] = inv;
    }
    __syncthreads();
  }
  if (!active) return;

  float acc[R][M];
  row_products<M, R, kUnroll>(a, inv_rms, rows, first, kStride, n_vec, raw, true, acc);

  float y[R];
  lane_row_sums<M, R>(acc, y, lane);
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
