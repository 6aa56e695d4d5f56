// AVX2 kernels over x8 records (repack.h) for the other 32-element types: Q5_0, Q5_1, IQ4_NL.
// Per row group and block:
// Q5: 4 loads unpacked into 8 vectors of nibbles, each with its fifth bits from the record's qh'
//   word (one shift and mask per vector); per activation row, 8 broadcasts of 4 bytes and 8
//   maddubs summed in 16 bits in two halves of four (|sum| ≤ 4·2·31·127 = 31496 < 2^15; eight
//   would overflow; madd_runs<4, 8>), two madds to 32 bits, then, as Q4_0 / Q4_1, one FMA with the
//   rows' d·a.d and one with the minimums (−16d for Q5_0, m for Q5_1) times a.s.
// IQ4_NL: 4 loads, nibbles looked up in the value table (pshufb) to signed bytes; per vector and
//   activation row the sign trick (|v| × a with v's sign), each maddubs widened to 32 bits at once
//   (2·127·127 = 32258 leaves no room for a second), then one FMA with d·a.d.

#include <immintrin.h>

#include "kernels/cpu/gemm_x8_avx2_parts.h"

namespace tokenfab::kernels {

namespace {

using namespace x8avx2;

// Record vector k's nibbles with their fifth bits, as the weight vectors madd_runs takes: w[k]
// the low nibbles (elements 4k..4k+3), w[4 + k] the high (16+4k..). qh' bit k of each byte is the
// low nibble's fifth bit, bit 4 + k the high nibble's (repack.h).
template <int K>
inline void unpack_q5(const uint8_t* qs, __m256i qh, __m256i* w) {
  const __m256i mask = _mm256_set1_epi8(0x0f), fifth = _mm256_set1_epi8(0x10);
  const __m256i p = load(qs + 32 * K);
  w[K] = _mm256_or_si256(_mm256_and_si256(p, mask), _mm256_and_si256(shift16<4 - K>(qh), fifth));
  w[4 + K] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(p, 4), mask),
                             _mm256_and_si256(shift16<-K>(qh), fifth));
}

template <WeightType T>
struct Q5 {
  static constexpr bool kMin = T == WeightType::Q5_1;
  static constexpr size_t kQh = (kMin ? 4 : 2) * kX8Rows;
  static constexpr size_t kQs = kQh + 4 * kX8Rows;
  static_assert(kQs + 16 * kX8Rows == kX8Rows * block_bytes(T));

  template <int C>
  struct Group {
    static void run(const GemmArgs& a, int64_t g, int64_t c0, bool prefetch, const int32_t*) {
      const __m256i ones = _mm256_set1_epi16(1);
      constexpr size_t kRecord = kX8Rows * block_bytes(T);
      Tile<C> tile(a, c0);
      auto& [x, acc] = tile;
      const uint8_t* rec = a.w + g * a.w_stride;
      for (int64_t b = 0; b < a.k / block_elements(T); ++b, rec += kRecord) {
        if (prefetch) prefetch_ahead(rec, kRecord);
        const __m256 d = load_half(rec);
        const __m256 m =
            kMin ? load_half(rec + 2 * kX8Rows) : _mm256_mul_ps(d, _mm256_set1_ps(-16.0f));
        const __m256i qh = load(rec + kQh);
        __m256i w[8];
        for_each_index<4>([&](auto k) { unpack_q5<decltype(k)::value>(rec + kQs, qh, w); });
        for (int c = 0; c < C; ++c) {
          const BlockQ8A& xb = x[c][b];
          acc[c] = add_block(acc[c], madd_runs<4, 8>(w, xb.qs, 0, ones), d, xb);
          acc[c] = _mm256_fmadd_ps(m, _mm256_set1_ps(xb.s), acc[c]);
        }
      }
      tile.store(a, g, c0);
    }
  };
};

template <int C>
struct IQ4NLGroup {
  static void run(const GemmArgs& a, int64_t g, int64_t c0, bool prefetch, const int32_t*) {
    const __m256i ones = _mm256_set1_epi16(1);
    constexpr size_t kRecord = kX8Rows * block_bytes(WeightType::IQ4_NL);
    Tile<C> tile(a, c0);
    auto& [x, acc] = tile;
    const uint8_t* rec = a.w + g * a.w_stride;
    for (int64_t b = 0; b < a.k / kQK; ++b, rec += kRecord) {
      if (prefetch) prefetch_ahead(rec, kRecord);
      const __m256 d = load_half(rec);
      const BlockQ8A* xb[C];
      for (int c = 0; c < C; ++c) xb[c] = &x[c][b];
      __m256i s[C];
      iq4_sums<C>(rec + 2 * kX8Rows, ones, xb, s);
      for (int c = 0; c < C; ++c) acc[c] = add_block(acc[c], s[c], d, *xb[c]);
    }
    tile.store(a, g, c0);
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
