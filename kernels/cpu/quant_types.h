#pragma once
// Block formats the CPU kernels compute on. Weight blocks follow the GGUF/ggml layouts exactly so
// weights are used in place from the memory-mapped file; activations use our own Q8A block.

#include <cstdint>
#include <cstring>

namespace tokenfab::kernels {

inline constexpr int kQK = 32;  // elements per quantized block, for every block type here

// Weight element types the kernels compute on.
enum class WeightType : uint8_t { F32, F16, BF16, Q4_0, Q4_1, Q8_0 };

const char* weight_type_name(WeightType type);
bool is_block_quantized(WeightType type);
// Bytes one row of `n` elements occupies (n a multiple of kQK for block types).
uint64_t row_bytes(WeightType type, uint64_t n);

#pragma pack(push, 1)
// Q4_0: value = d * (q - 8), q in 0..15. Byte j holds element j (low nibble) and j+16 (high).
struct BlockQ4_0 {
  uint16_t d;  // fp16 scale
  uint8_t qs[kQK / 2];
};
// Q4_1: value = d * q + m. Same nibble order as Q4_0.
struct BlockQ4_1 {
  uint16_t d;  // fp16 scale
  uint16_t m;  // fp16 minimum
  uint8_t qs[kQK / 2];
};
// Q8_0: value = d * q.
struct BlockQ8_0 {
  uint16_t d;  // fp16 scale
  int8_t qs[kQK];
};
#pragma pack(pop)
static_assert(sizeof(BlockQ4_0) == 18);
static_assert(sizeof(BlockQ4_1) == 20);
static_assert(sizeof(BlockQ8_0) == 34);

// Activation block: value = d * q; s = d * sum(q), which turns the Q4_0 offset (-8) and the Q4_1
// minimum into one multiply per block.
struct BlockQ8A {
  float d;
  float s;
  int8_t qs[kQK];
};
static_assert(sizeof(BlockQ8A) == 40);

// IEEE half <-> float, exact for every half value (subnormals, inf, nan included).
inline float fp16_to_fp32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16;
  uint32_t exp = (h >> 10) & 0x1f;
  uint32_t mant = h & 0x3ff;
  uint32_t bits;
  if (exp == 0) {
    if (mant == 0) {
      bits = sign;
    } else {  // subnormal: renormalise
      exp = 127 - 15 + 1;
      while ((mant & 0x400) == 0) {
        mant <<= 1;
        --exp;
      }
      mant &= 0x3ff;
      bits = sign | (exp << 23) | (mant << 13);
    }
  } else if (exp == 0x1f) {
    bits = sign | 0x7f800000u | (mant << 13);
  } else {
    bits = sign | ((exp + 127 - 15) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

// Round to nearest even.
inline uint16_t fp32_to_fp16(float f) {
  uint32_t x;
  std::memcpy(&x, &f, sizeof x);
  const uint32_t sign = (x >> 16) & 0x8000;
  const uint32_t abs = x & 0x7fffffff;
  if (abs >= 0x7f800000) return static_cast<uint16_t>(sign | 0x7c00 | (abs > 0x7f800000 ? 0x200 : 0));
  if (abs >= 0x477ff000) return static_cast<uint16_t>(sign | 0x7c00);  // overflow to inf
  if (abs < 0x38800000) {  // subnormal or zero in half
    if (abs < 0x33000000) return static_cast<uint16_t>(sign);
    // The half subnormal is mant · 2^(e − 150) / 2^-24 = mant >> (126 − e), e = biased exponent.
    const uint32_t shift = 126 - (abs >> 23);
    const uint32_t mant = (abs & 0x7fffff) | 0x800000;
    uint32_t half = mant >> shift;
    const uint32_t rem = mant & ((1u << shift) - 1);
    const uint32_t halfway = 1u << (shift - 1);
    if (rem > halfway || (rem == halfway && (half & 1))) ++half;
    return static_cast<uint16_t>(sign | half);
  }
  uint32_t h = ((abs - 0x38000000) >> 13);
  const uint32_t rem = abs & 0x1fff;
  if (rem > 0x1000 || (rem == 0x1000 && (h & 1))) ++h;
  return static_cast<uint16_t>(sign | h);
}

inline float bf16_to_fp32(uint16_t b) {
  const uint32_t bits = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

inline uint16_t fp32_to_bf16(float f) {
  uint32_t x;
  std::memcpy(&x, &f, sizeof x);
  if ((x & 0x7fffffff) > 0x7f800000) return static_cast<uint16_t>((x >> 16) | 0x40);  // quiet nan
  x += 0x7fff + ((x >> 16) & 1);
  return static_cast<uint16_t>(x >> 16);
}

}  // namespace tokenfab::kernels
