#pragma once
// Matrix-vector products for decode steps of a few rows: y = W·x for up to kGemvMaxRows rows of
// f32 activations against BF16 weights (row-major (n, k), the layout the cuBLASLt path takes) or
// against the file's own Q4_0, Q4_1 or Q8_0 blocks (gemv_blocks.h: 0.625 or 1.125 bytes a weight
// instead of 2), FP32 accumulation. The weights stream from memory once per call, 16 bytes per
// load, with a warp per pair of output rows (narrow matrices of long rows: a block of four warps
// per pair, each warp a quarter of the row); the activations are read from cache. A row's result
// does not depend on how many x rows a call has. What cuBLAS would need several kernels around for
// is fused into the one launch:
//   - an optional RMSNorm of each x row (x · 1/√(mean(x²) + eps) · norm) before the product;
//   - the epilogue: store, add into the output (a residual), SwiGLU of a stacked [gate | up]
//     product, or RoPE on a stacked [q | k | v] product with k and v written into the fp16
//     paged pool (block · block_size + row slots, the pool layout of rope.cuh's RopeKvStore).
// With `overlap` (launch_overlap.cuh) the launch may start while the previous kernel runs: each
// warp issues its first weight loads and prefetches the rest of its rows into L2 (calls of up to
// kGemvL2PrefetchBytes of weights), and reads x only once that kernel has finished.
// Mirrors, to f32 rounding of the sums' order, the CPU ops the model runner composes (rms_norm,
// matmul, rope, silu·up, kv store).

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/gemv_blocks.h"

namespace tokenfab::kernels {

inline constexpr int kGemvMaxRows = 8;
// Calls with at most this many weight bytes prefetch every row into L2 before they wait.
inline constexpr int64_t kGemvL2PrefetchBytes = int64_t{8} << 20;

enum class GemvEpilogue {
  kStore,   // out[r, j] = y[r, j]
  kAdd,     // out[r, j] += y[r, j]
  kSwiGlu,  // n even, j < n/2: out[r, j] = silu(y[r, j]) · y[r, n/2 + j]
  kRopeKv,  // y = [q | k | v] (n = q_dim + 2·kv_dim): out[r, ·] = y with RoPE on q and k by row
            // r's angles (rope); k and v also into k_pool / v_pool at kv_slots[r]
};

struct GemvArgs {
  const float* x = nullptr;  // (m, k) device f32, x_stride floats between rows
  int64_t x_stride = 0;
  int m = 0;                    // 1 … kGemvMaxRows
  const float* norm = nullptr;  // (k) RMSNorm weight, or null for no norm
  float eps = 0.0f;
  const uint16_t* w = nullptr;  // kBf16: (n, k) bf16 bits, row-major
  GemvWeights weights = GemvWeights::kBf16;
  const uint8_t* q = nullptr;        // kQ4 / kQ8: the quants (gemv_blocks.h), 16-byte aligned
  const uint32_t* scales = nullptr;  // kQ4 / kQ8: (n, k/32) fp16 pairs (d, m)
  int64_t n = 0;
  int64_t k = 0;  // a multiple of 8
  GemvEpilogue epilogue = GemvEpilogue::kStore;
  float* out = nullptr;  // (m, n) (kSwiGlu: (m, n/2)), out_stride floats between rows
  int64_t out_stride = 0;
  bool overlap = false;  // may overlap the previous kernel (compute capability ≥ 9.0)
  // Narrow matrices of long rows (gemv_split_k) split each row's k over a block's four warps
  // instead of giving each warp its own rows; false: never.
  bool split_k = true;
  // kRopeKv only:
  const float* rope = nullptr;        // (m, rot_dim) device: row r's cos[rot_dim/2] then
                                      // sin[rot_dim/2] at its position (the CPU's rope_table)
  const int32_t* kv_slots = nullptr;  // (m) device: block · block_size + offset in the block
  int q_dim = 0, kv_dim = 0, head_dim = 0, rot_dim = 0;
  int n_kv_head = 0, block_size = 0;
  uint16_t* k_pool = nullptr;  // one layer, (n_blocks, n_kv_head, block_size, head_dim) fp16 bits
  uint16_t* v_pool = nullptr;
};

// A call's product and epilogue; the norm and the RoPE/KV fields stay unset (no norm). Also
// device code (the fused decode layers build their products with it).
__host__ __device__ inline GemvArgs gemv_product(const float* x, int64_t x_stride, int m,
                                                 const uint16_t* w, int64_t n, int64_t k,
                                                 GemvEpilogue epilogue, float* out,
                                                 int64_t out_stride) {
  GemvArgs a;
  a.x = x;
  a.x_stride = x_stride;
  a.m = m;
  a.w = w;
  a.n = n;
  a.k = k;
  a.epilogue = epilogue;
  a.out = out;
  a.out_stride = out_stride;
  return a;
}

// Whether a matrix of `pairs` output pairs (n/2, rounded up; SwiGLU: n/2) and rows of k weights
// in `weights`' layout is multiplied with its rows' k split over four warps (GemvArgs::split_k):
// narrow ones (fewer than 4096 pairs) whose rows give every lane of four warps a chunk (k of at
// least 1,024 BF16 weights, or 4,096 in blocks).
bool gemv_split_k(GemvWeights weights, int64_t pairs, int64_t k);

// Whether launch_gemv takes this shape: 1 ≤ m ≤ kGemvMaxRows, k a positive multiple of 8, x and
// w 16-byte aligned with x_stride a multiple of 4 (the 16-byte loads). Block weights (kQ4, kQ8)
// also need k a multiple of 32 and the quants 16-byte aligned (launch_gemv checks).
bool gemv_supports(const float* x, int64_t x_stride, int m, const uint16_t* w, int64_t k);

// The args' weights as `blocks`' device copy when it has a quantized form (format not kBf16),
// else unchanged (the BF16 weights already in args). q and scales: device copies of blocks.q and
// blocks.scales.
inline void use_gemv_blocks(GemvArgs& args, GemvWeights format, const uint8_t* q,
                            const uint32_t* scales) {
  if (format == GemvWeights::kBf16 || q == nullptr || scales == nullptr) return;
  args.weights = format;
  args.q = q;
  args.scales = scales;
}

// Asynchronous on `stream`. Throws std::invalid_argument for a shape gemv_supports refuses or an
// epilogue's inconsistent sizes, std::runtime_error if the launch fails.
void launch_gemv(const GemvArgs& args, cudaStream_t stream);

}  // namespace tokenfab::kernels
