#pragma once
// Block formats the CPU kernels compute on. Weight blocks follow the GGUF/ggml layouts exactly so
// weights are used in place from the memory-mapped file; activations use our own Q8A block.
// (Included by the CUDA sources too: C++17 here.)

#include <cstdint>
#include <cstring>

namespace tokenfab::kernels {

// Elements per legacy weight block (Q4_0 … Q5_1, IQ4_NL) and per activation block (Q8A): the
// matmul feeds every quantized weight type activations in blocks of kQK.
inline constexpr int kQK = 32;
// Elements per K-quant super-block (Q2_K … Q6_K, IQ4_XS).
inline constexpr int kQK_K = 256;

// Weight element types the kernels compute on. New types are appended: the values are stable.
enum class WeightType : uint8_t {
  F32,
  F16,
  BF16,
  Q4_0,
  Q4_1,
  Q8_0,
  Q5_0,
  Q5_1,
  Q2_K,
  Q3_K,
  Q4_K,
  Q5_K,
  Q6_K,
  IQ4_NL,
  IQ4_XS,
};

const char* weight_type_name(WeightType type);
// True for every quantized type (all but F32, F16, BF16).
bool is_block_quantized(WeightType type);
// Bytes one row of `n` elements occupies (n a multiple of block_elements(type)).
uint64_t row_bytes(WeightType type, uint64_t n);

// The non-linear values of IQ4_NL and IQ4_XS (ggml's kvalues_iq4nl): a 4-bit index selects one.
inline constexpr int8_t kIQ4Values[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                          1,    13,   25,  38,  53,  69,  89,  113};

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
// Q5_0: value = d * (q - 16), q in 0..31. The low four bits in Q4_0's nibble order; bit j of qh
// (a little-endian uint32) is bit 4 of element j.
struct BlockQ5_0 {
  uint16_t d;  // fp16 scale
  uint8_t qh[4];
  uint8_t qs[kQK / 2];
};
// Q5_1: value = d * q + m, q in 0..31, bits as in Q5_0.
struct BlockQ5_1 {
  uint16_t d;  // fp16 scale
  uint16_t m;  // fp16 minimum
  uint8_t qh[4];
  uint8_t qs[kQK / 2];
};

// The K-quants: super-blocks of 256 elements in sub-blocks of 16 or 32, each sub-block with its
// own small integer scale (and minimum) times the super-block's fp16 d (and dmin). Element e of
// the super-block is written e = 128·h + 32·k + l (h in 0..1, k in 0..3, l in 0..31) where a
// layout packs by those.

// Q2_K: value = d * (scales[s] & 15) * q - dmin * (scales[s] >> 4), q in 0..3, s = e / 16
// (16 sub-blocks of 16). q = (qs[32·h + l] >> 2·k) & 3.
struct BlockQ2_K {
  uint8_t scales[kQK_K / 16];  // low nibble: scale, high nibble: min
  uint8_t qs[kQK_K / 4];
  uint16_t d;     // fp16 super-block scale of the scales
  uint16_t dmin;  // fp16 super-block scale of the mins
};
// Q3_K: value = d * (sc[s] - 32) * (q - 4), q in 0..7, s = e / 16. sc[s] is 6 bits: its low
// four in scales[s % 8] >> 4·(s / 8), its high two in scales[8 + s % 4] >> 2·(s / 4). The low two
// bits of q are (qs[32·h + l] >> 2·k) & 3; bit 2 is bit e / 32 of hmask[e % 32].
struct BlockQ3_K {
  uint8_t hmask[kQK_K / 8];
  uint8_t qs[kQK_K / 4];
  uint8_t scales[12];
  uint16_t d;  // fp16 super-block scale
};
// Q4_K: value = d * sc[s] * q - dmin * m[s], q in 0..15, s = e / 32 (8 sub-blocks of 32).
// q = qs[32·(s / 2) + l] >> 4·(s % 2) & 15. sc and m are 6 bits (ggml's get_scale_min_k4):
// for s < 4, sc = scales[s] & 63, m = scales[s + 4] & 63; for s >= 4, sc = (scales[s + 4] & 15) |
// (scales[s - 4] >> 6) << 4, m = (scales[s + 4] >> 4) | (scales[s] >> 6) << 4.
struct BlockQ4_K {
  uint16_t d;     // fp16 super-block scale of the scales
  uint16_t dmin;  // fp16 super-block scale of the mins
  uint8_t scales[12];
  uint8_t qs[kQK_K / 2];
};
// Q5_K: Q4_K with a fifth bit, q in 0..31: bit 4 of element e is bit e / 32 of qh[e % 32].
struct BlockQ5_K {
  uint16_t d;     // fp16 super-block scale of the scales
  uint16_t dmin;  // fp16 super-block scale of the mins
  uint8_t scales[12];
  uint8_t qh[kQK_K / 8];
  uint8_t qs[kQK_K / 2];
};
// Q6_K: value = d * scales[s] * (q - 32), q in 0..63, s = e / 16. The low four bits of q are
// ql[64·h + l + 32·(k % 2)] >> 4·(k / 2) & 15, the high two (qh[32·h + l] >> 2·k) & 3.
struct BlockQ6_K {
  uint8_t ql[kQK_K / 2];
  uint8_t qh[kQK_K / 4];
  int8_t scales[kQK_K / 16];
  uint16_t d;  // fp16 super-block scale
};
// IQ4_NL: value = d * kIQ4Values[q], q in 0..15, in Q4_0's nibble order.
struct BlockIQ4_NL {
  uint16_t d;  // fp16 scale
  uint8_t qs[kQK / 2];
};
// IQ4_XS: value = d * (ls[s] - 32) * kIQ4Values[q], s = e / 32 (8 sub-blocks of 32). ls[s] is 6
// bits: (scales_l[s / 2] >> 4·(s % 2)) & 15 | ((scales_h >> 2·s) & 3) << 4. Sub-block s's 32
// indices are the 16 bytes qs[16·s …] in Q4_0's nibble order.
struct BlockIQ4_XS {
  uint16_t d;  // fp16 super-block scale
  uint16_t scales_h;
  uint8_t scales_l[kQK_K / 64];
  uint8_t qs[kQK_K / 2];
};
#pragma pack(pop)
static_assert(sizeof(BlockQ4_0) == 18);
static_assert(sizeof(BlockQ4_1) == 20);
static_assert(sizeof(BlockQ8_0) == 34);
static_assert(sizeof(BlockQ5_0) == 22);
static_assert(sizeof(BlockQ5_1) == 24);
static_assert(sizeof(BlockQ2_K) == 84);
static_assert(sizeof(BlockQ3_K) == 110);
static_assert(sizeof(BlockQ4_K) == 144);
static_assert(sizeof(BlockQ5_K) == 176);
static_assert(sizeof(BlockQ6_K) == 210);
static_assert(sizeof(BlockIQ4_NL) == 18);
static_assert(sizeof(BlockIQ4_XS) == 136);

// Elements per block: 1 for the float types, kQK or kQK_K for the quantized ones.
constexpr int block_elements(WeightType type) {
  switch (type) {
    case WeightType::F32:
    case WeightType::F16:
    case WeightType::BF16: return 1;
    case WeightType::Q4_0:
    case WeightType::Q4_1:
    case WeightType::Q8_0:
    case WeightType::Q5_0:
    case WeightType::Q5_1:
    case WeightType::IQ4_NL: return kQK;
    case WeightType::Q2_K:
    case WeightType::Q3_K:
    case WeightType::Q4_K:
    case WeightType::Q5_K:
    case WeightType::Q6_K:
    case WeightType::IQ4_XS: return kQK_K;
  }
  return 0;
}

// Bytes per block (per element for the float types).
constexpr int block_bytes(WeightType type) {
  switch (type) {
    case WeightType::F32: return 4;
    case WeightType::F16:
    case WeightType::BF16: return 2;
    case WeightType::Q4_0: return sizeof(BlockQ4_0);
    case WeightType::Q4_1: return sizeof(BlockQ4_1);
    case WeightType::Q8_0: return sizeof(BlockQ8_0);
    case WeightType::Q5_0: return sizeof(BlockQ5_0);
    case WeightType::Q5_1: return sizeof(BlockQ5_1);
    case WeightType::Q2_K: return sizeof(BlockQ2_K);
    case WeightType::Q3_K: return sizeof(BlockQ3_K);
    case WeightType::Q4_K: return sizeof(BlockQ4_K);
    case WeightType::Q5_K: return sizeof(BlockQ5_K);
    case WeightType::Q6_K: return sizeof(BlockQ6_K);
    case WeightType::IQ4_NL: return sizeof(BlockIQ4_NL);
    case WeightType::IQ4_XS: return sizeof(BlockIQ4_XS);
  }
  return 0;
}

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
