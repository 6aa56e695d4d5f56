#pragma once
// Device code of the decode GEMV (gemv.cu): what one lane loads of one weight row per step, for
// each weight layout (GemvWeights), and how that chunk becomes f32 weights, eight at a time.
//   kBf16: 8 weights, one 16-byte load;
//   kQ4:   one block of 32 weights, one 16-byte load of quants and one 4-byte scale pair;
//   kQ8:   one block of 32 weights, two 16-byte loads of quants and one 4-byte scale pair.
// Block weights are float(q)·d + m, the product and the sum each rounded in f32: the values of
// kernels::dequantize_row (gemv_blocks.h), exactly; the unpacking is gemv_unpack.cuh's.

#include <cuda_fp16.h>

#include <cstdint>

#include "kernels/cuda/gemv.cuh"
#include "kernels/cuda/gemv_unpack.cuh"

namespace tokenfab::kernels::gemv_detail {

template <GemvWeights F>
struct Chunk;

template <>
struct Chunk<GemvWeights::kBf16> {
  static constexpr int kElems = 8;
  uint4 v;

  __device__ void load(const GemvArgs& a, int64_t row, int64_t c) {
    v = __ldg(reinterpret_cast<const uint4*>(a.w + row * a.k) + c);
  }
  // Weights 8g … 8g + 7 of the chunk (g = 0 only).
  __device__ void weights(int, float (&w)[8]) const {
    const uint32_t u[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int t = 0; t < 4; ++t) {
      w[2 * t] = __uint_as_float(u[t] << 16);
      w[2 * t + 1] = __uint_as_float(u[t] & 0xffff0000u);
    }
  }
  __device__ static const void* row_start(const GemvArgs& a, int64_t row) {
    return a.w + row * a.k;
  }
  __device__ static int64_t row_bytes(const GemvArgs& a) {
    return a.k * 2;
  }
};

template <>
struct Chunk<GemvWeights::kQ4> {
  static constexpr int kElems = 32;
  uint4 v;
  uint32_t pair;

  __device__ void load(const GemvArgs& a, int64_t row, int64_t c) {
    v = __ldg(reinterpret_cast<const uint4*>(a.q + row * (a.k / 2)) + c);
    pair = __ldg(a.scales + row * (a.k / 32) + c);
  }
  __device__ void weights(int g, float (&w)[8]) const {
    const uint32_t q[4] = {v.x, v.y, v.z, v.w};
    q4_block_weights(q, pair, g, w);
  }
  __device__ static const void* row_start(const GemvArgs& a, int64_t row) {
    return a.q + row * (a.k / 2);
  }
  __device__ static int64_t row_bytes(const GemvArgs& a) { return a.k / 2; }
};

template <>
struct Chunk<GemvWeights::kQ8> {
  static constexpr int kElems = 32;
  uint4 v0, v1;
  uint32_t pair;

  __device__ void load(const GemvArgs& a, int64_t row, int64_t c) {
    const uint4* p = reinterpret_cast<const uint4*>(a.q + row * a.k) + 2 * c;
    v0 = __ldg(p);
    v1 = __ldg(p + 1);
    pair = __ldg(a.scales + row * (a.k / 32) + c);
  }
  __device__ void weights(int g, float (&w)[8]) const {
    const uint32_t q[8] = {v0.x, v0.y, v0.z, v0.w, v1.x, v1.y, v1.z, v1.w};
    q8_block_weights(q, pair, g, w);
  }
  __device__ static const void* row_start(const GemvArgs& a, int64_t row) {
    return a.q + row * a.k;
  }
  __device__ static int64_t row_bytes(const GemvArgs& a) { return a.k; }
};

}  // namespace tokenfab::kernels::gemv_detail
