#pragma once
// The AVX-512 VNNI group functions of IQ4_NL and the super-block types (Q4_K, Q5_K, Q6_K, Q3_K,
// Q2_K, IQ4_XS), over a vector width's operations V (gemm_vnni_base.h; only files compiled with
// the AVX-512 flags include this). Each is its AVX2 x8 kernel (gemm_x8_q5_avx2.cpp,
// gemm_x8_kquants_avx2.cpp) with vpdpbusd for the integer sums: the same record unpacking, the
// same exact 32-bit integers per row and Q8A block j — formed here as vpdpbusd chains over the
// levels (unsigned; signed values offset by +128, whose share −128·Σq is the chain's start), then
// each sub-block's sum times its scale (vpmulld) — and the same float operations in the same
// order, so the results equal the AVX2 kernels' bit for bit. Records: repack.h. In every group
// function w[v] holds the levels that meet activation bytes 4v..4v+3 of the Q8A block (dot8).

#include <immintrin.h>

#include <cstdint>

#include "kernels/cpu/gemm.h"
#include "kernels/cpu/gemm_vnni_base.h"
#include "kernels/cpu/gemm_x8_tables.h"

namespace tokenfab::kernels::vnni {

// IQ4_NL and IQ4_XS: the four record vectors at qs, their nibbles looked up in the value table
// offset to unsigned bytes (w as unpack_nibbles').
template <class V>
inline void unpack_iq4(const uint8_t* qs, typename V::I* w) {
  const typename V::I values = V::table(x8tables::kIQ4Unsigned);
  unpack_nibbles<V>(qs, w);
  for (int v = 0; v < 8; ++v) w[v] = V::shuffle_i8(values, w[v]);
}

// IQ4_NL: per column one block sum from the offset's share on (gemm_x8_q5_avx2.cpp's kernel forms
// the same integer with the sign trick).
template <class V, int C>
void group_iq4nl(const GemmArgs& a, int64_t g, int64_t c0, Prefetch prefetch,
                 const int32_t* offset) {
  using I = typename V::I;
  const int64_t nb = a.k / kQK;
  constexpr size_t kRecord = V::kRows * block_bytes(WeightType::IQ4_NL);
  Tile<V, C> tile(a, c0);
  auto& [x, acc] = tile;
  const uint8_t* rec = a.w + g * a.w_stride;
  for (int64_t b = 0; b < a.k / block_elements(WeightType::IQ4_NL); ++b, rec += kRecord) {
    prefetch_records<V>(a, rec, kRecord, prefetch);
    const typename V::F d = V::load_half(rec);
    I w[8];
    unpack_iq4<V>(rec + 2 * V::kRows, w);
    for (int c = 0; c < C; ++c) {
      const I start = V::set1_i32(offset[(c0 + c) * nb + b]);
      acc[c] = add_block<V>(acc[c], dot8<V>(start, w, x[c][b].qs), d, x[c][b]);
    }
  }
  tile.store(a, g, c0);
}

// Q4_K, Q5_K: per block j, 8 vectors of levels; per column one dot8, times sc_j (vpmulld), then
// the FMA with d·a.d and the one with −dmin·m_j times a.s.
template <class V, WeightType T, int C>
void group_k4(const GemmArgs& a, int64_t g, int64_t c0, Prefetch prefetch) {
  using I = typename V::I;
  using F = typename V::F;
  constexpr int R = V::kRows;
  constexpr bool kFive = T == WeightType::Q5_K;
  constexpr size_t kScales = 4 * R;
  constexpr size_t kQh = kScales + 12 * R;
  constexpr size_t kQs = kQh + (kFive ? 32 * R : 0);
  static_assert(kQs + 128 * R == R * block_bytes(T));
  const I low4 = V::set1_i8(0x0f), low6 = V::set1_i8(0x3f), low2 = V::set1_i8(3);
  constexpr size_t kRecord = V::kRows * block_bytes(T);
  Tile<V, C> tile(a, c0);
  auto& [x, acc] = tile;
  const uint8_t* rec = a.w + g * a.w_stride;
  for (int64_t b = 0; b < a.k / block_elements(T); ++b, rec += kRecord) {
    prefetch_records<V>(a, rec, kRecord, prefetch);
    const F d = V::load_half(rec);
    const F ndmin = V::mul(V::load_half(rec + 2 * R), V::set1_f(-1.0f));
    // Six-bit scales and mins of the 8 sub-blocks: sc[h], m[h] hold sub-blocks 4h..4h+3 in bytes
    // 0..3 of each row's lane (get_scale_min_k4).
    const I w0 = V::load(rec + kScales), w1 = V::load(rec + kScales + 4 * R);
    const I w2 = V::load(rec + kScales + 8 * R);
    const I sc[2] = {
        V::and_(w0, low6),
        V::or_(V::and_(w2, low4), V::template slli32<4>(V::and_(V::template srli32<6>(w0), low2)))};
    const I m[2] = {V::and_(w1, low6),
                    V::or_(V::and_(V::template srli32<4>(w2), low4),
                           V::template slli32<4>(V::and_(V::template srli32<6>(w1), low2)))};
    for_each_index<8>([&](auto j) {
      constexpr int J = decltype(j)::value;
      const I scale = V::shuffle_i8(sc[J / 4], V::table(x8tables::kByteToLane[J % 4]));
      const F bias =
          V::mul(ndmin, V::to_f(V::shuffle_i8(m[J / 4], V::table(x8tables::kByteToLane[J % 4]))));
      I w[8];
      for (int v = 0; v < 8; ++v) {
        const I p = V::load(rec + kQs + 4 * R * (8 * (J / 2) + v));
        w[v] = V::and_(J % 2 ? V::srli16_4(p) : p, low4);
        if constexpr (kFive)
          w[v] = V::or_(w[v], V::and_(V::template shift16<4 - J>(V::load(rec + kQh + 4 * R * v)),
                                      V::set1_i8(0x10)));
      }
      for (int c = 0; c < C; ++c) {
        const BlockQ8A& xb = x[c][b * 8 + J];
        acc[c] = add_block<V>(acc[c], V::mullo_i32(dot8<V>(V::zero_i(), w, xb.qs), scale), d, xb);
        acc[c] = V::fmadd(bias, V::set1_f(xb.s), acc[c]);
      }
    });
  }
  tile.store(a, g, c0);
}

// Q6_K, Q3_K: block j's integer for column c, its levels' offset taken off: the two halves' sums
// times their scales, less Σ_t off_t·Σ_t a.q (one vpmaddwd of the rows' int16 pairs of offset ×
// scale with the column's pair sums). (The two stay two functions rather than one over a decoder
// of their blocks, as gemm_x8_kquants_avx2.cpp has: written so, this code ran Q3_K on x16 records
// 7–10 % slower.)
template <class V>
[[gnu::always_inline]] inline typename V::I offset_block_sum(const typename V::I* w,
                                                             const int8_t* q, typename V::I sca,
                                                             typename V::I scb, typename V::I off,
                                                             int32_t pair_sums) {
  return V::sub_i32(scaled_halves<V>(w, q, sca, scb), V::madd_i16(off, V::set1_i32(pair_sums)));
}

// Q6_K: per block j, the two 16-element halves in their own chains, each times its scale, less
// 32·Σ_t sc_t·Σ_t a.q.
template <class V, int C>
void group_q6k(const GemmArgs& a, int64_t g, int64_t c0, Prefetch prefetch, const int32_t* sums) {
  using I = typename V::I;
  constexpr int R = V::kRows;
  constexpr size_t kScales = 2 * R;
  constexpr size_t kQl = kScales + 16 * R;
  constexpr size_t kQh = kQl + 128 * R;
  static_assert(kQh + 64 * R == R * sizeof(BlockQ6_K));
  const int64_t nq = a.k / kQK;
  const I low4 = V::set1_i8(0x0f), bits45 = V::set1_i8(0x30);
  constexpr size_t kRecord = V::kRows * block_bytes(WeightType::Q6_K);
  Tile<V, C> tile(a, c0);
  auto& [x, acc] = tile;
  const uint8_t* rec = a.w + g * a.w_stride;
  for (int64_t b = 0; b < a.k / block_elements(WeightType::Q6_K); ++b, rec += kRecord) {
    prefetch_records<V>(a, rec, kRecord, prefetch);
    const typename V::F d = V::load_half(rec);
    for_each_index<8>([&](auto j) {
      constexpr int J = decltype(j)::value, H = J / 4, K = J % 4;
      const I scab = V::cvt_i8_i16(rec + kScales + 2 * R * J);  // [sc_2j, sc_2j+1] per row
      const I sca = V::template srai32<16>(V::template slli32<16>(scab));
      const I scb = V::template srai32<16>(scab);
      const I off = V::template shift16<5>(scab);
      I w[8];
      for (int v = 0; v < 8; ++v) {
        const I lo = V::load(rec + kQl + 4 * R * (8 * (2 * H + K % 2) + v));
        const I hi = V::load(rec + kQh + 4 * R * (8 * H + v));
        w[v] = V::or_(V::and_(K / 2 ? V::srli16_4(lo) : lo, low4),
                      V::and_(V::template shift16<4 - 2 * K>(hi), bits45));
      }
      for (int c = 0; c < C; ++c) {
        const BlockQ8A& xb = x[c][b * 8 + J];
        const int32_t pairs = sums[(c0 + c) * nq + b * 8 + J];
        acc[c] = add_block<V>(acc[c], offset_block_sum<V>(w, xb.qs, sca, scb, off, pairs), d, xb);
      }
    });
  }
  tile.store(a, g, c0);
}

// Q3_K: as Q6_K with levels 0..7 (offset 4) and the scales (less 32) decoded per record.
template <class V, int C>
void group_q3k(const GemmArgs& a, int64_t g, int64_t c0, Prefetch prefetch, const int32_t* sums) {
  using I = typename V::I;
  constexpr int R = V::kRows;
  constexpr size_t kScales = 2 * R;
  constexpr size_t kHmask = kScales + 12 * R;
  constexpr size_t kQs = kHmask + 32 * R;
  static_assert(kQs + 64 * R == R * sizeof(BlockQ3_K));
  const int64_t nq = a.k / kQK;
  const I low4 = V::set1_i8(0x0f), low2 = V::set1_i8(3);
  constexpr size_t kRecord = V::kRows * block_bytes(WeightType::Q3_K);
  Tile<V, C> tile(a, c0);
  auto& [x, acc] = tile;
  const uint8_t* rec = a.w + g * a.w_stride;
  for (int64_t b = 0; b < a.k / block_elements(WeightType::Q3_K); ++b, rec += kRecord) {
    prefetch_records<V>(a, rec, kRecord, prefetch);
    const typename V::F d = V::load_half(rec);
    const I w0 = V::load(rec + kScales), w1 = V::load(rec + kScales + 4 * R);
    const I w2 = V::load(rec + kScales + 8 * R);
    // s[i]: sub-blocks 4i..4i+3, less 32, in bytes 0..3 of each row's lane.
    const I thirty_two = V::set1_i8(32);
    const I s[4] = {
        V::sub_i8(V::or_(V::and_(w0, low4), V::template slli32<4>(V::and_(w2, low2))), thirty_two),
        V::sub_i8(V::or_(V::and_(w1, low4),
                         V::template slli32<4>(V::and_(V::template srli32<2>(w2), low2))),
                  thirty_two),
        V::sub_i8(V::or_(V::and_(V::template srli32<4>(w0), low4),
                         V::template slli32<4>(V::and_(V::template srli32<4>(w2), low2))),
                  thirty_two),
        V::sub_i8(V::or_(V::and_(V::template srli32<4>(w1), low4),
                         V::template slli32<4>(V::and_(V::template srli32<6>(w2), low2))),
                  thirty_two)};
    for_each_index<8>([&](auto j) {
      constexpr int J = decltype(j)::value, H = J / 4, K = J % 4;
      const I sb = s[J / 2];
      const I sca = V::template srai32<24>(
          V::shuffle_i8(sb, V::table(x8tables::kByteToLaneTop[2 * (J % 2)])));
      const I scb = V::template srai32<24>(
          V::shuffle_i8(sb, V::table(x8tables::kByteToLaneTop[2 * (J % 2) + 1])));
      const I scab =
          V::template srai16<8>(V::shuffle_i8(sb, V::table(x8tables::kBytePairToHalvesTop[J % 2])));
      const I off = V::template shift16<2>(scab);
      I w[8];
      for (int v = 0; v < 8; ++v) {
        const I lo =
            V::and_(V::template shift16<-2 * K>(V::load(rec + kQs + 4 * R * (8 * H + v))), low2);
        w[v] = V::or_(lo, V::and_(V::template shift16<2 - J>(V::load(rec + kHmask + 4 * R * v)),
                                  V::set1_i8(4)));
      }
      for (int c = 0; c < C; ++c) {
        const BlockQ8A& xb = x[c][b * 8 + J];
        const int32_t pairs = sums[(c0 + c) * nq + b * 8 + J];
        acc[c] = add_block<V>(acc[c], offset_block_sum<V>(w, xb.qs, sca, scb, off, pairs), d, xb);
      }
    });
  }
  tile.store(a, g, c0);
}

// Q2_K: the two halves' chains times their 4-bit scales; the minimums' integer Σ_t m_t·Σ_t a.q
// is one vpmaddwd of the rows' min pairs with the column's pair sums, then its own FMA with
// −dmin·a.d.
template <class V, int C>
void group_q2k(const GemmArgs& a, int64_t g, int64_t c0, Prefetch prefetch, const int32_t* sums) {
  using I = typename V::I;
  using F = typename V::F;
  constexpr int R = V::kRows;
  constexpr size_t kScales = 4 * R;
  constexpr size_t kQs = kScales + 16 * R;
  static_assert(kQs + 64 * R == R * sizeof(BlockQ2_K));
  const int64_t nq = a.k / kQK;
  const I low2 = V::set1_i8(3), low4_32 = V::set1_i32(0x0f);
  constexpr size_t kRecord = V::kRows * block_bytes(WeightType::Q2_K);
  Tile<V, C> tile(a, c0);
  auto& [x, acc] = tile;
  const uint8_t* rec = a.w + g * a.w_stride;
  for (int64_t b = 0; b < a.k / block_elements(WeightType::Q2_K); ++b, rec += kRecord) {
    prefetch_records<V>(a, rec, kRecord, prefetch);
    const F d = V::load_half(rec);
    const F ndmin = V::mul(V::load_half(rec + 2 * R), V::set1_f(-1.0f));
    for_each_index<8>([&](auto j) {
      constexpr int J = decltype(j)::value, H = J / 4, K = J % 4;
      const I raw = V::cvt_u8_i16(rec + kScales + 2 * R * J);  // the two scale bytes per row
      const I sca = V::and_(raw, low4_32);
      const I scb = V::and_(V::template srli32<16>(raw), low4_32);
      const I mins = V::template shift16<-4>(raw);
      I w[8];
      for (int v = 0; v < 8; ++v)
        w[v] = V::and_(V::template shift16<-2 * K>(V::load(rec + kQs + 4 * R * (8 * H + v))), low2);
      for (int c = 0; c < C; ++c) {
        const BlockQ8A& xb = x[c][b * 8 + J];
        const I imin = V::madd_i16(mins, V::set1_i32(sums[(c0 + c) * nq + b * 8 + J]));
        acc[c] = add_block<V>(acc[c], scaled_halves<V>(w, xb.qs, sca, scb), d, xb);
        acc[c] = V::fmadd(V::to_f(imin), V::mul(ndmin, V::set1_f(xb.d)), acc[c]);
      }
    });
  }
  tile.store(a, g, c0);
}

// IQ4_XS: per sub-block j, IQ4_NL's dot8 (from the offset's share) times ls_j − 32.
template <class V, int C>
void group_iq4xs(const GemmArgs& a, int64_t g, int64_t c0, Prefetch prefetch,
                 const int32_t* offset) {
  using I = typename V::I;
  constexpr int R = V::kRows;
  constexpr size_t kScalesH = 2 * R;
  constexpr size_t kScalesL = kScalesH + 2 * R;
  constexpr size_t kQs = kScalesL + 4 * R;
  static_assert(kQs + 128 * R == R * sizeof(BlockIQ4_XS));
  const int64_t nq = a.k / kQK;
  constexpr size_t kRecord = V::kRows * block_bytes(WeightType::IQ4_XS);
  Tile<V, C> tile(a, c0);
  auto& [x, acc] = tile;
  const uint8_t* rec = a.w + g * a.w_stride;
  for (int64_t b = 0; b < a.k / block_elements(WeightType::IQ4_XS); ++b, rec += kRecord) {
    prefetch_records<V>(a, rec, kRecord, prefetch);
    const typename V::F d = V::load_half(rec);
    const I lo4 = V::load(rec + kScalesL);
    const I hi2 = V::cvt_u16_i32(rec + kScalesH);
    for_each_index<8>([&](auto j) {
      constexpr int J = decltype(j)::value;
      const I ls = V::sub_i32(
          V::or_(V::and_(V::template srli32<4 * J>(lo4), V::set1_i32(0x0f)),
                 V::template slli32<4>(V::and_(V::template srli32<2 * J>(hi2), V::set1_i32(3)))),
          V::set1_i32(32));
      I w[8];
      unpack_iq4<V>(rec + kQs + 16 * R * J, w);
      for (int c = 0; c < C; ++c) {
        const BlockQ8A& xb = x[c][b * 8 + J];
        const I start = V::set1_i32(offset[(c0 + c) * nq + b * 8 + J]);
        acc[c] = add_block<V>(acc[c], V::mullo_i32(dot8<V>(start, w, xb.qs), ls), d, xb);
      }
    });
  }
  tile.store(a, g, c0);
}

}  // namespace tokenfab::kernels::vnni
