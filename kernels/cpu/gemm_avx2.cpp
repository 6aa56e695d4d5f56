// AVX2 tile kernels on the GGUF layout. Quantized weights meet Q8A activations in 8-bit integer
// products (maddubs: u8 × s8 → s16 pairs, madd: → s32), one float FMA per block and tile cell.
// A tile is R weight rows × C activation rows held in registers; each weight block is unpacked
// once per tile and used C times, each activation block is loaded once and used R times.
// The 32-element types are here; the super-block types in gemm_kquants_avx2.cpp.
// int16 bounds of the one maddubs per block and cell (a pair of products, |a.q| ≤ 127): Q4
// 2·15·127, Q5 2·31·127, Q8_0 and IQ4_NL (magnitudes, signs moved onto the activations)
// 2·127·127 = 32258 < 2^15.

#include <immintrin.h>

#include <cstring>

#include "kernels/cpu/gemm.h"
#include "kernels/cpu/gemm_avx2_tiles.h"
#include "kernels/cpu/simd_math_avx2.h"

namespace tokenfab::kernels {

namespace {

// 32 nibbles → 32 bytes in element order (byte j: element j low, element j+16 high).
inline __m256i unpack_nibbles(const uint8_t* qs) {
  const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs));
  const __m128i mask = _mm_set1_epi8(0x0f);
  const __m128i lo = _mm_and_si128(raw, mask);
  const __m128i hi = _mm_and_si128(_mm_srli_epi16(raw, 4), mask);
  return _mm256_set_m128i(hi, lo);
}

// Sum of u8 × s8 over 32 lanes, as 8 f32 partial sums.
inline __m256 dot_u8_s8(__m256i u, __m256i s) {
  const __m256i p16 = _mm256_maddubs_epi16(u, s);
  return _mm256_cvtepi32_ps(_mm256_madd_epi16(p16, _mm256_set1_epi16(1)));
}

// 32 bits (little-endian qh) → 32 bytes, byte i = 0x10 where bit i is set: Q5's fifth bits in
// element order.
inline __m256i fifth_bits(const uint8_t* qh) {
  uint32_t bits;
  std::memcpy(&bits, qh, sizeof bits);
  const __m256i spread = _mm256_shuffle_epi8(
      _mm256_set1_epi32(static_cast<int>(bits)),
      _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202, 0x0101010101010101, 0));
  const __m256i bit = _mm256_set1_epi64x(static_cast<int64_t>(0x8040201008040201));
  return _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit),
                          _mm256_set1_epi8(0x10));
}

// The IQ4 values for 32 indices (one per byte).
inline __m256i iq4_values(__m256i idx) {
  const __m128i table = _mm_loadu_si128(reinterpret_cast<const __m128i*>(kIQ4Values));
  return _mm256_shuffle_epi8(_mm256_set_m128i(table, table), idx);
}

template <WeightType T>
inline constexpr bool kSignedBlock = T == WeightType::Q8_0 || T == WeightType::IQ4_NL;

struct WeightBlock {
  __m256i q;    // unsigned (Q4, Q5) or absolute value (Q8_0, IQ4_NL) bytes
  __m256i sgn;  // signed types only: the weight bytes, whose signs move onto the activations
  float d;      // scale
  float bias;   // multiplies the activation block's s: -8d (Q4_0), -16d (Q5_0), m (Q4_1, Q5_1)
};

template <WeightType T>
inline WeightBlock load_block(const uint8_t* p) {
  WeightBlock b;
  if constexpr (T == WeightType::Q4_0) {
    const auto* w = reinterpret_cast<const BlockQ4_0*>(p);
    b.q = unpack_nibbles(w->qs);
    b.d = _cvtsh_ss(w->d);
    b.bias = -8.0f * b.d;
  } else if constexpr (T == WeightType::Q4_1) {
    const auto* w = reinterpret_cast<const BlockQ4_1*>(p);
    b.q = unpack_nibbles(w->qs);
    b.d = _cvtsh_ss(w->d);
    b.bias = _cvtsh_ss(w->m);
  } else if constexpr (T == WeightType::Q5_0) {
    const auto* w = reinterpret_cast<const BlockQ5_0*>(p);
    b.q = _mm256_or_si256(unpack_nibbles(w->qs), fifth_bits(w->qh));
    b.d = _cvtsh_ss(w->d);
    b.bias = -16.0f * b.d;
  } else if constexpr (T == WeightType::Q5_1) {
    const auto* w = reinterpret_cast<const BlockQ5_1*>(p);
    b.q = _mm256_or_si256(unpack_nibbles(w->qs), fifth_bits(w->qh));
    b.d = _cvtsh_ss(w->d);
    b.bias = _cvtsh_ss(w->m);
  } else if constexpr (T == WeightType::IQ4_NL) {
    const auto* w = reinterpret_cast<const BlockIQ4_NL*>(p);
    b.sgn = iq4_values(unpack_nibbles(w->qs));
    b.q = _mm256_sign_epi8(b.sgn, b.sgn);
    b.d = _cvtsh_ss(w->d);
    b.bias = 0.0f;
  } else {
    const auto* w = reinterpret_cast<const BlockQ8_0*>(p);
    b.sgn = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w->qs));
    b.q = _mm256_sign_epi8(b.sgn, b.sgn);
    b.d = _cvtsh_ss(w->d);
    b.bias = 0.0f;
  }
  return b;
}

template <WeightType T, int R, int C>
void tile_quantized(const GemmArgs& a, int64_t r0, int64_t c0) {
  constexpr size_t kBlockBytes = block_bytes(T);
  const int64_t nb = a.k / kQK;
  avx2::QuantTile<R, C> t(a, r0, c0);
  for (int64_t b = 0; b < nb; ++b) {
    WeightBlock w[R];
    for (int r = 0; r < R; ++r) w[r] = load_block<T>(t.w[r] + b * kBlockBytes);
    for (int c = 0; c < C; ++c) {
      const BlockQ8A& x = t.x[c][b];
      const __m256i xq = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x.qs));
      for (int r = 0; r < R; ++r) {
        const __m256i xs = kSignedBlock<T> ? _mm256_sign_epi8(xq, w[r].sgn) : xq;
        t.acc[r][c] =
            _mm256_fmadd_ps(dot_u8_s8(w[r].q, xs), _mm256_set1_ps(w[r].d * x.d), t.acc[r][c]);
        if constexpr (!kSignedBlock<T>) t.bias[r][c] += w[r].bias * x.s;
      }
    }
  }
  t.store(a, r0, c0);
}

template <WeightType T>
inline __m256 load8(const uint8_t* row, int64_t i) {
  if constexpr (T == WeightType::F32) {
    return _mm256_loadu_ps(reinterpret_cast<const float*>(row) + i);
  } else if constexpr (T == WeightType::F16) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row + 2 * i)));
  } else {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(row + 2 * i));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  }
}

template <WeightType T, int R, int C>
void tile_float(const GemmArgs& a, int64_t r0, int64_t c0) {
  __m256 acc[R][C];
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) acc[r][c] = _mm256_setzero_ps();
  for (int64_t i = 0; i < a.k; i += 8) {
    __m256 w[R];
    for (int r = 0; r < R; ++r) w[r] = load8<T>(a.w + (r0 + r) * a.w_stride, i);
    for (int c = 0; c < C; ++c) {
      const __m256 x =
          _mm256_loadu_ps(reinterpret_cast<const float*>(a.x + (c0 + c) * a.x_stride) + i);
      for (int r = 0; r < R; ++r) acc[r][c] = _mm256_fmadd_ps(w[r], x, acc[r][c]);
    }
  }
  for (int c = 0; c < C; ++c)
    for (int r = 0; r < R; ++r) a.y[(c0 + c) * a.ldy + r0 + r] = hsum_avx2(acc[r][c]);
}

template <WeightType T, int R, int C>
[[gnu::noinline]] void tile(const GemmArgs& a, int64_t r0, int64_t c0) {
  if constexpr (T == WeightType::F32 || T == WeightType::F16 || T == WeightType::BF16) {
    tile_float<T, R, C>(a, r0, c0);
  } else {
    tile_quantized<T, R, C>(a, r0, c0);
  }
}

template <WeightType T>
void gemm_typed(const GemmArgs& a) {
  avx2::walk_tiles(a, [&]<int R, int C>(int64_t r0, int64_t c0) { tile<T, R, C>(a, r0, c0); });
}

}  // namespace

void gemm_avx2(const GemmArgs& a) {
  switch (a.type) {
    case WeightType::F32:
      gemm_typed<WeightType::F32>(a);
      return;
    case WeightType::F16:
      gemm_typed<WeightType::F16>(a);
      return;
    case WeightType::BF16:
      gemm_typed<WeightType::BF16>(a);
      return;
    case WeightType::Q4_0:
      gemm_typed<WeightType::Q4_0>(a);
      return;
    case WeightType::Q4_1:
      gemm_typed<WeightType::Q4_1>(a);
      return;
    case WeightType::Q8_0:
      gemm_typed<WeightType::Q8_0>(a);
      return;
    case WeightType::Q5_0:
      gemm_typed<WeightType::Q5_0>(a);
      return;
    case WeightType::Q5_1:
      gemm_typed<WeightType::Q5_1>(a);
      return;
    case WeightType::IQ4_NL:
      gemm_typed<WeightType::IQ4_NL>(a);
      return;
    case WeightType::Q2_K:
    case WeightType::Q3_K:
    case WeightType::Q4_K:
    case WeightType::Q5_K:
    case WeightType::Q6_K:
    case WeightType::IQ4_XS:
      gemm_kquants_avx2(a);
      return;
  }
}

}  // namespace tokenfab::kernels
