// AVX2 kernels over x8 records (repack.h) for the other 32-element types: Q5_0, Q5_1, IQ4_NL.
// Per row group and block:
// Q5: 4 loads unpacked into 8 vectors of nibbles, each with its fifth bits from the record's qh'
//   word (one shift and mask per vector); per activation row, 8 broadcasts of 4 bytes and 8
//   maddubs summed in 16 bits in two halves of four (|sum| ≤ 4·2·31·127 = 31496 < 2^15; eight
//   would overflow), two madds to 32 bits, then, as Q4_0 / Q4_1, one FMA with the rows' d·a.d and
//   one with the minimums (−16d for Q5_0, m for Q5_1) times a.s.
// IQ4_NL: 4 loads, nibbles looked up in the value table (pshufb) to signed bytes; per vector and
//   activation row the sign trick (|v| × a with v's sign), each maddubs widened to 32 bits at once
//   (2·127·127 = 32258 leaves no room for a second), then one FMA with d·a.d.

#include <immintrin.h>

#include "kernels/cpu/gemm_x8_avx2_parts.h"

namespace tokenfab::kernels {

namespace {

using namespace x8avx2;

// Activation bytes for weight vector v: v = 2k holds elements 4k..4k+3 (the low nibbles of record
// vector k), v = 2k + 1 elements 16+4k..16+4k+3 (its high nibbles).
inline const int8_t* act(const BlockQ8A& x, int v) {
  return x.qs + 16 * (v & 1) + 4 * (v >> 1);
}

// Record vector k's nibbles with their fifth bits: qh' bit k of each byte is the low nibble's,
// bit 4 + k the high nibble's (repack.h).
template <int K>
inline void unpack_q5(const uint8_t* qs, __m256i qh, __m256i* w) {
  const __m256i mask = _mm256_set1_epi8(0x0f), fifth = _mm256_set1_epi8(0x10);
  const __m256i p = load(qs + 32 * K);
  w[2 * K] =
      _mm256_or_si256(_mm256_and_si256(p, mask), _mm256_and_si256(shift16<4 - K>(qh), fifth));
  w[2 * K + 1] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(p, 4), mask),
                                 _mm256_and_si256(shift16<-K>(qh), fifth));
}

template <WeightType T>
struct Q5 {
  template <int C>
  struct Group {
    static void run(const GemmArgs& a, int64_t g, int64_t c0, bool prefetch, const int32_t*) {
      constexpr bool kMin = T == WeightType::Q5_1;
      constexpr size_t kQh = (kMin ? 4 : 2) * kX8Rows;
      constexpr size_t kQs = kQh + 4 * kX8Rows;
      constexpr size_t kRecord = kQs + 16 * kX8Rows;
      static_assert(kRecord == kX8Rows * block_bytes(T));
      const int64_t nb = a.k / kQK;
      const uint8_t* rec = a.w + g * a.w_stride;
      const BlockQ8A* x[C];
      for (int c = 0; c < C; ++c)
        x[c] = reinterpret_cast<const BlockQ8A*>(a.x + (c0 + c) * a.x_stride);
      __m256 acc[C];
      for (int c = 0; c < C; ++c) acc[c] = _mm256_setzero_ps();
      const __m256i ones = _mm256_set1_epi16(1);
      for (int64_t b = 0; b < nb; ++b, rec += kRecord) {
        if (prefetch) prefetch_ahead(rec, kRecord);
        const __m256 d = load_half(rec);
        const __m256 m =
            kMin ? load_half(rec + 2 * kX8Rows) : _mm256_mul_ps(d, _mm256_set1_ps(-16.0f));
        const __m256i qh = load(rec + kQh);
        __m256i w[8];
        unpack_q5<0>(rec + kQs, qh, w);
        unpack_q5<1>(rec + kQs, qh, w);
        unpack_q5<2>(rec + kQs, qh, w);
        unpack_q5<3>(rec + kQs, qh, w);
        for (int c = 0; c < C; ++c) {
          const BlockQ8A& xb = x[c][b];
          __m256i half[2];
          for (int h = 0; h < 2; ++h) {
            const int v = 4 * h;
            half[h] = _mm256_add_epi16(
                _mm256_add_epi16(mul4(w[v], act(xb, v)), mul4(w[v + 1], act(xb, v + 1))),
                _mm256_add_epi16(mul4(w[v + 2], act(xb, v + 2)), mul4(w[v + 3], act(xb, v + 3))));
          }
          const __m256i isum =
              _mm256_add_epi32(_mm256_madd_epi16(half[0], ones), _mm256_madd_epi16(half[1], ones));
          acc[c] = add_block(acc[c], isum, d, xb);
          acc[c] = _mm256_fmadd_ps(m, _mm256_set1_ps(xb.s), acc[c]);
        }
      }
      for (int c = 0; c < C; ++c) _mm256_storeu_ps(a.y + (c0 + c) * a.ldy + g * kX8Rows, acc[c]);
    }
  };
};

template <int C>
struct IQ4NLGroup {
  static void run(const GemmArgs& a, int64_t g, int64_t c0, bool prefetch, const int32_t*) {
    constexpr size_t kRecord = 18 * kX8Rows;
    const int64_t nb = a.k / kQK;
    const uint8_t* rec = a.w + g * a.w_stride;
    const BlockQ8A* x[C];
    for (int c = 0; c < C; ++c)
      x[c] = reinterpret_cast<const BlockQ8A*>(a.x + (c0 + c) * a.x_stride);
    __m256 acc[C];
    for (int c = 0; c < C; ++c) acc[c] = _mm256_setzero_ps();
    const __m256i ones = _mm256_set1_epi16(1), mask = _mm256_set1_epi8(0x0f);
    const __m256i values = table(x8tables::kIQ4Signed);
    for (int64_t b = 0; b < nb; ++b, rec += kRecord) {
      if (prefetch) prefetch_ahead(rec, kRecord);
      const __m256 d = load_half(rec);
      // Vector by vector, each weight vector's values and magnitudes made once for all the tile's
      // columns.
      __m256i s[C];
      for (int c = 0; c < C; ++c) s[c] = _mm256_setzero_si256();
      for (int k = 0; k < 4; ++k) {
        const __m256i p = load(rec + 2 * kX8Rows + 32 * k);
        for (int h = 0; h < 2; ++h) {
          const __m256i idx = _mm256_and_si256(h == 0 ? p : _mm256_srli_epi16(p, 4), mask);
          const __m256i w = _mm256_shuffle_epi8(values, idx);
          const __m256i w_abs = _mm256_sign_epi8(w, w);
          for (int c = 0; c < C; ++c) {
            const __m256i xs = _mm256_sign_epi8(broadcast4(act(x[c][b], 2 * k + h)), w);
            s[c] = _mm256_add_epi32(s[c], _mm256_madd_epi16(_mm256_maddubs_epi16(w_abs, xs), ones));
          }
        }
      }
      for (int c = 0; c < C; ++c) acc[c] = add_block(acc[c], s[c], d, x[c][b]);
    }
    for (int c = 0; c < C; ++c) _mm256_storeu_ps(a.y + (c0 + c) * a.ldy + g * kX8Rows, acc[c]);
  }
};

}  // namespace

void gemm_x8_q5_avx2(const GemmArgs& a) {
  switch (a.type) {
    case WeightType::Q5_0:
      return walk<Q5<WeightType::Q5_0>::Group>(a, nullptr);
    case WeightType::Q5_1:
      return walk<Q5<WeightType::Q5_1>::Group>(a, nullptr);
    case WeightType::IQ4_NL:
      return walk<IQ4NLGroup>(a, nullptr);
    default:
      return;
  }
}

}  // namespace tokenfab::kernels
