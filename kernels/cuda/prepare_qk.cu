#include "kernels/cuda/prepare_qk.cuh"

#include <cuda_fp16.h>

#include <stdexcept>
#include <string>

#include "kernels/cuda/cuda_check.cuh"
#include "kernels/cuda/launch_overlap.cuh"
#include "kernels/cuda/paged_kv_device.cuh"

namespace tokenfab::kernels {

namespace {

constexpr int kWarp = 32;
constexpr int kThreads = 128;

// The sum of v over the block's kThreads threads, returned to every thread. red: kThreads / kWarp
// floats of shared memory, free again when the call returns.
__device__ float block_sum(float v, float* red) {
  for (int offset = kWarp / 2; offset > 0; offset /= 2)
    v += __shfl_xor_sync(0xffffffffu, v, offset);
  if (threadIdx.x % kWarp == 0) red[threadIdx.x / kWarp] = v;
  __syncthreads();
  float sum = 0.0f;
  for (int w = 0; w < kThreads / kWarp; ++w) sum += red[w];
  __syncthreads();
  return sum;
}

// Grid (x: row, y: head of the row: q heads, then k heads, then v heads); kThreads threads, each
// taking elements threadIdx.x, + kThreads, … of the head. The head is read (with its bias) into
// shared memory, normalised there, then rotated into the row (and the pool).
__global__ void prepare_qk_kernel(PrepareQkArgs a) {
  __shared__ float x_s[kPrepareQkMaxHeadDim];  // (head_dim) the head after bias and norm
  __shared__ float red_s[kThreads / kWarp];
  overlap_release();
  overlap_wait();  // everything below reads what earlier kernels wrote
  const int64_t r = blockIdx.x;
  const int h = static_cast<int>(blockIdx.y);
  const int d_head = a.head_dim;
  const bool is_q = h < a.n_head;
  const bool is_v = h >= a.n_head + a.n_kv_head;
  float* x = a.qkv + r * a.row_stride + static_cast<int64_t>(h) * d_head;  // (head_dim)

  for (int d = threadIdx.x; d < d_head; d += kThreads)
    x_s[d] = a.bias != nullptr ? x[d] + a.bias[static_cast<int64_t>(h) * d_head + d] : x[d];
  __syncthreads();
  // RMSNorm of a q or k head: the CPU's rounding steps (kernels::rms_norm; rms_norm.cu).
  const float* norm = is_v ? nullptr : is_q ? a.q_norm : a.k_norm;
  if (norm != nullptr) {
    float sum = 0.0f;
    for (int d = threadIdx.x; d < d_head; d += kThreads) sum = fmaf(x_s[d], x_s[d], sum);
    sum = block_sum(sum, red_s);
    const float scale = 1.0f / sqrtf(sum / static_cast<float>(d_head) + a.eps);
    for (int d = threadIdx.x; d < d_head; d += kThreads) x_s[d] = x_s[d] * scale * norm[d];
    __syncthreads();
  }

  const int half = a.rot_dim / 2;
  const float* cos_t = a.rope != nullptr ? a.rope + r * a.rot_dim : nullptr;  // (half)
  const float* sin_t = cos_t != nullptr ? cos_t + half : nullptr;             // (half)
  const bool rotate = !is_v && half > 0;
  uint16_t* pool = nullptr;
  int64_t dst = 0;
  if (!is_q && a.k_pool != nullptr) {
    const int g = is_v ? h - a.n_head - a.n_kv_head : h - a.n_head;
    const int64_t slot = a.kv_slots[r];
    dst = cuda_detail::pool_row(slot / a.block_size, slot % a.block_size, g, a.n_kv_head,
                                a.block_size, d_head);
    pool = is_v ? a.v_pool : a.k_pool;
  }
  for (int d = threadIdx.x; d < d_head; d += kThreads) {
    float out = x_s[d];
    if (rotate && d < a.rot_dim) {
      // Pair i of the head: (i, i + half) or (2i, 2i + 1); this element is its first or second.
      const int i = a.halves ? (d < half ? d : d - half) : d / 2;
      const bool first = a.halves ? d < half : d % 2 == 0;
      const float u = a.halves ? x_s[i] : x_s[2 * i];
      const float w = a.halves ? x_s[i + half] : x_s[2 * i + 1];
      // Separately rounded products, as the CPU (no fused multiply-add there).
      out = first ? __fsub_rn(__fmul_rn(u, cos_t[i]), __fmul_rn(w, sin_t[i]))
                  : __fadd_rn(__fmul_rn(u, sin_t[i]), __fmul_rn(w, cos_t[i]));
    }
    x[d] = out;
    if (pool != nullptr) pool[dst + d] = __half_as_ushort(__float2half_rn(out));
  }
}

}  // namespace

void launch_prepare_qk(const PrepareQkArgs& a, cudaStream_t stream, bool overlap) {
  const std::string where = "launch_prepare_qk: ";
  const int64_t heads = int64_t{a.n_head} + 2 * int64_t{a.n_kv_head};
  if (a.head_dim <= 0 || a.head_dim > kPrepareQkMaxHeadDim)
    throw std::invalid_argument(where + "head_dim " + std::to_string(a.head_dim) +
                                " is outside 1.." + std::to_string(kPrepareQkMaxHeadDim));
  if (a.rot_dim < 0 || a.rot_dim % 2 != 0 || a.rot_dim > a.head_dim ||
      (a.rot_dim > 0 && a.rope == nullptr))
    throw std::invalid_argument(where + "rot_dim " + std::to_string(a.rot_dim) +
                                " must be even, at most head_dim and come with a table");
  if (a.n_head <= 0 || a.n_kv_head <= 0 || heads > 65535 || a.rows < 0 ||
      a.row_stride < heads * a.head_dim)
    throw std::invalid_argument(where + "bad shape: rows " + std::to_string(a.rows) + ", " +
                                std::to_string(a.n_head) + " + 2·" + std::to_string(a.n_kv_head) +
                                " heads of " + std::to_string(a.head_dim) + ", row_stride " +
                                std::to_string(a.row_stride));
  if ((a.k_pool != nullptr) != (a.v_pool != nullptr) ||
      (a.k_pool != nullptr && (a.kv_slots == nullptr || a.block_size <= 0)))
    throw std::invalid_argument(where + "a KV store needs both pools, the slots and a block size");
  if (a.rows == 0) return;
  if (a.rows > 0x7fffffff)
    throw std::invalid_argument(where + std::to_string(a.rows) + " rows exceed one grid");
  launch_kernel(prepare_qk_kernel,
                dim3(static_cast<unsigned>(a.rows), static_cast<unsigned>(heads)), dim3(kThreads),
                stream, overlap, a);
}

}  // namespace tokenfab::kernels
