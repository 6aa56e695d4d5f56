// AVX2 tile kernels on the GGUF layout for the super-block types (Q2_K … Q6_K, IQ4_XS): the part
// of gemm_avx2 (gemm_avx2.cpp) for weight blocks of 256 elements, which meet eight Q8A blocks.
// A tile is R weight rows × C activation rows; per super-block each row's scales are decoded
// once, and per Q8A block j each row's 32 levels are unpacked once for the tile's C columns.
//
// Per row, column and block j, the exact integer of gemm.cpp's formula is formed in 8 int32
// lanes (their sum is it): one maddubs (u8 levels × s8 activations → 16 int16 pair sums), then
// one madd against a vector of the per-pair sub-block scales (16 int16: one scale for a 32-element
// sub-block; for 16-element sub-blocks the low 8 lanes hold sc_2j, the high 8 sc_2j+1). int16
// bounds of the pair sums (|a.q| ≤ 127):
//   Q4_K 2·15·127 = 3810, Q5_K 2·31·127 = 7874, Q2_K 2·3·127 = 762;
//   Q6_K, Q3_K: levels offset by 32 / 4, taken off per pair with the activations' own pair sums
//     times 32 / 4 (one maddubs per column, shared by the rows): |Σ (q − 32)·a| ≤ 2·32·127 = 8128,
//     |Σ (q − 4)·a| ≤ 2·4·127; the unsigned products before it ≤ 2·63·127 = 16002;
//   IQ4_XS: magnitudes of the values (≤ 127) against the activations with their signs moved on,
//     2·127·127 = 32258 < 2^15.
// and of the int32 lanes (their scale at most 63, 128, 15 or 32 in magnitude): below 2^22.
// Then one FMA with d·a.d per lane, the minimums (Q4_K, Q5_K: −dmin·m_j·a.s, summed apart as
// gemm_avx2's Q4_1 bias; Q2_K: Σ_t m_t·Σ_t a.q formed as above, one FMA with −dmin·a.d).

#include <immintrin.h>

#include <type_traits>

#include "kernels/cpu/gemm.h"
#include "kernels/cpu/gemm_avx2_tiles.h"

namespace tokenfab::kernels {

namespace {

inline __m256i load32(const uint8_t* p) {
  return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
}

// x >> n in each 16-bit lane, n a run-time count.
inline __m256i srl16(__m256i x, int n) {
  return _mm256_srl_epi16(x, _mm_cvtsi32_si128(n));
}

// 0x10 (or `value`) in each byte whose bit `bit` is set.
inline __m256i bit_to(__m256i x, int bit, char value) {
  const __m256i m = _mm256_set1_epi8(static_cast<char>(1 << bit));
  return _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(x, m), m), _mm256_set1_epi8(value));
}

// 16 int16 lanes: the low 8 = lo, the high 8 = hi.
inline __m256i scale_pair(int16_t lo, int16_t hi) {
  return _mm256_set_m128i(_mm_set1_epi16(hi), _mm_set1_epi16(lo));
}

// Q4_K / Q5_K: 6-bit scale and min of sub-block s (ggml's get_scale_min_k4).
inline void scale_min_k4(const uint8_t* q, int s, int* sc, int* m) {
  if (s < 4) {
    *sc = q[s] & 63;
    *m = q[s + 4] & 63;
  } else {
    *sc = (q[s + 4] & 0x0f) | (q[s - 4] >> 6) << 4;
    *m = (q[s + 4] >> 4) | (q[s] >> 6) << 4;
  }
}

// How a type's levels meet the activations (the file comment).
enum class Kind { Unsigned, Offset, Signed };

// One row's super-block: its scales decoded once, its levels unpacked per Q8A block j.
// level(j): 32 bytes (unsigned levels, or the signed values for Kind::Signed); scale(j): the
// per-pair scales; d; bias[j] (Q4_K, Q5_K: −dmin·m_j, exact in f32: 11 × 6 significant bits);
// Q2_K: mins(j) per pair and ndmin = −dmin. One walk over a tile's blocks (tile) serves all.
template <WeightType T>
struct Row;

// Q4_K, Q5_K (Block: BlockQ4_K, BlockQ5_K): the levels are nibbles; Q5_K's fifth bits from qh.
template <class Block>
struct RowK4 {
  static constexpr Kind kKind = Kind::Unsigned;
  const Block* w;
  float d;
  int16_t sc[8];
  float bias[8];
  void load(const uint8_t* p) {
    w = reinterpret_cast<const Block*>(p);
    d = _cvtsh_ss(w->d);
    const float dmin = _cvtsh_ss(w->dmin);
    for (int s = 0; s < 8; ++s) {
      int scale, min;
      scale_min_k4(w->scales, s, &scale, &min);
      sc[s] = static_cast<int16_t>(scale);
      bias[s] = -dmin * static_cast<float>(min);
    }
  }
  __m256i level(int j) const {
    const __m256i lo =
        _mm256_and_si256(srl16(load32(w->qs + 32 * (j / 2)), 4 * (j % 2)), _mm256_set1_epi8(0x0f));
    if constexpr (std::is_same_v<Block, BlockQ5_K>) {
      return _mm256_or_si256(lo, bit_to(load32(w->qh), j, 0x10));
    } else {
      return lo;
    }
  }
  __m256i scale(int j) const { return _mm256_set1_epi16(sc[j]); }
};

template <>
struct Row<WeightType::Q4_K> : RowK4<BlockQ4_K> {};
template <>
struct Row<WeightType::Q5_K> : RowK4<BlockQ5_K> {};

template <>
struct Row<WeightType::Q6_K> {
  static constexpr Kind kKind = Kind::Offset;
  static constexpr int kOffset = 32;
  const BlockQ6_K* w;
  float d;
  void load(const uint8_t* p) {
    w = reinterpret_cast<const BlockQ6_K*>(p);
    d = _cvtsh_ss(w->d);
  }
  // Block j = 4h + k: elements 128h + 32k + l.
  __m256i level(int j) const {
    const int h = j / 4, k = j % 4;
    const __m256i lo = _mm256_and_si256(srl16(load32(w->ql + 64 * h + 32 * (k % 2)), 4 * (k / 2)),
                                        _mm256_set1_epi8(0x0f));
    const __m256i hi = _mm256_and_si256(srl16(load32(w->qh + 32 * h), 2 * k), _mm256_set1_epi8(3));
    return _mm256_or_si256(lo, _mm256_slli_epi16(hi, 4));
  }
  __m256i scale(int j) const { return scale_pair(w->scales[2 * j], w->scales[2 * j + 1]); }
};

template <>
struct Row<WeightType::Q3_K> {
  static constexpr Kind kKind = Kind::Offset;
  static constexpr int kOffset = 4;
  const BlockQ3_K* w;
  float d;
  int16_t sc[16];  // sc − 32
  void load(const uint8_t* p) {
    w = reinterpret_cast<const BlockQ3_K*>(p);
    d = _cvtsh_ss(w->d);
    for (int s = 0; s < 16; ++s) {
      sc[s] = static_cast<int16_t>((((w->scales[s % 8] >> 4 * (s / 8)) & 0x0f) |
                                    ((w->scales[8 + s % 4] >> 2 * (s / 4)) & 3) << 4) -
                                   32);
    }
  }
  // Block j = 4h + k: the low two bits at (qs[32h + l] >> 2k) & 3, the third at bit j of hmask[l].
  __m256i level(int j) const {
    const __m256i lo =
        _mm256_and_si256(srl16(load32(w->qs + 32 * (j / 4)), 2 * (j % 4)), _mm256_set1_epi8(3));
    return _mm256_or_si256(lo, bit_to(load32(w->hmask), j, 4));
  }
  __m256i scale(int j) const { return scale_pair(sc[2 * j], sc[2 * j + 1]); }
};

template <>
struct Row<WeightType::Q2_K> {
  static constexpr Kind kKind = Kind::Unsigned;
  const BlockQ2_K* w;
  float d, ndmin;
  void load(const uint8_t* p) {
    w = reinterpret_cast<const BlockQ2_K*>(p);
    d = _cvtsh_ss(w->d);
    ndmin = -_cvtsh_ss(w->dmin);
  }
  __m256i level(int j) const {
    return _mm256_and_si256(srl16(load32(w->qs + 32 * (j / 4)), 2 * (j % 4)), _mm256_set1_epi8(3));
  }
  __m256i scale(int j) const {
    return scale_pair(w->scales[2 * j] & 0x0f, w->scales[2 * j + 1] & 0x0f);
  }
  __m256i mins(int j) const { return scale_pair(w->scales[2 * j] >> 4, w->scales[2 * j + 1] >> 4); }
};

template <>
struct Row<WeightType::IQ4_XS> {
  static constexpr Kind kKind = Kind::Signed;
  const BlockIQ4_XS* w;
  float d;
  int16_t sc[8];  // ls − 32
  void load(const uint8_t* p) {
    w = reinterpret_cast<const BlockIQ4_XS*>(p);
    d = _cvtsh_ss(w->d);
    for (int s = 0; s < 8; ++s) {
      sc[s] = static_cast<int16_t>(
          (((w->scales_l[s / 2] >> 4 * (s % 2)) & 0x0f) | ((w->scales_h >> 2 * s) & 3) << 4) - 32);
    }
  }
  __m256i level(int j) const {
    const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(w->qs + 16 * j));
    const __m128i mask = _mm_set1_epi8(0x0f);
    const __m256i idx =
        _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(raw, 4), mask), _mm_and_si128(raw, mask));
    const __m128i table = _mm_loadu_si128(reinterpret_cast<const __m128i*>(kIQ4Values));
    return _mm256_shuffle_epi8(_mm256_set_m128i(table, table), idx);
  }
  __m256i scale(int j) const { return _mm256_set1_epi16(sc[j]); }
};

template <WeightType T>
inline constexpr bool kHasBias = T == WeightType::Q4_K || T == WeightType::Q5_K;

template <WeightType T, int R, int C>
[[gnu::noinline]] void tile(const GemmArgs& a, int64_t r0, int64_t c0) {
  using RowT = Row<T>;
  constexpr size_t kBlockBytes = block_bytes(T);
  const int64_t nb = a.k / kQK_K;
  avx2::QuantTile<R, C> t(a, r0, c0);
  for (int64_t b = 0; b < nb; ++b) {
    RowT row[R];
    for (int r = 0; r < R; ++r) row[r].load(t.w[r] + b * kBlockBytes);
    for (int j = 0; j < kQK_K / kQK; ++j) {
      __m256i q[R], sgn[R], sc[R];
      for (int r = 0; r < R; ++r) {
        sgn[r] = row[r].level(j);
        q[r] = RowT::kKind == Kind::Signed ? _mm256_sign_epi8(sgn[r], sgn[r]) : sgn[r];
        sc[r] = row[r].scale(j);
      }
      for (int c = 0; c < C; ++c) {
        const BlockQ8A& x = t.x[c][b * (kQK_K / kQK) + j];
        const __m256i xq = load32(reinterpret_cast<const uint8_t*>(x.qs));
        // The activations' pair sums, times the levels' offset (Q6_K, Q3_K) or once (Q2_K).
        __m256i xoff = _mm256_setzero_si256();
        if constexpr (RowT::kKind == Kind::Offset) {
          xoff = _mm256_maddubs_epi16(_mm256_set1_epi8(RowT::kOffset), xq);
        } else if constexpr (T == WeightType::Q2_K) {
          xoff = _mm256_maddubs_epi16(_mm256_set1_epi8(1), xq);
        }
        for (int r = 0; r < R; ++r) {
          __m256i pairs;
          if constexpr (RowT::kKind == Kind::Signed) {
            pairs = _mm256_maddubs_epi16(q[r], _mm256_sign_epi8(xq, sgn[r]));
          } else {
            pairs = _mm256_maddubs_epi16(q[r], xq);
            if constexpr (RowT::kKind == Kind::Offset) pairs = _mm256_sub_epi16(pairs, xoff);
          }
          const __m256 isum = _mm256_cvtepi32_ps(_mm256_madd_epi16(pairs, sc[r]));
          t.acc[r][c] = _mm256_fmadd_ps(isum, _mm256_set1_ps(row[r].d * x.d), t.acc[r][c]);
          if constexpr (kHasBias<T>) t.bias[r][c] += row[r].bias[j] * x.s;
          if constexpr (T == WeightType::Q2_K) {
            const __m256 imin = _mm256_cvtepi32_ps(_mm256_madd_epi16(xoff, row[r].mins(j)));
            t.acc[r][c] = _mm256_fmadd_ps(imin, _mm256_set1_ps(row[r].ndmin * x.d), t.acc[r][c]);
          }
        }
      }
    }
  }
  t.store(a, r0, c0);
}

template <WeightType T>
void gemm_typed(const GemmArgs& a) {
  avx2::walk_tiles(a, [&]<int R, int C>(int64_t r0, int64_t c0) { tile<T, R, C>(a, r0, c0); });
}

}  // namespace

void gemm_kquants_avx2(const GemmArgs& a) {
  switch (a.type) {
    case WeightType::Q2_K:
      gemm_typed<WeightType::Q2_K>(a);
      return;
    case WeightType::Q3_K:
      gemm_typed<WeightType::Q3_K>(a);
      return;
    case WeightType::Q4_K:
      gemm_typed<WeightType::Q4_K>(a);
      return;
    case WeightType::Q5_K:
      gemm_typed<WeightType::Q5_K>(a);
      return;
    case WeightType::Q6_K:
      gemm_typed<WeightType::Q6_K>(a);
      return;
    case WeightType::IQ4_XS:
      gemm_typed<WeightType::IQ4_XS>(a);
      return;
    default:
      return;
  }
}

}  // namespace tokenfab::kernels
