#include "kernels/cuda/embedding.cuh"

#include <stdexcept>
#include <string>

#include "kernels/cpu/quant_types.h"
#include "kernels/cuda/cuda_check.cuh"
#include "kernels/cuda/dequantize_device.cuh"

namespace tokenfab::kernels {

namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxGridY = 65535;  // the row loop strides by gridDim.y beyond this

// Bytes of one row of n elements (kernels::row_bytes, which this library does not link).
int64_t embedding_row_bytes(WeightType type, int64_t n) {
  return n / block_elements(type) * block_bytes(type);
}

// Grid (x: column chunks of kThreads, y: token rows). table: (n_vocab) rows of row_bytes;
// y: (n_tokens, n_embd). scale: 1, or the family's embedding scale (an f32 product, as on the CPU).
template <WeightType kType>
__global__ void embedding_kernel(const uint8_t* table, const int32_t* tokens, float* y,
                                 int64_t n_tokens, int64_t n_embd, int64_t row_bytes, float scale) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n_embd) return;
  for (int64_t t = blockIdx.y; t < n_tokens; t += gridDim.y) {
    const uint8_t* row = table + static_cast<int64_t>(tokens[t]) * row_bytes;
    const float v = cuda_detail::dequantize_element<kType>(row, i);
    y[t * n_embd + i] = scale != 1.0f ? v * scale : v;
  }
}

template <WeightType kType>
void launch_typed(const void* table, const int32_t* tokens, float* y, int64_t n_tokens,
                  int64_t n_embd, cudaStream_t stream, float scale) {
  const dim3 grid(static_cast<unsigned>((n_embd + kThreads - 1) / kThreads),
                  static_cast<unsigned>(n_tokens < kMaxGridY ? n_tokens : kMaxGridY));
  embedding_kernel<kType><<<grid, kThreads, 0, stream>>>(static_cast<const uint8_t*>(table), tokens,
                                                         y, n_tokens, n_embd,
                                                         embedding_row_bytes(kType, n_embd), scale);
}

}  // namespace

void launch_embedding(int type, const void* table, const int32_t* tokens, float* y,
                      int64_t n_tokens, int64_t n_embd, cudaStream_t stream, float scale) {
  if (type < 0 || type >= cuda_detail::kWeightTypeCount)
    throw std::invalid_argument("launch_embedding: unknown weight type " + std::to_string(type));
  const int elements = block_elements(static_cast<WeightType>(type));
  if (n_tokens < 0 || n_embd < 0)
    throw std::invalid_argument("launch_embedding: negative shape (" + std::to_string(n_tokens) +
                                ", " + std::to_string(n_embd) + ")");
  if (n_embd % elements != 0)
    throw std::invalid_argument("launch_embedding: n_embd = " + std::to_string(n_embd) +
                                " is not a multiple of " + std::to_string(elements) +
                                " for block type " + std::to_string(type));
  if (n_tokens == 0 || n_embd == 0) return;

  cuda_detail::with_weight_type(type, [&](auto t) {
    launch_typed<decltype(t)::value>(table, tokens, y, n_tokens, n_embd, stream, scale);
  });
  TOKENFAB_CUDA_CHECK(cudaGetLastError());
}

}  // namespace tokenfab::kernels
