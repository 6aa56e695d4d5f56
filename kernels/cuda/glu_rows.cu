#include "kernels/cuda/glu_rows.cuh"

#include <algorithm>

#include "kernels/cuda/cuda_check.cuh"
#include "kernels/cuda/launch_overlap.cuh"

namespace tokenfab::kernels {

namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxBlocks = 65536;  // the grid-stride loop covers any size beyond this

// gu: (rows, 2·n), each row [gate | up]; out: (rows, n).
template <GluActivation kAct>
__global__ void glu_rows_kernel(const float* gu, int64_t rows, int64_t n, float* out) {
  overlap_release();
  overlap_wait();  // everything below reads what earlier kernels wrote
  constexpr float kSqrt2OverPi = 0.7978845608028654f;
  const int64_t total = rows * n;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; e < total;
       e += stride) {
    const int64_t r = e / n, i = e % n;
    const float g = gu[r * 2 * n + i];
    const float u = gu[r * 2 * n + n + i];
    if constexpr (kAct == GluActivation::kGeluTanh) {
      out[e] = 0.5f * g * (1.0f + tanhf(kSqrt2OverPi * (g + 0.044715f * g * g * g))) * u;
    } else {
      out[e] = g / (1.0f + expf(-g)) * u;
    }
  }
}

}  // namespace

void launch_glu_rows(const float* gate_up, int64_t rows, int64_t n, GluActivation activation,
                     float* out, cudaStream_t stream, bool overlap) {
  if (rows <= 0 || n <= 0) return;
  const int64_t blocks = std::min((rows * n + kThreads - 1) / kThreads, kMaxBlocks);
  const auto kernel = activation == GluActivation::kGeluTanh
                          ? glu_rows_kernel<GluActivation::kGeluTanh>
                          : glu_rows_kernel<GluActivation::kSilu>;
  launch_kernel(kernel, dim3(static_cast<unsigned>(blocks)), dim3(kThreads), stream, overlap,
                gate_up, rows, n, out);
}

}  // namespace tokenfab::kernels
