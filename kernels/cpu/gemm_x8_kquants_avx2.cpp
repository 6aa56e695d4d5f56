// AVX2 kernels over x8 records (repack.h) for the super-block types: Q4_K, Q5_K, Q6_K, Q3_K,
// Q2_K, IQ4_XS. A record is 8 rows × one super-block; it is walked one Q8A block j (32 elements)
// at a time: 8 vectors of levels (four elements of each of the 8 rows), unpacked once for the
// tile's columns, and the rows' sub-block scales as int16 multipliers. Per activation row: 8
// broadcasts of four bytes and 8 maddubs, their pair sums added in int16 as far as the bounds
// allow, one madd per int16 sum against the scales (which folds each sub-block's scale into the
// 32-bit integer), then the float steps of gemm.cpp's formula. int16 bounds (|a.q| ≤ 127):
//   Q4_K  levels ≤ 15: 8 maddubs, 8·2·15·127 = 30480
//   Q5_K  levels ≤ 31: two sums of 4, 4·2·31·127 = 31496
//   Q6_K  levels ≤ 63 (offset 32 taken off in int32: −32·Σ_t sc_t·Σ_t a.q with the activations'
//         pair sums): four sums of 2 (one per 8 elements), 2·2·63·127 = 32004
//   Q3_K  levels ≤ 7 (offset 4, as Q6_K): two sums of 4, 4·2·7·127 = 7112
//   Q2_K  levels ≤ 3: two sums of 4, 4·2·3·127 = 3048
//   IQ4_XS  signed values, sign trick, each maddubs (≤ 2·127·127 = 32258) to 32 bits at once.
// int32: at most 32·63·127·63, 16·63·127·128·2 + 32·2032·128·2 and the like: below 2^26.

#include <immintrin.h>

#include <utility>

#include "kernels/cpu/gemm_x8_avx2_parts.h"

namespace tokenfab::kernels {

namespace {

using namespace x8avx2;
using x8tables::kByteToHalves;
using x8tables::kByteToLane;
using x8tables::kHalfToHalves;

constexpr int R = kX8Rows;

template <int... J, typename F>
inline void for_each_block(std::integer_sequence<int, J...>, F&& f) {
  (f(std::integral_constant<int, J>{}), ...);
}
template <typename F>
inline void for_each_block(F&& f) {
  for_each_block(std::make_integer_sequence<int, kQK_K / kQK>{}, f);
}

inline __m256i and8(__m256i x, char m) {
  return _mm256_and_si256(x, _mm256_set1_epi8(m));
}

// Σ of maddubs(w[v], four activation bytes v) for v in [v0, v0 + n), in int16.
template <int N>
inline __m256i sum16(const __m256i* w, const int8_t* q, int v0) {
  if constexpr (N == 1) {
    return mul4(w[v0], q + 4 * v0);
  } else {
    return _mm256_add_epi16(sum16<N / 2>(w, q, v0), sum16<N / 2>(w, q, v0 + N / 2));
  }
}

template <int C>
struct Columns {
  const BlockQ8A* x[C];
  __m256 acc[C];
  Columns(const GemmArgs& a, int64_t c0) {
    for (int c = 0; c < C; ++c) {
      x[c] = reinterpret_cast<const BlockQ8A*>(a.x + (c0 + c) * a.x_stride);
      acc[c] = _mm256_setzero_ps();
    }
  }
  void store(const GemmArgs& a, int64_t g, int64_t c0) const {
    for (int c = 0; c < C; ++c) _mm256_storeu_ps(a.y + (c0 + c) * a.ldy + g * R, acc[c]);
  }
};

// Q4_K / Q5_K: 6-bit scales and mins of the 8 sub-blocks, decoded from the record's three words
// of GGUF scales per row (ggml's get_scale_min_k4 on 8 lanes): sc[h], m[h] hold sub-blocks
// 4h..4h+3 in bytes 0..3 of each row's lane.
struct ScalesK4 {
  __m256i sc[2], m[2];
  explicit ScalesK4(const uint8_t* p) {
    const __m256i w0 = load(p), w1 = load(p + 4 * R), w2 = load(p + 8 * R);
    sc[0] = and8(w0, 0x3f);
    m[0] = and8(w1, 0x3f);
    sc[1] =
        _mm256_or_si256(and8(w2, 0x0f), _mm256_slli_epi32(and8(_mm256_srli_epi32(w0, 6), 3), 4));
    m[1] = _mm256_or_si256(and8(_mm256_srli_epi32(w2, 4), 0x0f),
                           _mm256_slli_epi32(and8(_mm256_srli_epi32(w1, 6), 3), 4));
  }
};

// Q4_K, Q5_K: term_j = d·a.d·(sc_j·Σ q·a.q) − dmin·m_j·a.s.
template <WeightType T>
struct K4 {
  static constexpr bool kFive = T == WeightType::Q5_K;
  static constexpr size_t kScales = 4 * R;
  static constexpr size_t kQh = kScales + 12 * R;
  static constexpr size_t kQs = kQh + (kFive ? 32 * R : 0);
  static constexpr size_t kRecord = kQs + 128 * R;
  static_assert(kRecord == R * block_bytes(T));

  template <int C>
  struct Group {
    static void run(const GemmArgs& a, int64_t g, int64_t c0, bool prefetch, const int32_t*) {
      const int64_t nb = a.k / kQK_K;
      const uint8_t* rec = a.w + g * a.w_stride;
      Columns<C> cols(a, c0);
      for (int64_t b = 0; b < nb; ++b, rec += kRecord) {
        if (prefetch) prefetch_ahead(rec, kRecord);
        const __m256 d = load_half(rec);
        const __m256 ndmin = _mm256_mul_ps(load_half(rec + 2 * R), _mm256_set1_ps(-1.0f));
        const ScalesK4 scales(rec + kScales);
        for_each_block([&](auto j) {
          constexpr int J = decltype(j)::value;
          const __m256i sc = _mm256_shuffle_epi8(scales.sc[J / 4], table(kByteToHalves[J % 4]));
          const __m256 bias = _mm256_mul_ps(
              ndmin,
              _mm256_cvtepi32_ps(_mm256_shuffle_epi8(scales.m[J / 4], table(kByteToLane[J % 4]))));
          __m256i w[8];
          for (int v = 0; v < 8; ++v) {
            const __m256i p = load(rec + kQs + 32 * (8 * (J / 2) + v));
            w[v] = and8(J % 2 ? _mm256_srli_epi16(p, 4) : p, 0x0f);
            if constexpr (kFive)
              w[v] = _mm256_or_si256(w[v], and8(shift16<4 - J>(load(rec + kQh + 32 * v)), 0x10));
          }
          for (int c = 0; c < C; ++c) {
            const BlockQ8A& xb = cols.x[c][b * 8 + J];
            __m256i isum;
            if constexpr (kFive) {
              isum = _mm256_add_epi32(_mm256_madd_epi16(sum16<4>(w, xb.qs, 0), sc),
                                      _mm256_madd_epi16(sum16<4>(w, xb.qs, 4), sc));
            } else {
              isum = _mm256_madd_epi16(sum16<8>(w, xb.qs, 0), sc);
            }
            cols.acc[c] = add_block(cols.acc[c], isum, d, xb);
            cols.acc[c] = _mm256_fmadd_ps(bias, _mm256_set1_ps(xb.s), cols.acc[c]);
          }
        });
      }
      cols.store(a, g, c0);
    }
  };
};

// Q6_K: term_j = d·a.d·Σ_t sc_t·Σ_t (q − 32)·a.q. Block j = 4h + k: the low four bits from ql
// piece 2h + k % 2 (nibble k / 2), the high two from qh piece h (bits 2k, 2k + 1).
struct Q6K {
  static constexpr size_t kScales = 2 * R;
  static constexpr size_t kQl = kScales + 16 * R;
  static constexpr size_t kQh = kQl + 128 * R;
  static constexpr size_t kRecord = kQh + 64 * R;
  static_assert(kRecord == R * sizeof(BlockQ6_K));

  template <int C>
  struct Group {
    static void run(const GemmArgs& a, int64_t g, int64_t c0, bool prefetch, const int32_t* sums) {
      const int64_t nb = a.k / kQK_K;
      const int64_t nq = a.k / kQK;
      const uint8_t* rec = a.w + g * a.w_stride;
      Columns<C> cols(a, c0);
      for (int64_t b = 0; b < nb; ++b, rec += kRecord) {
        if (prefetch) prefetch_ahead(rec, kRecord);
        const __m256 d = load_half(rec);
        for_each_block([&](auto j) {
          constexpr int J = decltype(j)::value, H = J / 4, K = J % 4;
          // Per row, the int16 pair [sc_2j, sc_2j+1], then each scale in both halves.
          const __m256i scab = _mm256_cvtepi8_epi16(
              _mm_loadu_si128(reinterpret_cast<const __m128i*>(rec + kScales + 2 * R * J)));
          const __m256i sca = _mm256_shuffle_epi8(scab, table(kHalfToHalves[0]));
          const __m256i scb = _mm256_shuffle_epi8(scab, table(kHalfToHalves[1]));
          const __m256i off = _mm256_slli_epi16(scab, 5);  // 32·sc: |·| ≤ 4096
          __m256i w[8];
          for (int v = 0; v < 8; ++v) {
            const __m256i lo = load(rec + kQl + 32 * (8 * (2 * H + K % 2) + v));
            const __m256i hi = load(rec + kQh + 32 * (8 * H + v));
            w[v] = _mm256_or_si256(and8(K / 2 ? _mm256_srli_epi16(lo, 4) : lo, 0x0f),
                                   and8(shift16<4 - 2 * K>(hi), 0x30));
          }
          for (int c = 0; c < C; ++c) {
            const BlockQ8A& xb = cols.x[c][b * 8 + J];
            const __m256i dots =
                _mm256_add_epi32(_mm256_add_epi32(_mm256_madd_epi16(sum16<2>(w, xb.qs, 0), sca),
                                                  _mm256_madd_epi16(sum16<2>(w, xb.qs, 2), sca)),
                                 _mm256_add_epi32(_mm256_madd_epi16(sum16<2>(w, xb.qs, 4), scb),
                                                  _mm256_madd_epi16(sum16<2>(w, xb.qs, 6), scb)));
            const __m256i pairs = _mm256_set1_epi32(sums[(c0 + c) * nq + b * 8 + J]);
            const __m256i isum = _mm256_sub_epi32(dots, _mm256_madd_epi16(off, pairs));
            cols.acc[c] = add_block(cols.acc[c], isum, d, xb);
          }
        });
      }
      cols.store(a, g, c0);
    }
  };
};

// Q3_K: term_j = d·a.d·Σ_t (sc_t − 32)·Σ_t (q − 4)·a.q. The 16 six-bit scales decoded per record
// from its three words of GGUF scales per row: s[i] holds sub-blocks 4i..4i+3 (less 32, signed)
// in bytes 0..3 of each lane. Block j = 4h + k: bits 0–1 from qs piece h (bits 2k, 2k + 1), bit 2
// from hmask (bit j).
struct Q3K {
  static constexpr size_t kScales = 2 * R;
  static constexpr size_t kHmask = kScales + 12 * R;
  static constexpr size_t kQs = kHmask + 32 * R;
  static constexpr size_t kRecord = kQs + 64 * R;
  static_assert(kRecord == R * sizeof(BlockQ3_K));

  template <int C>
  struct Group {
    static void run(const GemmArgs& a, int64_t g, int64_t c0, bool prefetch, const int32_t* sums) {
      const int64_t nb = a.k / kQK_K;
      const int64_t nq = a.k / kQK;
      const uint8_t* rec = a.w + g * a.w_stride;
      Columns<C> cols(a, c0);
      for (int64_t b = 0; b < nb; ++b, rec += kRecord) {
        if (prefetch) prefetch_ahead(rec, kRecord);
        const __m256 d = load_half(rec);
        const __m256i w0 = load(rec + kScales), w1 = load(rec + kScales + 4 * R);
        const __m256i w2 = load(rec + kScales + 8 * R);
        const auto high2 = [&](auto shift) {
          return _mm256_slli_epi32(and8(_mm256_srli_epi32(w2, decltype(shift)::value), 3), 4);
        };
        const __m256i s[4] = {
            _mm256_or_si256(and8(w0, 0x0f), high2(std::integral_constant<int, 0>{})),
            _mm256_or_si256(and8(w1, 0x0f), high2(std::integral_constant<int, 2>{})),
            _mm256_or_si256(and8(_mm256_srli_epi32(w0, 4), 0x0f),
                            high2(std::integral_constant<int, 4>{})),
            _mm256_or_si256(and8(_mm256_srli_epi32(w1, 4), 0x0f),
                            high2(std::integral_constant<int, 6>{}))};
        for_each_block([&](auto j) {
          constexpr int J = decltype(j)::value, H = J / 4, K = J % 4;
          // Bytes 2(j % 2) and 2(j % 2) + 1 of s[j / 2], less 32, as int16 pairs.
          const __m256i sb = _mm256_sub_epi8(s[J / 2], _mm256_set1_epi8(32));
          const __m256i sca = _mm256_srai_epi16(
              _mm256_shuffle_epi8(sb, table(x8tables::kByteToHalvesTop[2 * (J % 2)])), 8);
          const __m256i scb = _mm256_srai_epi16(
              _mm256_shuffle_epi8(sb, table(x8tables::kByteToHalvesTop[2 * (J % 2) + 1])), 8);
          const __m256i scab = _mm256_srai_epi16(
              _mm256_shuffle_epi8(sb, table(x8tables::kBytePairToHalvesTop[J % 2])), 8);
          const __m256i off = _mm256_slli_epi16(scab, 2);  // 4·(sc − 32)
          __m256i w[8];
          for (int v = 0; v < 8; ++v) {
            const __m256i lo =
                and8(_mm256_srli_epi16(load(rec + kQs + 32 * (8 * H + v)), 2 * K), 3);
            w[v] = _mm256_or_si256(lo, and8(shift16<2 - J>(load(rec + kHmask + 32 * v)), 4));
          }
          for (int c = 0; c < C; ++c) {
            const BlockQ8A& xb = cols.x[c][b * 8 + J];
            const __m256i dots = _mm256_add_epi32(_mm256_madd_epi16(sum16<4>(w, xb.qs, 0), sca),
                                                  _mm256_madd_epi16(sum16<4>(w, xb.qs, 4), scb));
            const __m256i pairs = _mm256_set1_epi32(sums[(c0 + c) * nq + b * 8 + J]);
            const __m256i isum = _mm256_sub_epi32(dots, _mm256_madd_epi16(off, pairs));
            cols.acc[c] = add_block(cols.acc[c], isum, d, xb);
          }
        });
      }
      cols.store(a, g, c0);
    }
  };
};

// Q2_K: term_j = d·a.d·Σ_t sc_t·Σ_t q·a.q − dmin·a.d·Σ_t m_t·Σ_t a.q. Block j = 4h + k: qs piece
// h, bits 2k and 2k + 1.
struct Q2K {
  static constexpr size_t kScales = 4 * R;
  static constexpr size_t kQs = kScales + 16 * R;
  static constexpr size_t kRecord = kQs + 64 * R;
  static_assert(kRecord == R * sizeof(BlockQ2_K));

  template <int C>
  struct Group {
    static void run(const GemmArgs& a, int64_t g, int64_t c0, bool prefetch, const int32_t* sums) {
      const int64_t nb = a.k / kQK_K;
      const int64_t nq = a.k / kQK;
      const uint8_t* rec = a.w + g * a.w_stride;
      Columns<C> cols(a, c0);
      for (int64_t b = 0; b < nb; ++b, rec += kRecord) {
        if (prefetch) prefetch_ahead(rec, kRecord);
        const __m256 d = load_half(rec);
        const __m256 ndmin = _mm256_mul_ps(load_half(rec + 2 * R), _mm256_set1_ps(-1.0f));
        for_each_block([&](auto j) {
          constexpr int J = decltype(j)::value, H = J / 4, K = J % 4;
          // Per row, the int16 pair of the two sub-blocks' scale bytes.
          const __m256i raw = _mm256_cvtepu8_epi16(
              _mm_loadu_si128(reinterpret_cast<const __m128i*>(rec + kScales + 2 * R * J)));
          const __m256i scab = _mm256_and_si256(raw, _mm256_set1_epi16(0x0f));
          const __m256i mins = _mm256_srli_epi16(raw, 4);
          const __m256i sca = _mm256_shuffle_epi8(scab, table(kHalfToHalves[0]));
          const __m256i scb = _mm256_shuffle_epi8(scab, table(kHalfToHalves[1]));
          __m256i w[8];
          for (int v = 0; v < 8; ++v)
            w[v] = and8(_mm256_srli_epi16(load(rec + kQs + 32 * (8 * H + v)), 2 * K), 3);
          for (int c = 0; c < C; ++c) {
            const BlockQ8A& xb = cols.x[c][b * 8 + J];
            const __m256i isum = _mm256_add_epi32(_mm256_madd_epi16(sum16<4>(w, xb.qs, 0), sca),
                                                  _mm256_madd_epi16(sum16<4>(w, xb.qs, 4), scb));
            const __m256i imin =
                _mm256_madd_epi16(mins, _mm256_set1_epi32(sums[(c0 + c) * nq + b * 8 + J]));
            cols.acc[c] = add_block(cols.acc[c], isum, d, xb);
            cols.acc[c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(imin),
                                          _mm256_mul_ps(ndmin, _mm256_set1_ps(xb.d)), cols.acc[c]);
          }
        });
      }
      cols.store(a, g, c0);
    }
  };
};

// IQ4_XS: term_j = d·a.d·((ls_j − 32)·Σ v[q]·a.q). Sub-block j's 32 indices are qs words
// 4j..4j+3 in Q4_0's nibble order.
struct IQ4XS {
  static constexpr size_t kScalesH = 2 * R;
  static constexpr size_t kScalesL = kScalesH + 2 * R;
  static constexpr size_t kQs = kScalesL + 4 * R;
  static constexpr size_t kRecord = kQs + 128 * R;
  static_assert(kRecord == R * sizeof(BlockIQ4_XS));

  template <int C>
  struct Group {
    static void run(const GemmArgs& a, int64_t g, int64_t c0, bool prefetch, const int32_t*) {
      const int64_t nb = a.k / kQK_K;
      const uint8_t* rec = a.w + g * a.w_stride;
      Columns<C> cols(a, c0);
      const __m256i values = table(x8tables::kIQ4Signed);
      for (int64_t b = 0; b < nb; ++b, rec += kRecord) {
        if (prefetch) prefetch_ahead(rec, kRecord);
        const __m256 d = load_half(rec);
        const __m256i lo4 = load(rec + kScalesL);
        const __m256i hi2 = _mm256_cvtepu16_epi32(
            _mm_loadu_si128(reinterpret_cast<const __m128i*>(rec + kScalesH)));
        for_each_block([&](auto j) {
          constexpr int J = decltype(j)::value;
          const __m256i ls = _mm256_sub_epi32(
              _mm256_or_si256(
                  _mm256_and_si256(_mm256_srli_epi32(lo4, 4 * J), _mm256_set1_epi32(0x0f)),
                  _mm256_slli_epi32(
                      _mm256_and_si256(_mm256_srli_epi32(hi2, 2 * J), _mm256_set1_epi32(3)), 4)),
              _mm256_set1_epi32(32));
          const __m256i sc = _mm256_shuffle_epi8(ls, table(kHalfToHalves[0]));
          __m256i s[C];
          for (int c = 0; c < C; ++c) s[c] = _mm256_setzero_si256();
          for (int k = 0; k < 4; ++k) {
            const __m256i p = load(rec + kQs + 32 * (4 * J + k));
            for (int h = 0; h < 2; ++h) {
              const __m256i w =
                  _mm256_shuffle_epi8(values, and8(h ? _mm256_srli_epi16(p, 4) : p, 0x0f));
              const __m256i w_abs = _mm256_sign_epi8(w, w);
              for (int c = 0; c < C; ++c) {
                const BlockQ8A& xb = cols.x[c][b * 8 + J];
                const __m256i xs = _mm256_sign_epi8(broadcast4(xb.qs + 16 * h + 4 * k), w);
                s[c] =
                    _mm256_add_epi32(s[c], _mm256_madd_epi16(_mm256_maddubs_epi16(w_abs, xs), sc));
              }
            }
          }
          for (int c = 0; c < C; ++c)
            cols.acc[c] = add_block(cols.acc[c], s[c], d, cols.x[c][b * 8 + J]);
        });
      }
      cols.store(a, g, c0);
    }
  };
};

}  // namespace

void gemm_x8_kquants_avx2(const GemmArgs& a) {
  switch (a.type) {
    case WeightType::Q4_K:
      return walk<K4<WeightType::Q4_K>::Group>(a, nullptr);
    case WeightType::Q5_K:
      return walk<K4<WeightType::Q5_K>::Group>(a, nullptr);
    case WeightType::Q6_K:
      return walk<Q6K::Group>(a, activation_sums(a, ActivationSums::Pairs));
    case WeightType::Q3_K:
      return walk<Q3K::Group>(a, activation_sums(a, ActivationSums::Pairs));
    case WeightType::Q2_K:
      return walk<Q2K::Group>(a, activation_sums(a, ActivationSums::Pairs));
    case WeightType::IQ4_XS:
      return walk<IQ4XS::Group>(a, nullptr);
    default:
      return;
  }
}

}  // namespace tokenfab::kernels
