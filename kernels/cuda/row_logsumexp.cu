#include "kernels/cuda/row_logsumexp.cuh"

#include <cub/block/block_reduce.cuh>

#include <stdexcept>
#include <string>

#include "kernels/cuda/cuda_check.cuh"

namespace tokenfab::kernels {

namespace {

constexpr int kThreads = 256;
using BlockReduceF = cub::BlockReduce<float, kThreads>;

// One block per row.
__global__ void row_logsumexp_kernel(const float* x, int64_t n, float* out) {
  __shared__ BlockReduceF::TempStorage storage;
  __shared__ float shared_max;
  const float* row = x + static_cast<int64_t>(blockIdx.x) * n;  // (n)
  float local = -INFINITY;
  for (int64_t i = threadIdx.x; i < n; i += kThreads)
    if (!isnan(row[i])) local = fmaxf(local, row[i]);
  const float block_max =
      BlockReduceF(storage).Reduce(local, [](float a, float b) { return fmaxf(a, b); });
  if (threadIdx.x == 0) shared_max = block_max;
  __syncthreads();
  const float max = shared_max;
  if (isinf(max)) {  // -inf: nothing to sum; +inf: the sum is +inf too
    if (threadIdx.x == 0) out[blockIdx.x] = max;
    return;
  }
  float sum = 0.0f;
  for (int64_t i = threadIdx.x; i < n; i += kThreads)
    if (!isnan(row[i])) sum += expf(row[i] - max);
  const float block_sum = BlockReduceF(storage).Sum(sum);  // after the barrier above
  if (threadIdx.x == 0) out[blockIdx.x] = max + logf(block_sum);
}

}  // namespace

void launch_row_logsumexp(const float* x, int64_t rows, int64_t n, float* out,
                          cudaStream_t stream) {
  if (rows < 0 || rows > 0x7fffffff || n <= 0)
    throw std::invalid_argument("launch_row_logsumexp: bad shape (" + std::to_string(rows) + ", " +
                                std::to_string(n) + ")");
  if (rows == 0) return;
  row_logsumexp_kernel<<<static_cast<unsigned>(rows), kThreads, 0, stream>>>(x, n, out);
  TOKENFAB_CUDA_CHECK(cudaGetLastError());
}

}  // namespace tokenfab::kernels
