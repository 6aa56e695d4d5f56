#include "kernels/cuda/candidates.cuh"

#include <cub/block/block_reduce.cuh>
#include <cub/block/block_scan.cuh>

#include <stdexcept>
#include <string>

#include "kernels/cuda/cuda_check.cuh"

namespace tokenfab::kernels {

namespace {

constexpr int kThreads = 1024;
constexpr int kRadixBits = 8;
constexpr int kRadixBins = 1 << kRadixBits;

using BlockReduceF = cub::BlockReduce<float, kThreads>;
using BlockReduceI = cub::BlockReduce<int32_t, kThreads>;
using BlockScan = cub::BlockScan<int32_t, kThreads>;

// NaN reads as -inf, as in the reference and the sampler.
__device__ __forceinline__ float value_at(const float* row, int64_t i) {
  const float v = row[i];
  return isnan(v) ? -INFINITY : v;
}

// An unsigned key that orders like the float (larger value, larger key); -0 and +0 share one.
__device__ __forceinline__ uint32_t order_key(float v) {
  if (v == 0.0f) v = 0.0f;
  const uint32_t u = __float_as_uint(v);
  return (u & 0x80000000u) != 0 ? ~u : (u | 0x80000000u);
}

// z = (v - max) · inv_temperature, rounded step by step as the host computes it (no fused ops).
__device__ __forceinline__ bool survives(float v, float row_max, const CandidateFilter& f) {
  return __fmul_rn(__fsub_rn(v, row_max), f.inv_temperature) >= f.min_z;
}

union Scratch {
  BlockReduceF::TempStorage reduce_f;
  BlockReduceI::TempStorage reduce_i;
  BlockScan::TempStorage scan;
};

// One block per row. Each thread owns one contiguous range of ids for the passes that must keep
// id order (compaction), and strides over the row for the others.
__global__ void __launch_bounds__(kThreads)
    filter_candidates_kernel(const float* x, int64_t n, const CandidateFilter* filters,
                             const int32_t* argmax, int32_t width, float* out_logits,
                             int32_t* out_ids, int32_t* counts) {
  __shared__ Scratch scratch;
  __shared__ float shared_max;
  __shared__ int32_t shared_count;
  __shared__ uint32_t histogram[kRadixBins];
  __shared__ uint32_t shared_digit;
  __shared__ int32_t shared_rank;
  __shared__ unsigned long long sorted[kMaxCandidates];  // (key << 32) | ~id, best first

  const int64_t r = blockIdx.x;
  const float* row = x + r * n;  // (n)
  float* row_logits = out_logits + r * width;
  int32_t* row_ids = out_ids + r * width;
  const CandidateFilter f = filters[r];
  const int tid = static_cast<int>(threadIdx.x);

  if (f.greedy != 0) {
    if (tid == 0) {
      const int32_t id = argmax[r];
      row_logits[0] = row[id];
      row_ids[0] = id;
      counts[r] = 1;
    }
    return;
  }

  float local_max = -INFINITY;
  for (int64_t i = tid; i < n; i += kThreads) local_max = fmaxf(local_max, value_at(row, i));
  const float block_max = BlockReduceF(scratch.reduce_f).Reduce(local_max, [](float a, float b) {
    return fmaxf(a, b);
  });
  if (tid == 0) shared_max = block_max;
  __syncthreads();
  const float row_max = shared_max;
  if (isinf(row_max)) {  // +inf, or every value -inf / NaN: the host samples the whole row
    if (tid == 0) counts[r] = -1;
    return;
  }

  // Survivors of min-p: a best-first prefix of the row (z grows with the value).
  int32_t local_survivors = 0;
  for (int64_t i = tid; i < n; i += kThreads)
    local_survivors += survives(value_at(row, i), row_max, f);
  const int32_t m = BlockReduceI(scratch.reduce_i).Sum(local_survivors);
  if (tid == 0) shared_count = m;
  __syncthreads();
  const bool ranked = f.top_k > 0 && f.top_k < n;
  const int32_t keep = ranked ? min(f.top_k, shared_count) : shared_count;
  if (keep == 0 || keep > width) {
    if (tid == 0) counts[r] = -1;
    return;
  }

  // This thread's contiguous id range [begin, end).
  const int64_t per_thread = (n + kThreads - 1) / kThreads;
  const int64_t begin = min(n, tid * per_thread);
  const int64_t end = min(n, begin + per_thread);

  if (!ranked) {
    // Every survivor, in id order: each thread's range at its exclusive prefix of the counts.
    int32_t mine = 0;
    for (int64_t i = begin; i < end; ++i) mine += survives(value_at(row, i), row_max, f);
    int32_t at = 0;
    BlockScan(scratch.scan).ExclusiveSum(mine, at);
    for (int64_t i = begin; i < end; ++i) {
      const float v = value_at(row, i);
      if (!survives(v, row_max, f)) continue;
      row_logits[at] = v;
      row_ids[at] = static_cast<int32_t>(i);
      ++at;
    }
    if (tid == 0) counts[r] = keep;
    return;
  }

  // The keep-th largest key, by radix selection from the top byte down: after the last pass
  // `threshold` is that key and `rank` how many of the tokens with exactly that key (the lowest
  // ids first) are kept; every token with a larger key is kept.
  uint32_t threshold = 0;
  uint32_t mask = 0;
  int32_t rank = keep;
  for (int shift = 32 - kRadixBits; shift >= 0; shift -= kRadixBits) {
    for (int b = tid; b < kRadixBins; b += kThreads) histogram[b] = 0;
    __syncthreads();
    // Most keys share the top byte (sign and exponent), so the lanes of a warp that fall in one
    // bin add their count once, through their lowest lane (every lane runs every round, as
    // __match_any_sync needs).
    for (int64_t base = 0; base < n; base += kThreads) {
      const int64_t i = base + tid;
      constexpr uint32_t kNoBin = kRadixBins;
      uint32_t bin = kNoBin;
      if (i < n) {
        const uint32_t key = order_key(value_at(row, i));
        if ((key & mask) == threshold) bin = (key >> shift) & (kRadixBins - 1);
      }
      const uint32_t peers = __match_any_sync(0xffffffffu, bin);
      if (bin != kNoBin && tid % 32 == __ffs(static_cast<int>(peers)) - 1)
        atomicAdd(&histogram[bin], static_cast<uint32_t>(__popc(peers)));
    }
    __syncthreads();
    if (tid == 0) {
      int32_t left = rank;
      int digit = kRadixBins - 1;
      for (; digit > 0; --digit) {
        const auto in_bin = static_cast<int32_t>(histogram[digit]);
        if (left <= in_bin) break;
        left -= in_bin;
      }
      shared_digit = static_cast<uint32_t>(digit);
      shared_rank = left;
    }
    __syncthreads();
    threshold |= shared_digit << shift;
    mask |= static_cast<uint32_t>(kRadixBins - 1) << shift;
    rank = shared_rank;
    __syncthreads();  // shared_digit / shared_rank are rewritten by the next pass
  }

  // Gather the kept tokens (every larger key, and the first `rank` ties by id) into `sorted`,
  // each thread's at its exclusive prefix of the kept counts.
  int32_t greater = 0;
  int32_t ties = 0;
  for (int64_t i = begin; i < end; ++i) {
    const uint32_t key = order_key(value_at(row, i));
    greater += key > threshold;
    ties += key == threshold;
  }
  int32_t ties_before = 0;
  BlockScan(scratch.scan).ExclusiveSum(ties, ties_before);
  __syncthreads();  // the scan's storage is used again
  const int32_t my_ties = max(0, min(ties, rank - ties_before));
  int32_t at = 0;
  BlockScan(scratch.scan).ExclusiveSum(greater + my_ties, at);
  int32_t tie = 0;
  for (int64_t i = begin; i < end; ++i) {
    const uint32_t key = order_key(value_at(row, i));
    if (key < threshold || (key == threshold && tie++ >= my_ties)) continue;
    sorted[at++] = (static_cast<unsigned long long>(key) << 32) | ~static_cast<uint32_t>(i);
  }
  // Pad to a power of two with 0, below every real entry (the key of -inf is 0x007fffff).
  int32_t size = 1;
  while (size < keep) size *= 2;
  for (int i = keep + tid; i < size; i += kThreads) sorted[i] = 0;
  __syncthreads();

  // Bitonic sort, descending: larger key first, then (larger ~id) lower id first.
  for (int32_t k = 2; k <= size; k *= 2) {
    for (int32_t j = k / 2; j > 0; j /= 2) {
      for (int32_t i = tid; i < size; i += kThreads) {
        const int32_t partner = i ^ j;
        if (partner <= i) continue;
        const unsigned long long a = sorted[i];
        const unsigned long long b = sorted[partner];
        const bool descending = (i & k) == 0;
        if (descending ? a < b : a > b) {
          sorted[i] = b;
          sorted[partner] = a;
        }
      }
      __syncthreads();
    }
  }
  for (int32_t i = tid; i < keep; i += kThreads) {
    const auto id = static_cast<int32_t>(~static_cast<uint32_t>(sorted[i] & 0xffffffffu));
    row_logits[i] = value_at(row, id);
    row_ids[i] = id;
  }
  if (tid == 0) counts[r] = keep;
}

}  // namespace

void launch_filter_candidates(const float* x, int64_t rows, int64_t n,
                              const CandidateFilter* filters, const int32_t* argmax, int32_t width,
                              float* out_logits, int32_t* out_ids, int32_t* counts,
                              cudaStream_t stream) {
  if (rows < 0 || rows > 0x7fffffff || n <= 0 || n > 0x7fffffff || width < 1 ||
      width > kMaxCandidates)
    throw std::invalid_argument("launch_filter_candidates: bad shape (rows " +
                                std::to_string(rows) + ", n " + std::to_string(n) + ", width " +
                                std::to_string(width) + ")");
  if (rows == 0) return;
  filter_candidates_kernel<<<static_cast<unsigned>(rows), kThreads, 0, stream>>>(
      x, n, filters, argmax, width, out_logits, out_ids, counts);
  TOKENFAB_CUDA_CHECK(cudaGetLastError());
}

}  // namespace tokenfab::kernels
