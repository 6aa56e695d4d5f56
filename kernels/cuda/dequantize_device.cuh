#pragma once
// Decoding of the GGUF weight formats for the ops that read weights on the GPU (dequantize,
// embedding). Each follows kernels::dequantize_row (kernels/cpu/quantize.h, quantize_q5.cpp,
// quantize_iq4.cpp, dequantize_k.cpp) with the same IEEE operations in the same order, each
// rounded on its own (nvcc would otherwise contract a product and a sum into one fma), so
// results are bit-identical to the CPU's, signed zeros included (NaN payloads aside: the device's
// fp16 conversion may quiet them differently). Host and device: the GPU runs these in its
// kernels; the host runs the same code in a unit test (tests/gpu/test_dequantize_device.cpp)
// against dequantize_row, so that the layouts and the order of operations are checked on every
// build machine, GPU or not.

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>
#include <utility>

#include "kernels/cpu/quant_types.h"

namespace tokenfab::kernels::cuda_detail {

__host__ __device__ inline float half_bits_to_float(uint16_t bits) {
#ifdef __CUDA_ARCH__
  return __half2float(__ushort_as_half(bits));
#else
  return fp16_to_fp32(bits);
#endif
}

__host__ __device__ inline float bf16_bits_to_float(uint16_t bits) {
#ifdef __CUDA_ARCH__
  return __uint_as_float(static_cast<uint32_t>(bits) << 16);
#else
  return bf16_to_fp32(bits);
#endif
}

// a·b, a + b and a − b, each rounded to f32 on its own: never contracted into an fma with a
// neighbouring operation (the device's _rn intrinsics; a volatile result on any host compiler).
__host__ __device__ inline float mul_rn(float a, float b) {
#ifdef __CUDA_ARCH__
  return __fmul_rn(a, b);
#else
  volatile float r = a * b;
  return r;
#endif
}
__host__ __device__ inline float add_rn(float a, float b) {
#ifdef __CUDA_ARCH__
  return __fadd_rn(a, b);
#else
  volatile float r = a + b;
  return r;
#endif
}
__host__ __device__ inline float sub_rn(float a, float b) {
#ifdef __CUDA_ARCH__
  return __fsub_rn(a, b);
#else
  volatile float r = a - b;
  return r;
#endif
}

// Q4_0: d·(q − 8). Explicit rounding (no contraction) as on the CPU.
__host__ __device__ inline float q4_0_value(float d, int q) {
  return mul_rn(d, static_cast<float>(q - 8));
}

// Q4_1: d·q + m, rounded after the multiply: a contracted fma(d, q, m) would differ from the CPU
// reference, which rounds d·q before adding m.
__host__ __device__ inline float q4_1_value(float d, float m, int q) {
  return add_rn(mul_rn(d, static_cast<float>(q)), m);
}

__host__ __device__ inline float q8_0_value(float d, int q) {
  return mul_rn(d, static_cast<float>(q));
}

// kIQ4Values as two 64-bit constants (entry q in byte q % 8 of the first for q < 8, of the second
// otherwise), so the device looks an entry up in registers, without a table in memory.
constexpr uint64_t iq4_values_packed(int first) {
  uint64_t packed = 0;
  for (int i = 0; i < 8; ++i)
    packed |= static_cast<uint64_t>(static_cast<uint8_t>(kIQ4Values[first + i])) << 8 * i;
  return packed;
}
inline constexpr uint64_t kIQ4ValuesLow = iq4_values_packed(0);
inline constexpr uint64_t kIQ4ValuesHigh = iq4_values_packed(8);

// kIQ4Values[q], q in 0..15.
__host__ __device__ inline int iq4_value(int q) {
  const uint64_t packed = q < 8 ? kIQ4ValuesLow : kIQ4ValuesHigh;
  return static_cast<int8_t>(static_cast<uint8_t>(packed >> 8 * (q & 7)));
}

// Index j (0..31) of a block of 32 in Q4_0's nibble order: j < 16 is byte j's low nibble, j ≥ 16
// byte j − 16's high nibble.
__host__ __device__ inline int nibble_of_32(const uint8_t* qs, int j) {
  return j < kQK / 2 ? (qs[j] & 0x0f) : (qs[j - kQK / 2] >> 4);
}

// Bit j (0..31) of a Q5 block's qh, a little-endian 32-bit word.
__host__ __device__ inline int q5_high_bit(const uint8_t* qh, int j) {
  return (qh[j / 8] >> (j % 8)) & 1;
}

// Q5_0: (q − 16)·d (quantize_q5.cpp), element j of a block.
__host__ __device__ inline float q5_0_element(const BlockQ5_0& b, int j) {
  const int q = nibble_of_32(b.qs, j) | q5_high_bit(b.qh, j) << 4;
  return mul_rn(static_cast<float>(q - 16), half_bits_to_float(b.d));
}

// Q5_1: q·d + m, rounded after the product and after the sum.
__host__ __device__ inline float q5_1_element(const BlockQ5_1& b, int j) {
  const int q = nibble_of_32(b.qs, j) | q5_high_bit(b.qh, j) << 4;
  return add_rn(mul_rn(static_cast<float>(q), half_bits_to_float(b.d)), half_bits_to_float(b.m));
}

// Element e (0..255) of a K-quant super-block below is e = 128·h + 32·k + l (quant_types.h).
// The CPU (dequantize_k.cpp) forms the sub-block's scale d·sc first, then its product with the
// level, then subtracts the min: the products are exact in f32, but the order decides the sign
// of a zero (d·sc·q − dmin·m with both terms 0 is +0 − +0 or −0 − −0, and so on).

// Q2_K: d·(sc & 15)·q − dmin·(sc >> 4), s = e / 16.
__host__ __device__ inline float q2_k_element(const BlockQ2_K& b, int e) {
  const int sc = b.scales[e / 16];
  const float dl = mul_rn(half_bits_to_float(b.d), static_cast<float>(sc & 0x0f));
  const float ml = mul_rn(half_bits_to_float(b.dmin), static_cast<float>(sc >> 4));
  const int q = (b.qs[32 * (e / 128) + e % 32] >> 2 * (e % 128 / 32)) & 3;
  return sub_rn(mul_rn(dl, static_cast<float>(q)), ml);
}

// Q3_K: d·(sc − 32)·(q − 4), the level's bit 2 from hmask (set: no offset).
__host__ __device__ inline float q3_k_element(const BlockQ3_K& b, int e) {
  const int s = e / 16;
  const int sc =
      ((b.scales[s % 8] >> 4 * (s / 8)) & 0x0f) | ((b.scales[8 + s % 4] >> 2 * (s / 4)) & 3) << 4;
  const float dl = mul_rn(half_bits_to_float(b.d), static_cast<float>(sc - 32));
  const int lo = (b.qs[32 * (e / 128) + e % 32] >> 2 * (e % 128 / 32)) & 3;
  const int hi = (b.hmask[e % 32] >> (e / 32)) & 1;
  return mul_rn(dl, static_cast<float>(lo - (hi ? 0 : 4)));
}

// Q4_K / Q5_K: the 6-bit scale and min of sub-block s (0..7), ggml's get_scale_min_k4.
__host__ __device__ inline void scale_min_k4(int s, const uint8_t* q, int& sc, int& m) {
  if (s < 4) {
    sc = q[s] & 63;
    m = q[s + 4] & 63;
  } else {
    sc = (q[s + 4] & 0x0f) | (q[s - 4] >> 6) << 4;
    m = (q[s + 4] >> 4) | (q[s] >> 6) << 4;
  }
}

// Q4_K / Q5_K: d·sc·q − dmin·m of sub-block s = e / 32, q the level (4 or 5 bits).
__host__ __device__ inline float k4_value(uint16_t d, uint16_t dmin, const uint8_t* scales, int s,
                                          int q) {
  int sc, m;
  scale_min_k4(s, scales, sc, m);
  const float d1 = mul_rn(half_bits_to_float(d), static_cast<float>(sc));
  const float m1 = mul_rn(half_bits_to_float(dmin), static_cast<float>(m));
  return sub_rn(mul_rn(d1, static_cast<float>(q)), m1);
}

__host__ __device__ inline float q4_k_element(const BlockQ4_K& b, int e) {
  const int s = e / 32, l = e % 32;
  const int q = (b.qs[32 * (s / 2) + l] >> 4 * (s % 2)) & 0x0f;
  return k4_value(b.d, b.dmin, b.scales, s, q);
}

__host__ __device__ inline float q5_k_element(const BlockQ5_K& b, int e) {
  const int s = e / 32, l = e % 32;
  const int q = ((b.qs[32 * (s / 2) + l] >> 4 * (s % 2)) & 0x0f) | ((b.qh[l] >> s) & 1) << 4;
  return k4_value(b.d, b.dmin, b.scales, s, q);
}

// Q6_K: (d·scales[e / 16])·(q − 32).
__host__ __device__ inline float q6_k_element(const BlockQ6_K& b, int e) {
  const int h = e / 128, k = e % 128 / 32, l = e % 32;
  const int lo = (b.ql[64 * h + 32 * (k % 2) + l] >> 4 * (k / 2)) & 0x0f;
  const int hi = (b.qh[32 * h + l] >> 2 * k) & 3;
  const float ds = mul_rn(half_bits_to_float(b.d), static_cast<float>(b.scales[e / 16]));
  return mul_rn(ds, static_cast<float>((lo | hi << 4) - 32));
}

// IQ4_NL: d·kIQ4Values[q], element j of a block.
__host__ __device__ inline float iq4_nl_element(const BlockIQ4_NL& b, int j) {
  return mul_rn(half_bits_to_float(b.d), static_cast<float>(iq4_value(nibble_of_32(b.qs, j))));
}

// IQ4_XS: (d·(ls − 32))·kIQ4Values[q] of sub-block s = e / 32.
__host__ __device__ inline float iq4_xs_element(const BlockIQ4_XS& b, int e) {
  const int s = e / 32;
  const int ls = ((b.scales_l[s / 2] >> 4 * (s % 2)) & 0x0f) | ((b.scales_h >> 2 * s) & 3) << 4;
  const float dl = mul_rn(half_bits_to_float(b.d), static_cast<float>(ls - 32));
  return mul_rn(dl, static_cast<float>(iq4_value(nibble_of_32(b.qs + 16 * s, e % 32))));
}

// block_elements and block_bytes of a type as constants the device code can read.
template <WeightType kType>
inline constexpr int kBlockElements = block_elements(kType);
template <WeightType kType>
inline constexpr int kBlockBytes = block_bytes(kType);

// Element i of one row in `type`'s layout. row: the row's first byte (row_bytes(type, n) bytes).
// For block types element i is in block i / block_elements(type), at offset i % block_elements.
template <WeightType kType>
__host__ __device__ inline float dequantize_element(const uint8_t* row, int64_t i) {
  constexpr int kElems = kBlockElements<kType>;
  if constexpr (kType == WeightType::F32) {
    return reinterpret_cast<const float*>(row)[i];
  } else if constexpr (kType == WeightType::F16) {
    return half_bits_to_float(reinterpret_cast<const uint16_t*>(row)[i]);
  } else if constexpr (kType == WeightType::BF16) {
    return bf16_bits_to_float(reinterpret_cast<const uint16_t*>(row)[i]);
  } else {
    const uint8_t* block = row + i / kElems * kBlockBytes<kType>;
    const int j = static_cast<int>(i % kElems);
    if constexpr (kType == WeightType::Q4_0) {
      const auto& b = *reinterpret_cast<const BlockQ4_0*>(block);
      return q4_0_value(half_bits_to_float(b.d), nibble_of_32(b.qs, j));
    } else if constexpr (kType == WeightType::Q4_1) {
      const auto& b = *reinterpret_cast<const BlockQ4_1*>(block);
      return q4_1_value(half_bits_to_float(b.d), half_bits_to_float(b.m), nibble_of_32(b.qs, j));
    } else if constexpr (kType == WeightType::Q8_0) {
      const auto& b = *reinterpret_cast<const BlockQ8_0*>(block);
      return q8_0_value(half_bits_to_float(b.d), b.qs[j]);
    } else if constexpr (kType == WeightType::Q5_0) {
      return q5_0_element(*reinterpret_cast<const BlockQ5_0*>(block), j);
    } else if constexpr (kType == WeightType::Q5_1) {
      return q5_1_element(*reinterpret_cast<const BlockQ5_1*>(block), j);
    } else if constexpr (kType == WeightType::Q2_K) {
      return q2_k_element(*reinterpret_cast<const BlockQ2_K*>(block), j);
    } else if constexpr (kType == WeightType::Q3_K) {
      return q3_k_element(*reinterpret_cast<const BlockQ3_K*>(block), j);
    } else if constexpr (kType == WeightType::Q4_K) {
      return q4_k_element(*reinterpret_cast<const BlockQ4_K*>(block), j);
    } else if constexpr (kType == WeightType::Q5_K) {
      return q5_k_element(*reinterpret_cast<const BlockQ5_K*>(block), j);
    } else if constexpr (kType == WeightType::Q6_K) {
      return q6_k_element(*reinterpret_cast<const BlockQ6_K*>(block), j);
    } else if constexpr (kType == WeightType::IQ4_NL) {
      return iq4_nl_element(*reinterpret_cast<const BlockIQ4_NL*>(block), j);
    } else {
      static_assert(kType == WeightType::IQ4_XS, "unhandled weight type");
      return iq4_xs_element(*reinterpret_cast<const BlockIQ4_XS*>(block), j);
    }
  }
}

// The WeightType values are 0 … IQ4_XS, appended in order (quant_types.h).
inline constexpr int kWeightTypeCount = static_cast<int>(WeightType::IQ4_XS) + 1;

template <class F, int... kTypes>
bool with_weight_type_in(int type, F& f, std::integer_sequence<int, kTypes...>) {
  return ((type == kTypes &&
           (f(std::integral_constant<WeightType, static_cast<WeightType>(kTypes)>{}), true)) ||
          ...);
}

// Calls f(std::integral_constant<WeightType, t>{}) for t = `type` (a WeightType as int, from the
// host API) and returns true; returns false, calling nothing, for an int that names no type. f is
// instantiated for every type, so a type appended without a device decoder fails to compile.
template <class F>
bool with_weight_type(int type, F&& f) {
  return with_weight_type_in(type, f, std::make_integer_sequence<int, kWeightTypeCount>{});
}

}  // namespace tokenfab::kernels::cuda_detail
