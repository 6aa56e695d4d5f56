#include "kernels/cuda/draft_residual.cuh"

#include <stdexcept>
#include <string>

#include "kernels/cuda/cuda_check.cuh"

namespace tokenfab::kernels {

namespace {

constexpr int kWarp = 32;
constexpr int kWarpsPerBlock = 8;

// Block (blockIdx.x, blockIdx.y = j): warp w computes output o = blockIdx.x · 8 + w of row j.
__global__ void draft_residual_kernel(const float* const* w, const float* const* b, const float* h,
                                      const int32_t* src, const float* e, float* z, int64_t d) {
  const int64_t j = blockIdx.y;
  const int lane = static_cast<int>(threadIdx.x) % kWarp;
  const int64_t o = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / kWarp;
  if (o >= d) return;
  const float* hr = h + static_cast<int64_t>(src[j]) * d;  // (d)
  const int64_t d_in = e == nullptr ? d : 2 * d;
  const float* wo = w[j] + o * d_in;  // row o of W_j: (d_in)
  float dot = 0.0f;
  for (int64_t i = lane; i < d; i += kWarp) dot = fmaf(wo[i], hr[i], dot);
  if (e != nullptr) {
    const float* er = e + j * d;  // (d)
    for (int64_t i = lane; i < d; i += kWarp) dot = fmaf(wo[d + i], er[i], dot);
  }
  for (int offset = kWarp / 2; offset > 0; offset /= 2)
    dot += __shfl_xor_sync(0xffffffffu, dot, offset);
  if (lane == 0) {
    const float u = dot + b[j][o];
    z[j * d + o] = hr[o] + u / (1.0f + expf(-u));
  }
}

}  // namespace

void launch_draft_residual(const float* const* w, const float* const* b, const float* h,
                           const int32_t* src, const float* e, float* z, int64_t rows, int64_t d,
                           cudaStream_t stream) {
  if (rows < 0 || rows > 65535 || d <= 0 || d > 0x3fffffff)
    throw std::invalid_argument("launch_draft_residual: bad shape (rows " + std::to_string(rows) +
                                ", d " + std::to_string(d) + ")");
  if (rows == 0) return;
  const dim3 grid(static_cast<unsigned>((d + kWarpsPerBlock - 1) / kWarpsPerBlock),
                  static_cast<unsigned>(rows));
  draft_residual_kernel<<<grid, kWarpsPerBlock * kWarp, 0, stream>>>(w, b, h, src, e, z, d);
  TOKENFAB_CUDA_CHECK(cudaGetLastError());
}

}  // namespace tokenfab::kernels
