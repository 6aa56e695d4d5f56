#include "kernels/cuda/rms_norm.cuh"

#include "kernels/cuda/bf16_device.cuh"
#include "kernels/cuda/cuda_check.cuh"
#include "kernels/cuda/launch_overlap.cuh"

namespace tokenfab::kernels {

namespace {

constexpr int kWarp = 32;

__device__ float warp_sum(float v) {
  for (int offset = kWarp / 2; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

__device__ inline void store(float* y, int64_t i, float v) { y[i] = v; }
__device__ inline void store(uint16_t* y, int64_t i, float v) {
  y[i] = cuda_detail::to_bf16_bits(v);
}

// One block per row; blockDim.x is a multiple of 32 and at most 1024. Out: float, or uint16_t for
// bf16 bits (the f32 result, rounded).
template <typename Out>
__global__ void rms_norm_kernel(const float* x, const float* w, Out* y, int64_t n, float eps) {
  __shared__ float warp_sums[kWarp];  // (n_warps) partial sums of squares
  overlap_release();
  overlap_wait();  // everything below reads what earlier kernels wrote
  const int64_t row = blockIdx.x;
  const float* xr = x + row * n;  // (n)
  Out* yr = y + row * n;          // (n)

  float sum = 0.0f;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) sum = fmaf(xr[i], xr[i], sum);
  sum = warp_sum(sum);
  const int lane = threadIdx.x % kWarp;
  const int warp = threadIdx.x / kWarp;
  if (lane == 0) warp_sums[warp] = sum;
  __syncthreads();
  if (warp == 0) {
    const int n_warps = blockDim.x / kWarp;
    sum = warp_sum(lane < n_warps ? warp_sums[lane] : 0.0f);
    if (lane == 0) warp_sums[0] = sum;
  }
  __syncthreads();

  // Same rounding steps as the CPU reference: IEEE sqrt and division (no rsqrtf), then x·scale·w.
  const float scale = 1.0f / sqrtf(warp_sums[0] / static_cast<float>(n) + eps);
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) store(yr, i, xr[i] * scale * w[i]);
}

template <typename Out>
void launch(const float* x, const float* w, Out* y, int64_t rows, int64_t n, float eps,
            cudaStream_t stream, bool overlap) {
  if (rows <= 0 || n <= 0) return;
  // One warp is enough for short rows; longer rows get 256 threads, each striding through the row.
  const int threads = n < 256 ? kWarp : 256;
  launch_kernel(rms_norm_kernel<Out>, dim3(static_cast<unsigned>(rows)), dim3(threads), stream,
                overlap, x, w, y, n, eps);
}

}  // namespace

void launch_rms_norm(const float* x, const float* w, float* y, int64_t rows, int64_t n, float eps,
                     cudaStream_t stream, bool overlap) {
  launch(x, w, y, rows, n, eps, stream, overlap);
}

void launch_rms_norm_bf16(const float* x, const float* w, uint16_t* y, int64_t rows, int64_t n,
                          float eps, cudaStream_t stream, bool overlap) {
  launch(x, w, y, rows, n, eps, stream, overlap);
}

}  // namespace tokenfab::kernels
