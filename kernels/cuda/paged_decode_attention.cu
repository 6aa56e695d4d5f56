#include "kernels/cuda/paged_decode_attention.cuh"

#include <cuda_fp16.h>

#include <cstdint>
#include <stdexcept>
#include <string>

#include "kernels/cuda/bf16_device.cuh"
#include "kernels/cuda/cuda_check.cuh"
#include "kernels/cuda/launch_overlap.cuh"
#include "kernels/cuda/paged_kv_device.cuh"

namespace tokenfab::kernels {

namespace {

constexpr int kWarp = 32;
constexpr int kSplitThreads = 128;
constexpr int kVec = 8;    // fp16 elements in one 16-byte load
constexpr int kLoads = 8;  // 16-byte loads a thread issues before it uses them

int64_t split_count(int32_t max_keys) {
  return (static_cast<int64_t>(max_keys) + kPagedDecodeSplitKeys - 1) / kPagedDecodeSplitKeys;
}

// Workspace views for one call: m and l are (n_rows, n_head, n_splits); acc is
// (n_rows, n_head, n_splits, head_dim); done counts, per (row, head), the splits that have
// written their partial (zero between calls: the block that combines resets it; kept apart from
// the partials, whose layout changes with the call's shape).
struct Partials {
  float* m;
  float* l;
  float* acc;
  int* done;
  int n_splits;
};

__device__ float warp_sum(float v) {
  for (int offset = kWarp / 2; offset > 0; offset /= 2)
    v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

__device__ float warp_max(float v) {
  for (int offset = kWarp / 2; offset > 0; offset /= 2)
    v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, offset));
  return v;
}

// The sum (or the maximum) of v over the block's kSplitThreads threads, returned to every thread.
// red: kSplitThreads / kWarp floats of shared memory, free again when the call returns.
template <bool kMax>
__device__ float block_reduce(float v, float* red) {
  v = kMax ? warp_max(v) : warp_sum(v);
  if (threadIdx.x % kWarp == 0) red[threadIdx.x / kWarp] = v;
  __syncthreads();
  float r = red[0];
  for (int w = 1; w < kSplitThreads / kWarp; ++w) r = kMax ? fmaxf(r, red[w]) : r + red[w];
  __syncthreads();
  return r;
}

__device__ int32_t key_position(const CudaPagedRow& row, const int32_t* paths, int32_t key) {
  return key < row.n_ctx ? key : paths[row.path_begin + key - row.n_ctx];
}

// Adds q[d + i]·x[i] for the 8 fp16 values of one 16-byte load to dot.
__device__ float dot8(const float* q, uint4 raw, float dot) {
  const __half2* h = reinterpret_cast<const __half2*>(&raw);
#pragma unroll
  for (int t = 0; t < kVec / 2; ++t) {
    const float2 f = __half22float2(h[t]);
    dot = fmaf(q[2 * t], f.x, dot);
    dot = fmaf(q[2 * t + 1], f.y, dot);
  }
  return dot;
}

// Grid (x: split, y: query head, z: row); kSplitThreads threads. The split's keys are taken in
// three passes, each with every key independent of the others so that the loads overlap:
//   1. scores: a thread per key, its whole K row (16-byte loads when `vec`), into shared memory;
//   2. the split's maximum m and the probabilities p = exp(score − m) with their sum l;
//   3. Σ p·v: head_dim / 8 threads per key, each 8 elements of a V row, the block's threads
//      spread over the keys, then summed over the key groups through shared memory.
// vec: head_dim is a multiple of 8 and both pools 16-byte aligned (else one element at a time).
// kLimits: the layer's window and soft-cap (CudaPagedKv) apply: a row's keys start at the first
// its window shows, and its splits count from there; false compiles the kernel of the last GPU
// run, which reads neither.
template <bool kLimits>
__global__ void paged_decode_split_kernel(CudaPagedKv kv, const CudaPagedRow* rows,
                                          const int32_t* paths, const float* q, int64_t q_stride,
                                          float* out, uint16_t* out16, int64_t out_stride,
                                          int n_head, float scale, Partials part, bool vec) {
  __shared__ float q_s[kPagedDecodeMaxHeadDim];     // q · scale
  __shared__ float p_s[kPagedDecodeSplitKeys];      // scores, then probabilities
  __shared__ int64_t off_s[kPagedDecodeSplitKeys];  // each key's row in the pool (elements)
  __shared__ float acc_s[kSplitThreads * kVec];     // per key group partial sums
  __shared__ float red_s[kSplitThreads / kWarp];

  // Before the wait (a launch that overlaps the previous kernel): only the step's rows, paths
  // and block tables, which no kernel writes.
  overlap_release();
  const CudaPagedRow row = rows[blockIdx.z];
  const int head = blockIdx.y;
  const int split = blockIdx.x;
  const int32_t n_keys = row.n_ctx + row.path_len;
  // The row stands at position n_keys − 1 of its chain (CudaPagedRow): its window's first key.
  const int32_t first = kLimits && kv.window > 0 ? max(0, n_keys - kv.window) : 0;
  const int32_t key0 = first + split * kPagedDecodeSplitKeys;
  if (key0 >= n_keys) {  // a shorter row than the longest: the combine skips this split
    overlap_wait();
    return;
  }
  const int n = min(n_keys - key0, kPagedDecodeSplitKeys);

  const int tid = threadIdx.x;
  const int head_dim = kv.head_dim;
  const int kv_head = head / (n_head / kv.n_kv_head);
  // Each key's K and V rows are also prefetched into L2 here, so that the loads after the wait
  // find them there (a prefetch reads nothing into the kernel: a row the previous kernel is
  // still writing is read only after the wait).
  for (int i = tid; i < n; i += kSplitThreads) {
    const int32_t pos = key_position(row, paths, key0 + i);
    const int64_t off = cuda_detail::pool_row(row.blocks[pos / kv.block_size], pos % kv.block_size,
                                              kv_head, kv.n_kv_head, kv.block_size, head_dim);
    off_s[i] = off;
    for (int e = 0; e < head_dim; e += 64) {  // 64 fp16 values: one 128-byte line
      asm volatile("prefetch.global.L2 [%0];" ::"l"(kv.k + off + e));
      asm volatile("prefetch.global.L2 [%0];" ::"l"(kv.v + off + e));
    }
    if (head_dim % 64 != 0) {  // rows that start inside a line may end in one more
      asm volatile("prefetch.global.L2 [%0];" ::"l"(kv.k + off + head_dim - 1));
      asm volatile("prefetch.global.L2 [%0];" ::"l"(kv.v + off + head_dim - 1));
    }
  }
  overlap_wait();  // q, and the keys and values the previous kernels stored
  const float* qh = q + row.q_row * q_stride + static_cast<int64_t>(head) * head_dim;  // (head_dim)
  for (int d = tid; d < head_dim; d += kSplitThreads) q_s[d] = qh[d] * scale;
  __syncthreads();

  float local_max = -INFINITY;
  for (int i = tid; i < n; i += kSplitThreads) {
    const uint16_t* kr = kv.k + off_s[i];
    float dot = 0.0f;
    if (vec) {
      for (int d0 = 0; d0 < head_dim; d0 += kVec * kLoads) {
        uint4 raw[kLoads];
#pragma unroll
        for (int u = 0; u < kLoads; ++u)
          if (d0 + u * kVec < head_dim)
            raw[u] = *reinterpret_cast<const uint4*>(kr + d0 + u * kVec);
#pragma unroll
        for (int u = 0; u < kLoads; ++u)
          if (d0 + u * kVec < head_dim) dot = dot8(q_s + d0 + u * kVec, raw[u], dot);
      }
    } else {
      for (int d = 0; d < head_dim; ++d)
        dot = fmaf(q_s[d], __half2float(__ushort_as_half(kr[d])), dot);
    }
    if constexpr (kLimits) {
      if (kv.softcap > 0.0f) dot = kv.softcap * tanhf(dot / kv.softcap);
    }
    p_s[i] = dot;
    local_max = fmaxf(local_max, dot);
  }
  const float m = block_reduce<true>(local_max, red_s);  // finite: the split has a key
  float local_l = 0.0f;
  for (int i = tid; i < n; i += kSplitThreads) {
    const float p = expf(p_s[i] - m);
    p_s[i] = p;
    local_l += p;
  }
  const float l = block_reduce<false>(local_l, red_s);  // its barrier publishes p_s too

  // A row with one split is finished here: out = Σ p·v / l. Otherwise the split's partial goes
  // to the workspace, and the row's last split to finish combines them all.
  const int n_row_splits = (n_keys - first + kPagedDecodeSplitKeys - 1) / kPagedDecodeSplitKeys;
  const int64_t pair = static_cast<int64_t>(blockIdx.z) * n_head + head;
  const int64_t slot = pair * part.n_splits + split;
  const int64_t out_at = row.q_row * out_stride + static_cast<int64_t>(head) * head_dim;
  const float acc_scale = n_row_splits == 1 ? 1.0f / l : 1.0f;
  // Element d of the split's sum: the row's output when it has one split, else its partial.
  const auto put = [&](int d, float v) {
    if (n_row_splits > 1)
      part.acc[slot * head_dim + d] = v;
    else
      cuda_detail::store_f32_or_bf16(out, out16, out_at + d, v);
  };
  if (vec) {
    const int lanes = head_dim / kVec;  // threads per key, 1 … 32
    const int groups = kSplitThreads / lanes;
    const int g = tid / lanes;
    const int c = (tid % lanes) * kVec;
    float a[kVec] = {};
    if (g < groups) {
      for (int i0 = g; i0 < n; i0 += kLoads * groups) {
        uint4 raw[kLoads];
        float p[kLoads];
#pragma unroll
        for (int u = 0; u < kLoads; ++u) {
          const int i = i0 + u * groups;
          raw[u] = i < n ? *reinterpret_cast<const uint4*>(kv.v + off_s[i] + c) : uint4{0, 0, 0, 0};
          p[u] = i < n ? p_s[i] : 0.0f;
        }
#pragma unroll
        for (int u = 0; u < kLoads; ++u) {
          const __half2* h = reinterpret_cast<const __half2*>(&raw[u]);
#pragma unroll
          for (int t = 0; t < kVec / 2; ++t) {
            const float2 f = __half22float2(h[t]);
            a[2 * t] = fmaf(p[u], f.x, a[2 * t]);
            a[2 * t + 1] = fmaf(p[u], f.y, a[2 * t + 1]);
          }
        }
      }
#pragma unroll
      for (int t = 0; t < kVec; ++t) acc_s[g * head_dim + c + t] = a[t];
    }
    __syncthreads();
    for (int d = tid; d < head_dim; d += kSplitThreads) {
      float sum = 0.0f;
      for (int gg = 0; gg < groups; ++gg) sum += acc_s[gg * head_dim + d];
      put(d, sum * acc_scale);
    }
  } else {
    for (int d = tid; d < head_dim; d += kSplitThreads) {
      float sum = 0.0f;
      for (int i = 0; i < n; ++i)
        sum = fmaf(p_s[i], __half2float(__ushort_as_half(kv.v[off_s[i] + d])), sum);
      put(d, sum * acc_scale);
    }
  }
  if (n_row_splits == 1) return;
  if (tid == 0) {
    part.m[slot] = m;
    part.l[slot] = l;
  }

  // Publish the partial, then count it; the block that counts last sees every other partial.
  __shared__ bool last;
  __threadfence();
  __syncthreads();
  if (tid == 0) last = atomicAdd(part.done + pair, 1) == n_row_splits - 1;
  __syncthreads();
  if (!last) return;
  __threadfence();
  // The combine: weight_s = exp(m_s − M) (M the largest m_s); out = Σ_s weight_s·acc_s divided
  // by Σ_s weight_s·l_s. The partials are read through L2 (__ldcg): other SMs wrote them.
  const int64_t slot0 = pair * part.n_splits;
  float big = -INFINITY;
  for (int s = tid; s < n_row_splits; s += kSplitThreads)
    big = fmaxf(big, __ldcg(part.m + slot0 + s));
  big = block_reduce<true>(big, red_s);
  float total = 0.0f;
  for (int s = tid; s < n_row_splits; s += kSplitThreads)
    total += __ldcg(part.l + slot0 + s) * expf(__ldcg(part.m + slot0 + s) - big);
  total = block_reduce<false>(total, red_s);
  const float inv = 1.0f / total;
  for (int d = tid; d < head_dim; d += kSplitThreads) {
    float sum = 0.0f;
    for (int s = 0; s < n_row_splits; ++s)
      sum += __ldcg(part.acc + (slot0 + s) * head_dim + d) * expf(__ldcg(part.m + slot0 + s) - big);
    cuda_detail::store_f32_or_bf16(out, out16, out_at + d, sum * inv);
  }
  if (tid == 0) part.done[pair] = 0;  // ready for the next call (and the next graph replay)
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
  if (kv.window < 0 || !(kv.softcap >= 0.0f))
    throw std::invalid_argument(w + "window " + std::to_string(kv.window) + " and soft-cap " +
                                std::to_string(kv.softcap) + " must not be negative");
}

int64_t paged_decode_workspace_floats(int64_t n_rows, int n_head, int head_dim, int32_t max_keys) {
  return n_rows * n_head * split_count(max_keys) * (static_cast<int64_t>(head_dim) + 2);
}

void launch_paged_decode_attention(const CudaPagedKv& kv, const CudaPagedRow* rows, int64_t n_rows,
                                   const int32_t* paths, int32_t max_keys, const float* q,
                                   int64_t q_stride, float* out, int64_t out_stride, int n_head,
                                   float scale, const PagedDecodeWorkspace& workspace,
                                   cudaStream_t stream, bool overlap, uint16_t* out_bf16) {
  const std::string where = "launch_paged_decode_attention: ";
  check_paged_attention_shape(kv, n_head, "launch_paged_decode_attention");
  if (n_rows < 0 || n_rows > 65535 || max_keys < 0)
    throw std::invalid_argument(where + std::to_string(n_rows) + " rows, max_keys " +
                                std::to_string(max_keys) + " (rows must be at most 65535)");
  if (n_rows == 0 || max_keys == 0) return;
  const int64_t n_splits = split_count(max_keys);
  const int64_t needed = paged_decode_workspace_floats(n_rows, n_head, kv.head_dim, max_keys);
  if (workspace.partial_floats < needed || workspace.partials == nullptr)
    throw std::invalid_argument(where + "workspace of " + std::to_string(workspace.partial_floats) +
                                " floats, " + std::to_string(needed) + " needed");
  if (workspace.count_ints < n_rows * n_head || workspace.counts == nullptr)
    throw std::invalid_argument(where + std::to_string(workspace.count_ints) +
                                " split counters for " + std::to_string(n_rows * n_head) +
                                " (row, head) pairs");
  const int64_t slots = n_rows * n_head * n_splits;
  float* w = workspace.partials;
  const Partials part{w, w + slots, w + 2 * slots, workspace.counts, static_cast<int>(n_splits)};
  const dim3 split_grid(static_cast<unsigned>(n_splits), static_cast<unsigned>(n_head),
                        static_cast<unsigned>(n_rows));
  const bool vec = kv.head_dim % kVec == 0 && reinterpret_cast<uintptr_t>(kv.k) % 16 == 0 &&
                   reinterpret_cast<uintptr_t>(kv.v) % 16 == 0;
  const auto kernel = kv.window > 0 || kv.softcap > 0.0f ? paged_decode_split_kernel<true>
                                                         : paged_decode_split_kernel<false>;
  launch_kernel(kernel, split_grid, dim3(kSplitThreads), stream, overlap, kv, rows, paths, q,
                q_stride, out, out_bf16, out_stride, n_head, scale, part, vec);
}

}  // namespace tokenfab::kernels
