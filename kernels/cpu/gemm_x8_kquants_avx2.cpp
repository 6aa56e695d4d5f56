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

#include "kernels/cpu/gemm_x8_avx2_parts.h"

namespace tokenfab::kernels {

namespace {

using namespace x8avx2;
using x8tables::kByteToHalves;
using x8tables::kByteToLane;
using x8tables::kHalfToHalves;

constexpr int R = kX8Rows;
constexpr int kBlocks = kQK_K / kQK;  // Q8A blocks per super-block

inline __m256i and8(__m256i x, char m) {
  return _mm256_and_si256(x, _mm256_set1_epi8(m));
}

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
  static_assert(kQs + 128 * R == R * block_bytes(T));

  template <int C>
  struct Group {
    static void run(const GemmArgs& a, int64_t g, int64_t c0, bool prefetch, const int32_t*) {
      constexpr size_t kRecord = kX8Rows * block_bytes(T);
      Tile<C> tile(a, c0);
      auto& [x, acc] = tile;
      const uint8_t* rec = a.w + g * a.w_stride;
      for (int64_t b = 0; b < a.k / block_elements(T); ++b, rec += kRecord) {
        if (prefetch) prefetch_ahead(rec, kRecord);
        const __m256 d = load_half(rec);
        const __m256 ndmin = _mm256_mul_ps(load_half(rec + 2 * R), _mm256_set1_ps(-1.0f));
        const ScalesK4 scales(rec + kScales);
        for_each_index<kBlocks>([&](auto j) {
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
            const BlockQ8A& xb = x[c][b * kBlocks + J];
            acc[c] = add_block(acc[c], madd_runs < kFive ? 4 : 8, 8 > (w, xb.qs, 0, sc), d, xb);
            acc[c] = _mm256_fmadd_ps(bias, _mm256_set1_ps(xb.s), acc[c]);
          }
        });
      }
      tile.store(a, g, c0);
    }
  };
};

// Q6_K: term_j = d·a.d·Σ_t sc_t·Σ_t (q − 32)·a.q. Block j = 4h + k: the low four bits from ql
// piece 2h + k % 2 (nibble k / 2), the high two from qh piece h (bits 2k, 2k + 1).
struct Q6KLevels {
  static constexpr WeightType kType = WeightType::Q6_K;
  static constexpr int kRun = 2;  // int16 runs of 2 vectors: 2·2·63·127 = 32004
  static constexpr size_t kScales = 2 * R;
  static constexpr size_t kQl = kScales + 16 * R;
  static constexpr size_t kQh = kQl + 128 * R;
  static_assert(kQh + 64 * R == R * sizeof(BlockQ6_K));
  const uint8_t* rec;

  explicit Q6KLevels(const uint8_t* record) : rec(record) {}
  // Block J's levels w, its halves' scales sca, scb (each row's int16 in both halves of its lane)
  // and off (the int16 pair [32·sc_2j, 32·sc_2j+1] per row).
  template <int J>
  void block(__m256i* w, __m256i& sca, __m256i& scb, __m256i& off) const {
    constexpr int H = J / 4, K = J % 4;
    const __m256i scab = _mm256_cvtepi8_epi16(
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(rec + kScales + 2 * R * J)));
    sca = _mm256_shuffle_epi8(scab, table(kHalfToHalves[0]));
    scb = _mm256_shuffle_epi8(scab, table(kHalfToHalves[1]));
    off = _mm256_slli_epi16(scab, 5);  // |32·sc| ≤ 4096
    for (int v = 0; v < 8; ++v) {
      const __m256i lo = load(rec + kQl + 32 * (8 * (2 * H + K % 2) + v));
      const __m256i hi = load(rec + kQh + 32 * (8 * H + v));
      w[v] = _mm256_or_si256(and8(K / 2 ? _mm256_srli_epi16(lo, 4) : lo, 0x0f),
                             and8(shift16<4 - 2 * K>(hi), 0x30));
    }
  }
};

// Q3_K: term_j = d·a.d·Σ_t (sc_t − 32)·Σ_t (q − 4)·a.q. The 16 six-bit scales decoded per record
// from its three words of GGUF scales per row: s[i] holds sub-blocks 4i..4i+3 in bytes 0..3 of
// each lane. Block j = 4h + k: bits 0–1 from qs piece h (bits 2k, 2k + 1), bit 2 from hmask
// (bit j).
struct Q3KLevels {
  static constexpr WeightType kType = WeightType::Q3_K;
  static constexpr int kRun = 4;  // 4·2·7·127 = 7112
  static constexpr size_t kScales = 2 * R;
  static constexpr size_t kHmask = kScales + 12 * R;
  static constexpr size_t kQs = kHmask + 32 * R;
  static_assert(kQs + 64 * R == R * sizeof(BlockQ3_K));
  const uint8_t* rec;
  __m256i s[4];

  explicit Q3KLevels(const uint8_t* record) : rec(record) {
    const __m256i w0 = load(rec + kScales), w1 = load(rec + kScales + 4 * R);
    const __m256i w2 = load(rec + kScales + 8 * R);
    const auto high2 = [&](auto shift) {
      return _mm256_slli_epi32(and8(_mm256_srli_epi32(w2, decltype(shift)::value), 3), 4);
    };
    s[0] = _mm256_or_si256(and8(w0, 0x0f), high2(std::integral_constant<int, 0>{}));
    s[1] = _mm256_or_si256(and8(w1, 0x0f), high2(std::integral_constant<int, 2>{}));
    s[2] = _mm256_or_si256(and8(_mm256_srli_epi32(w0, 4), 0x0f),
                           high2(std::integral_constant<int, 4>{}));
    s[3] = _mm256_or_si256(and8(_mm256_srli_epi32(w1, 4), 0x0f),
                           high2(std::integral_constant<int, 6>{}));
  }
  // As Q6KLevels::block, off the pair [4·(sc_2j − 32), 4·(sc_2j+1 − 32)].
  template <int J>
  void block(__m256i* w, __m256i& sca, __m256i& scb, __m256i& off) const {
    constexpr int H = J / 4, K = J % 4;
    // Bytes 2(j % 2) and 2(j % 2) + 1 of s[j / 2], less 32, as int16 pairs.
    const __m256i sb = _mm256_sub_epi8(s[J / 2], _mm256_set1_epi8(32));
    sca = _mm256_srai_epi16(_mm256_shuffle_epi8(sb, table(x8tables::kByteToHalvesTop[2 * (J % 2)])),
                            8);
    scb = _mm256_srai_epi16(
        _mm256_shuffle_epi8(sb, table(x8tables::kByteToHalvesTop[2 * (J % 2) + 1])), 8);
    off = _mm256_slli_epi16(
        _mm256_srai_epi16(_mm256_shuffle_epi8(sb, table(x8tables::kBytePairToHalvesTop[J % 2])), 8),
        2);
    for (int v = 0; v < 8; ++v) {
      const __m256i lo = and8(_mm256_srli_epi16(load(rec + kQs + 32 * (8 * H + v)), 2 * K), 3);
      w[v] = _mm256_or_si256(lo, and8(shift16<2 - J>(load(rec + kHmask + 32 * v)), 4));
    }
  }
};

// Q6_K, Q3_K (Levels: Q6KLevels, Q3KLevels): per block j, the halves' sums times their scales,
// less Σ_t off_t·Σ_t a.q (one madd of the rows' int16 pairs of offset × scale with the column's
// pair sums).
template <class Levels>
struct OffsetLevels {
  template <int C>
  struct Group {
    static void run(const GemmArgs& a, int64_t g, int64_t c0, bool prefetch, const int32_t* sums) {
      const int64_t nq = a.k / kQK;
      constexpr size_t kRecord = kX8Rows * block_bytes(Levels::kType);
      Tile<C> tile(a, c0);
      auto& [x, acc] = tile;
      const uint8_t* rec = a.w + g * a.w_stride;
      for (int64_t b = 0; b < a.k / block_elements(Levels::kType); ++b, rec += kRecord) {
        if (prefetch) prefetch_ahead(rec, kRecord);
        const __m256 d = load_half(rec);
        const Levels levels(rec);
        for_each_index<kBlocks>([&](auto j) {
          constexpr int J = decltype(j)::value;
          __m256i w[8], sca, scb, off;
          levels.template block<J>(w, sca, scb, off);
          for (int c = 0; c < C; ++c) {
            const BlockQ8A& xb = x[c][b * kBlocks + J];
            const __m256i pairs = _mm256_set1_epi32(sums[(c0 + c) * nq + b * kBlocks + J]);
            const __m256i isum = _mm256_sub_epi32(scaled_halves<Levels::kRun>(w, xb.qs, sca, scb),
                                                  _mm256_madd_epi16(off, pairs));
            acc[c] = add_block(acc[c], isum, d, xb);
          }
        });
      }
      tile.store(a, g, c0);
    }
  };
};

// Q2_K: term_j = d·a.d·Σ_t sc_t·Σ_t q·a.q − dmin·a.d·Σ_t m_t·Σ_t a.q. Block j = 4h + k: qs piece
// h, bits 2k and 2k + 1.
struct Q2K {
  static constexpr size_t kScales = 4 * R;
  static constexpr size_t kQs = kScales + 16 * R;
  static_assert(kQs + 64 * R == R * sizeof(BlockQ2_K));

  template <int C>
  struct Group {
    static void run(const GemmArgs& a, int64_t g, int64_t c0, bool prefetch, const int32_t* sums) {
      const int64_t nq = a.k / kQK;
      constexpr size_t kRecord = kX8Rows * block_bytes(WeightType::Q2_K);
      Tile<C> tile(a, c0);
      auto& [x, acc] = tile;
      const uint8_t* rec = a.w + g * a.w_stride;
      for (int64_t b = 0; b < a.k / block_elements(WeightType::Q2_K); ++b, rec += kRecord) {
        if (prefetch) prefetch_ahead(rec, kRecord);
        const __m256 d = load_half(rec);
        const __m256 ndmin = _mm256_mul_ps(load_half(rec + 2 * R), _mm256_set1_ps(-1.0f));
        for_each_index<kBlocks>([&](auto j) {
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
            const BlockQ8A& xb = x[c][b * kBlocks + J];
            const __m256i isum = scaled_halves<4>(w, xb.qs, sca, scb);
            const __m256i imin =
                _mm256_madd_epi16(mins, _mm256_set1_epi32(sums[(c0 + c) * nq + b * kBlocks + J]));
            acc[c] = add_block(acc[c], isum, d, xb);
            acc[c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(imin),
                                     _mm256_mul_ps(ndmin, _mm256_set1_ps(xb.d)), acc[c]);
          }
        });
      }
      tile.store(a, g, c0);
    }
  };
};

// IQ4_XS: term_j = d·a.d·((ls_j − 32)·Σ v[q]·a.q). Sub-block j's 32 indices are qs words
// 4j..4j+3 in Q4_0's nibble order.
struct IQ4XS {
  static constexpr size_t kScalesH = 2 * R;
  static constexpr size_t kScalesL = kScalesH + 2 * R;
  static constexpr size_t kQs = kScalesL + 4 * R;
  static_assert(kQs + 128 * R == R * sizeof(BlockIQ4_XS));

  template <int C>
  struct Group {
    static void run(const GemmArgs& a, int64_t g, int64_t c0, bool prefetch, const int32_t*) {
      constexpr size_t kRecord = kX8Rows * block_bytes(WeightType::IQ4_XS);
      Tile<C> tile(a, c0);
      auto& [x, acc] = tile;
      const uint8_t* rec = a.w + g * a.w_stride;
      for (int64_t b = 0; b < a.k / block_elements(WeightType::IQ4_XS); ++b, rec += kRecord) {
        if (prefetch) prefetch_ahead(rec, kRecord);
        const __m256 d = load_half(rec);
        const __m256i lo4 = load(rec + kScalesL);
        const __m256i hi2 = _mm256_cvtepu16_epi32(
            _mm_loadu_si128(reinterpret_cast<const __m128i*>(rec + kScalesH)));
        for_each_index<kBlocks>([&](auto j) {
          constexpr int J = decltype(j)::value;
          const __m256i ls = _mm256_sub_epi32(
              _mm256_or_si256(
                  _mm256_and_si256(_mm256_srli_epi32(lo4, 4 * J), _mm256_set1_epi32(0x0f)),
                  _mm256_slli_epi32(
                      _mm256_and_si256(_mm256_srli_epi32(hi2, 2 * J), _mm256_set1_epi32(3)), 4)),
              _mm256_set1_epi32(32));
          const BlockQ8A* xb[C];
          for (int c = 0; c < C; ++c) xb[c] = &x[c][b * kBlocks + J];
          __m256i s[C];
          iq4_sums<C>(rec + kQs + 32 * 4 * J, _mm256_shuffle_epi8(ls, table(kHalfToHalves[0])), xb,
                      s);
          for (int c = 0; c < C; ++c) acc[c] = add_block(acc[c], s[c], d, *xb[c]);
        });
      }
      tile.store(a, g, c0);
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
      return walk<OffsetLevels<Q6KLevels>::Group>(a, activation_sums(a, ActivationSums::Pairs));
    case WeightType::Q3_K:
      return walk<OffsetLevels<Q3KLevels>::Group>(a, activation_sums(a, ActivationSums::Pairs));
    case WeightType::Q2_K:
      return walk<Q2K::Group>(a, activation_sums(a, ActivationSums::Pairs));
    case WeightType::IQ4_XS:
      return walk<IQ4XS::Group>(a, nullptr);
    default:
      return;
  }
}

}  // namespace tokenfab::kernels
