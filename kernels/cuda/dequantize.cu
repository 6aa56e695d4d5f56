#include "kernels/cuda/dequantize.cuh"

#include <algorithm>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "kernels/cpu/quant_types.h"
#include "kernels/cuda/cuda_check.cuh"
#include "kernels/cuda/dequantize_device.cuh"

namespace tokenfab::kernels {

namespace {

using cuda_detail::bf16_bits_to_float;
using cuda_detail::half_bits_to_float;

constexpr int kThreads = 256;
constexpr int64_t kMaxBlocks = 65536;  // grid-stride loops cover any size beyond this

// Rows are packed back to back and n is a multiple of block_elements(type), so `rows` rows of n
// elements are one run of rows·n elements (rows·n/block_elements blocks): every kernel sees a
// flat array.

// One thread per element. src: (total) f32 / f16 / bf16 bits.
template <WeightType kType>
__global__ void dequantize_float_kernel(const void* src, float* y, int64_t total) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += stride) {
    if constexpr (kType == WeightType::F32) {
      y[i] = static_cast<const float*>(src)[i];
    } else if constexpr (kType == WeightType::F16) {
      y[i] = half_bits_to_float(static_cast<const uint16_t*>(src)[i]);
    } else {
      y[i] = bf16_bits_to_float(static_cast<const uint16_t*>(src)[i]);
    }
  }
}

// One thread per quant byte: byte j of a block gives element j (low nibble) and j+16 (high).
// blocks: (total / kQK) BlockQ4_0 or BlockQ4_1; y: (total).
template <WeightType kType>
__global__ void dequantize_q4_kernel(const void* src, float* y, int64_t total) {
  using Block = std::conditional_t<kType == WeightType::Q4_0, BlockQ4_0, BlockQ4_1>;
  const auto* blocks = static_cast<const Block*>(src);
  const int64_t pairs = total / 2;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t p = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; p < pairs;
       p += stride) {
    const int64_t b = p / (kQK / 2);
    const int j = static_cast<int>(p % (kQK / 2));
    const Block& block = blocks[b];
    const float d = half_bits_to_float(block.d);
    const int lo = block.qs[j] & 0x0f;
    const int hi = block.qs[j] >> 4;
    float* out = y + b * kQK;  // (kQK)
    if constexpr (kType == WeightType::Q4_0) {
      out[j] = cuda_detail::q4_0_value(d, lo);
      out[j + kQK / 2] = cuda_detail::q4_0_value(d, hi);
    } else {
      const float m = half_bits_to_float(block.m);
      out[j] = cuda_detail::q4_1_value(d, m, lo);
      out[j + kQK / 2] = cuda_detail::q4_1_value(d, m, hi);
    }
  }
}

// One thread per element. blocks: (total / kQK) BlockQ8_0; y: (total).
__global__ void dequantize_q8_0_kernel(const BlockQ8_0* blocks, float* y, int64_t total) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += stride) {
    const BlockQ8_0& block = blocks[i / kQK];
    y[i] = cuda_detail::q8_0_value(half_bits_to_float(block.d), block.qs[i % kQK]);
  }
}

// One thread per element, for the types without a kernel of their own above (Q5_0 … IQ4_XS).
// src: (total / block_elements) blocks; y: (total).
template <WeightType kType>
__global__ void dequantize_blocks_kernel(const uint8_t* src, float* y, int64_t total) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += stride)
    y[i] = cuda_detail::dequantize_element<kType>(src, i);
}

unsigned grid_for(int64_t work_items) {
  return static_cast<unsigned>(std::min((work_items + kThreads - 1) / kThreads, kMaxBlocks));
}

}  // namespace

void launch_dequantize_rows(int type, const void* src, float* y, int64_t rows, int64_t n,
                            cudaStream_t stream) {
  if (type < 0 || type >= cuda_detail::kWeightTypeCount)
    throw std::invalid_argument("launch_dequantize_rows: unknown weight type " +
                                std::to_string(type));
  const int elements = block_elements(static_cast<WeightType>(type));
  if (rows < 0 || n < 0)
    throw std::invalid_argument("launch_dequantize_rows: negative shape (" + std::to_string(rows) +
                                ", " + std::to_string(n) + ")");
  if (n % elements != 0)
    throw std::invalid_argument("launch_dequantize_rows: n = " + std::to_string(n) +
                                " is not a multiple of " + std::to_string(elements) +
                                " for block type " + std::to_string(type));
  const int64_t total = rows * n;
  if (total == 0) return;

  cuda_detail::with_weight_type(type, [&](auto t) {
    constexpr WeightType kType = decltype(t)::value;
    if constexpr (kType == WeightType::F32 || kType == WeightType::F16 ||
                  kType == WeightType::BF16) {
      dequantize_float_kernel<kType><<<grid_for(total), kThreads, 0, stream>>>(src, y, total);
    } else if constexpr (kType == WeightType::Q4_0 || kType == WeightType::Q4_1) {
      dequantize_q4_kernel<kType><<<grid_for(total / 2), kThreads, 0, stream>>>(src, y, total);
    } else if constexpr (kType == WeightType::Q8_0) {
      dequantize_q8_0_kernel<<<grid_for(total), kThreads, 0, stream>>>(
          static_cast<const BlockQ8_0*>(src), y, total);
    } else {
      dequantize_blocks_kernel<kType>
          <<<grid_for(total), kThreads, 0, stream>>>(static_cast<const uint8_t*>(src), y, total);
    }
  });
  TOKENFAB_CUDA_CHECK(cudaGetLastError());
}

}  // namespace tokenfab::kernels
