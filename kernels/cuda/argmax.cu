#include "kernels/cuda/argmax.cuh"

#include <stdexcept>
#include <string>

#include "kernels/cuda/cuda_check.cuh"

namespace tokenfab::kernels {

namespace {

constexpr int kThreads = 1024;
constexpr int kBatch = 8;  // loads a thread issues before it compares them
constexpr int kWarp = 32;

// A candidate (value, index); index −1 means none yet (every value seen so far was NaN).
struct Best {
  float value;
  int32_t index;
};

// Whether b should replace a: a larger value, or an equal one at a lower index. NaNs never enter
// a candidate, so comparisons are between numbers (−0 and +0 compare equal, as on the CPU).
__device__ bool better(const Best& b, const Best& a) {
  if (b.index < 0) return false;
  if (a.index < 0) return true;
  return b.value > a.value || (b.value == a.value && b.index < a.index);
}

__device__ Best warp_best(Best v) {
  for (int offset = kWarp / 2; offset > 0; offset /= 2) {
    const Best other{__shfl_xor_sync(0xffffffffu, v.value, offset),
                     __shfl_xor_sync(0xffffffffu, v.index, offset)};
    if (better(other, v)) v = other;
  }
  return v;
}

// One block per row. x: (rows, n); out: (rows).
__global__ void argmax_rows_kernel(const float* x, int32_t* out, int64_t n) {
  __shared__ Best warp_results[kThreads / kWarp];
  const float* row = x + static_cast<int64_t>(blockIdx.x) * n;  // (n)
  // Each thread visits its indices in increasing order, so a strict > keeps its lowest among ties.
  Best best{0.0f, -1};
  for (int64_t base = threadIdx.x; base < n; base += kBatch * blockDim.x) {
    float v[kBatch];
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      const int64_t i = base + static_cast<int64_t>(u) * blockDim.x;
      v[u] = i < n ? row[i] : NAN;
    }
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      if (isnan(v[u])) continue;
      if (best.index < 0 || v[u] > best.value)
        best = {v[u], static_cast<int32_t>(base + static_cast<int64_t>(u) * blockDim.x)};
    }
  }
  best = warp_best(best);
  const int lane = threadIdx.x % kWarp;
  const int warp = threadIdx.x / kWarp;
  if (lane == 0) warp_results[warp] = best;
  __syncthreads();
  if (warp == 0) {
    best = lane < static_cast<int>(blockDim.x / kWarp) ? warp_results[lane] : Best{0.0f, -1};
    best = warp_best(best);
    if (lane == 0) out[blockIdx.x] = best.index < 0 ? 0 : best.index;
  }
}

}  // namespace

void launch_argmax_rows(const float* x, int32_t* out, int64_t rows, int64_t n,
                        cudaStream_t stream) {
  if (rows < 0 || n < 0 || n > 0x7fffffff || rows > 0x7fffffff)
    throw std::invalid_argument("launch_argmax_rows: bad shape (" + std::to_string(rows) + ", " +
                                std::to_string(n) + ")");
  if (rows == 0) return;
  argmax_rows_kernel<<<static_cast<unsigned>(rows), kThreads, 0, stream>>>(x, out, n);
  TOKENFAB_CUDA_CHECK(cudaGetLastError());
}

}  // namespace tokenfab::kernels
