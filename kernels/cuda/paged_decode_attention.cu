#include "kernels/cuda/paged_decode_attention.cuh"

#include <cuda_fp16.h>

#include <stdexcept>
#include <string>

#include "kernels/cuda/cuda_check.cuh"

namespace tokenfab::kernels {

namespace {

constexpr int kWarp = 32;
constexpr int kWarps = 4;  // per split block; each warp takes every kWarps-th key of the split
constexpr int kPerLane = kPagedDecodeMaxHeadDim / kWarp;  // head elements a lane holds
constexpr int kCombineThreads = 128;

int64_t split_count(int32_t max_keys) {
  return (static_cast<int64_t>(max_keys) + kPagedDecodeSplitKeys - 1) / kPagedDecodeSplitKeys;
}

// Workspace views for one call: m and l are (n_rows, n_head, n_splits); acc is
// (n_rows, n_head, n_splits, head_dim).
struct Partials {
  float* m;
  float* l;
  float* acc;
  int n_splits;
};

__device__ float warp_sum(float v) {
  for (int offset = kWarp / 2; offset > 0; offset /= 2)
    v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

__device__ int32_t key_position(const CudaPagedRow& row, const int32_t* paths, int32_t key) {
  return key < row.n_ctx ? key : paths[row.path_begin + key - row.n_ctx];
}

// Grid (x: split, y: query head, z: row); kWarps warps. Lane `lane` owns head elements
// d = lane + 32·j (j < kPerLane, d < head_dim) of q, of its warp's running output and of every
// K/V row it reads, so a key's dot product is one warp reduction and its V row one coalesced read.
__global__ void paged_decode_split_kernel(CudaPagedKv kv, const CudaPagedRow* rows,
                                          const int32_t* paths, const float* q, int64_t q_stride,
                                          int n_head, float scale, Partials part) {
  __shared__ float warp_m[kWarps];
  __shared__ float warp_l[kWarps];
  __shared__ float warp_acc[kWarps][kPagedDecodeMaxHeadDim];

  const CudaPagedRow row = rows[blockIdx.z];
  const int head = blockIdx.y;
  const int split = blockIdx.x;
  const int32_t n_keys = row.n_ctx + row.path_len;
  const int32_t key0 = split * kPagedDecodeSplitKeys;
  if (key0 >= n_keys) return;  // a shorter row than the longest: the combine skips this split
  const int32_t key1 = min(n_keys, key0 + kPagedDecodeSplitKeys);

  const int lane = threadIdx.x % kWarp;
  const int warp = threadIdx.x / kWarp;
  const int head_dim = kv.head_dim;
  const int kv_head = head / (n_head / kv.n_kv_head);
  const float* qh = q + row.q_row * q_stride + static_cast<int64_t>(head) * head_dim;  // (head_dim)

  float qv[kPerLane];
  float acc[kPerLane];
#pragma unroll
  for (int j = 0; j < kPerLane; ++j) {
    const int d = lane + kWarp * j;
    qv[j] = d < head_dim ? qh[d] : 0.0f;
    acc[j] = 0.0f;
  }

  // Online softmax over this warp's keys: m is the largest score so far, l the sum of
  // exp(score − m), acc the sum of exp(score − m)·v.
  float m = -INFINITY;
  float l = 0.0f;
  for (int32_t key = key0 + warp; key < key1; key += kWarps) {
    const int32_t pos = key_position(row, paths, key);
    const int64_t off =
        ((static_cast<int64_t>(row.blocks[pos / kv.block_size]) * kv.n_kv_head + kv_head) *
             kv.block_size +
         pos % kv.block_size) *
        head_dim;
    const uint16_t* kr = kv.k + off;  // (head_dim)
    const uint16_t* vr = kv.v + off;  // (head_dim)
    float dot = 0.0f;
#pragma unroll
    for (int j = 0; j < kPerLane; ++j) {
      const int d = lane + kWarp * j;
      if (d < head_dim) dot = fmaf(qv[j], __half2float(__ushort_as_half(kr[d])), dot);
    }
    const float score = warp_sum(dot) * scale;
    const float m_new = fmaxf(m, score);
    const float correction = expf(m - m_new);  // 0 for the first key (m = −inf)
    const float p = expf(score - m_new);
    l = l * correction + p;
#pragma unroll
    for (int j = 0; j < kPerLane; ++j) {
      const int d = lane + kWarp * j;
      const float v = d < head_dim ? __half2float(__ushort_as_half(vr[d])) : 0.0f;
      acc[j] = fmaf(p, v, acc[j] * correction);
    }
    m = m_new;
  }

  if (lane == 0) {
    warp_m[warp] = m;
    warp_l[warp] = l;
  }
#pragma unroll
  for (int j = 0; j < kPerLane; ++j) warp_acc[warp][lane + kWarp * j] = acc[j];
  __syncthreads();

  // The split's partial: the warps rescaled to their common maximum (a warp without keys has
  // m = −inf and contributes 0). The split has at least one key, so that maximum is finite.
  float split_m = warp_m[0];
  for (int w = 1; w < kWarps; ++w) split_m = fmaxf(split_m, warp_m[w]);
  const int64_t slot = (static_cast<int64_t>(blockIdx.z) * n_head + head) * part.n_splits + split;
  for (int d = threadIdx.x; d < head_dim; d += blockDim.x) {
    float sum = 0.0f;
    for (int w = 0; w < kWarps; ++w) sum += warp_acc[w][d] * expf(warp_m[w] - split_m);
    part.acc[slot * head_dim + d] = sum;
  }
  if (threadIdx.x == 0) {
    float split_l = 0.0f;
    for (int w = 0; w < kWarps; ++w) split_l += warp_l[w] * expf(warp_m[w] - split_m);
    part.m[slot] = split_m;
    part.l[slot] = split_l;
  }
}

// Grid (x: query head, y: row); kCombineThreads threads. Dynamic shared memory: n_splits floats,
// each split's weight exp(m_s − M) (M: the largest m_s); the output is Σ_s weight_s·acc_s divided
// by Σ_s weight_s·l_s.
__global__ void paged_decode_combine_kernel(const CudaPagedRow* rows, int head_dim, float* out,
                                            int64_t out_stride, int n_head, Partials part) {
  extern __shared__ float weights[];  // (n_splits)
  __shared__ float total;
  const CudaPagedRow row = rows[blockIdx.y];
  const int head = blockIdx.x;
  const int64_t n_keys = static_cast<int64_t>(row.n_ctx) + row.path_len;
  const int n_splits =
      static_cast<int>((n_keys + kPagedDecodeSplitKeys - 1) / kPagedDecodeSplitKeys);
  const int64_t slot0 = (static_cast<int64_t>(blockIdx.y) * n_head + head) * part.n_splits;
  float* oh = out + row.q_row * out_stride + static_cast<int64_t>(head) * head_dim;  // (head_dim)

  if (threadIdx.x < kWarp) {  // warp 0: the largest split maximum, then the weights and their sum
    float big = -INFINITY;
    for (int s = threadIdx.x; s < n_splits; s += kWarp) big = fmaxf(big, part.m[slot0 + s]);
    for (int offset = kWarp / 2; offset > 0; offset /= 2)
      big = fmaxf(big, __shfl_xor_sync(0xffffffffu, big, offset));
    float sum = 0.0f;
    for (int s = threadIdx.x; s < n_splits; s += kWarp) {
      weights[s] = expf(part.m[slot0 + s] - big);
      sum += part.l[slot0 + s] * weights[s];
    }
    sum = warp_sum(sum);
    if (threadIdx.x == 0) total = sum;
  }
  __syncthreads();

  const float inv = n_splits > 0 ? 1.0f / total : 0.0f;
  for (int d = threadIdx.x; d < head_dim; d += blockDim.x) {
    float sum = 0.0f;
    for (int s = 0; s < n_splits; ++s) sum += part.acc[(slot0 + s) * head_dim + d] * weights[s];
    oh[d] = sum * inv;
  }
}

}  // namespace

void check_paged_attention_shape(const CudaPagedKv& kv, int n_head, const char* where) {
  const std::string w = std::string(where) + ": ";
  if (kv.head_dim <= 0 || kv.head_dim > kPagedDecodeMaxHeadDim)
    throw std::invalid_argument(w + "head_dim " + std::to_string(kv.head_dim) + " is outside 1.." +
                                std::to_string(kPagedDecodeMaxHeadDim));
  if (kv.n_kv_head <= 0 || n_head <= 0 || n_head % kv.n_kv_head != 0 || n_head > 65535)
    throw std::invalid_argument(w + "n_head " + std::to_string(n_head) +
                                " is not a positive multiple of n_kv_head " +
                                std::to_string(kv.n_kv_head) + " (at most 65535)");
  if (kv.block_size <= 0)
    throw std::invalid_argument(w + "block_size " + std::to_string(kv.block_size));
}

int64_t paged_decode_workspace_floats(int64_t n_rows, int n_head, int head_dim, int32_t max_keys) {
  return n_rows * n_head * split_count(max_keys) * (static_cast<int64_t>(head_dim) + 2);
}

void launch_paged_decode_attention(const CudaPagedKv& kv, const CudaPagedRow* rows, int64_t n_rows,
                                   const int32_t* paths, int32_t max_keys, const float* q,
                                   int64_t q_stride, float* out, int64_t out_stride, int n_head,
                                   float scale, float* workspace, int64_t workspace_floats,
                                   cudaStream_t stream) {
  const std::string where = "launch_paged_decode_attention: ";
  check_paged_attention_shape(kv, n_head, "launch_paged_decode_attention");
  if (n_rows < 0 || n_rows > 65535 || max_keys < 0)
    throw std::invalid_argument(where + std::to_string(n_rows) + " rows, max_keys " +
                                std::to_string(max_keys) + " (rows must be at most 65535)");
  if (n_rows == 0 || max_keys == 0) return;
  const int64_t n_splits = split_count(max_keys);
  const int64_t needed = paged_decode_workspace_floats(n_rows, n_head, kv.head_dim, max_keys);
  if (workspace_floats < needed)
    throw std::invalid_argument(where + "workspace of " + std::to_string(workspace_floats) +
                                " floats, " + std::to_string(needed) + " needed");
  const size_t weight_bytes = static_cast<size_t>(n_splits) * sizeof(float);
  if (weight_bytes > 48 * 1024)
    throw std::invalid_argument(where + "max_keys " + std::to_string(max_keys) +
                                " needs more splits than the combine's shared memory holds");

  const int64_t slots = n_rows * n_head * n_splits;
  const Partials part{workspace, workspace + slots, workspace + 2 * slots,
                      static_cast<int>(n_splits)};
  const dim3 split_grid(static_cast<unsigned>(n_splits), static_cast<unsigned>(n_head),
                        static_cast<unsigned>(n_rows));
  paged_decode_split_kernel<<<split_grid, kWarps * kWarp, 0, stream>>>(kv, rows, paths, q, q_stride,
                                                                       n_head, scale, part);
  TOKENFAB_CUDA_CHECK(cudaGetLastError());
  const dim3 combine_grid(static_cast<unsigned>(n_head), static_cast<unsigned>(n_rows));
  paged_decode_combine_kernel<<<combine_grid, kCombineThreads, weight_bytes, stream>>>(
      rows, kv.head_dim, out, out_stride, n_head, part);
  TOKENFAB_CUDA_CHECK(cudaGetLastError());
}

}  // namespace tokenfab::kernels
