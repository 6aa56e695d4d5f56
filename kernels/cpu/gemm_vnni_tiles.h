#pragma once
// What the two AVX-512 VNNI kernels over packed records share (gemm_x8_avx512.cpp on 8-row
// records, gemm_x16_avx512.cpp on 16-row ones; only those files, compiled with the AVX-512
// flags, include this): the group functions of Q4_0, Q4_1, Q5_0, Q5_1 and Q8_0 over a vector
// width's operations (the other types' are in gemm_vnni_groups.h), and the walk over row groups
// and column tiles that calls them.

#include <immintrin.h>

#include <algorithm>
#include <cstdint>

#include "kernels/cpu/gemm.h"
#include "kernels/cpu/gemm_vnni_base.h"
#include "kernels/cpu/gemm_vnni_groups.h"

namespace tokenfab::kernels::vnni {

// Q4 (and Q5): 4 loads unpacked into 8 vectors of nibbles (Q5: each with its fifth bits from the
// record's qh' word, one shift and mask per vector); per activation column, 8 vpdpbusd in two
// chains of four (so a column's block is not one 8-deep dependency), then one FMA with the rows'
// scales and one for the minimums (−8d, −16d, or m), the two sharing one accumulator per column.
template <class V, WeightType T, int C>
void group_q4(const GemmArgs& a, int64_t g, int64_t c0, Prefetch prefetch) {
  using I = typename V::I;
  using F = typename V::F;
  constexpr bool kMin = T == WeightType::Q4_1 || T == WeightType::Q5_1;
  constexpr bool kFive = T == WeightType::Q5_0 || T == WeightType::Q5_1;
  constexpr size_t kScales = 2 * V::kRows;  // bytes of one fp16 per row
  constexpr size_t kQh = kMin ? 2 * kScales : kScales;
  constexpr size_t kQsOffset = kFive ? kQh + 4 * V::kRows : kQh;
  constexpr size_t kRecord = kQsOffset + 16 * V::kRows;
  static_assert(kRecord == V::kRows * block_bytes(T));
  constexpr size_t kVector = 4 * V::kRows;
  const int64_t nb = a.k / kQK;
  const uint8_t* rec = a.w + g * a.w_stride;
  const BlockQ8A* x[C];
  column_blocks<C>(a, c0, x);
  F acc[C];
  for (int c = 0; c < C; ++c) acc[c] = V::zero_f();
  const I mask = V::set1_i8(0x0f);
  for (int64_t b = 0; b < nb; ++b, rec += kRecord) {
    if (prefetch == Prefetch::Ahead) prefetch_record(rec + V::kPrefetchBytes, kRecord);
    if (prefetch == Prefetch::NextGroup) prefetch_record(rec + a.w_stride, kRecord);
    const F d = V::load_half(rec);
    const F m = kMin ? V::load_half(rec + kScales) : V::mul(d, V::set1_f(kFive ? -16.0f : -8.0f));
    I w[8];  // w[2k]: low nibbles of vector k (elements 4k..4k+3), w[2k + 1]: high (16+4k..)
    for (int k = 0; k < 4; ++k) {
      const I p = V::load(rec + kQsOffset + kVector * k);
      w[2 * k] = V::and_(p, mask);
      w[2 * k + 1] = V::and_(V::srli16_4(p), mask);
    }
    if constexpr (kFive) {
      // qh' bit k of each byte: the low nibble's fifth bit of vector k; bit 4 + k: the high's.
      const I qh = V::load(rec + kQh);
      const I fifth = V::set1_i8(0x10);
      for_each_index<4>([&](auto k) {
        constexpr int K = decltype(k)::value;
        w[2 * K] = V::or_(w[2 * K], V::and_(V::template shift16<4 - K>(qh), fifth));
        w[2 * K + 1] = V::or_(w[2 * K + 1], V::and_(V::template shift16<-K>(qh), fifth));
      });
    }
    for (int c = 0; c < C; ++c) {
      const BlockQ8A& xb = x[c][b];
      I lo = V::dpbusd_bcast(V::zero_i(), w[0], xb.qs);
      I hi = V::dpbusd_bcast(V::zero_i(), w[1], xb.qs + 16);
      for (int k = 1; k < 4; ++k) {
        lo = V::dpbusd_bcast(lo, w[2 * k], xb.qs + 4 * k);
        hi = V::dpbusd_bcast(hi, w[2 * k + 1], xb.qs + 16 + 4 * k);
      }
      const F sum = V::to_f(V::add_i32(lo, hi));
      acc[c] = V::fmadd(sum, V::mul(d, V::set1_f(xb.d)), acc[c]);
      acc[c] = V::fmadd(m, V::set1_f(xb.s), acc[c]);
    }
  }
  for (int c = 0; c < C; ++c) V::store(a.y + (c0 + c) * a.ldy + g * V::kRows, acc[c]);
}

// Q8_0 weights are signed, and vpdpbusd multiplies unsigned by signed bytes: the weights are
// offset to unsigned (w + 128, one xor per record vector) and −128·Σq_a, the offset's share of the
// row sum, is added back per block (`offset`: per column, nb values, activation_sums' Offsets128).
// The result is the exact integer Σ w·q_a, as in the AVX2 kernel.
template <class V, int C>
void group_q8(const GemmArgs& a, int64_t g, int64_t c0, Prefetch prefetch, const int32_t* offset) {
  using I = typename V::I;
  using F = typename V::F;
  constexpr size_t kQsOffset = 2 * V::kRows;
  constexpr size_t kRecord = kQsOffset + 32 * V::kRows;
  constexpr size_t kVector = 4 * V::kRows;
  const int64_t nb = a.k / kQK;
  const uint8_t* rec = a.w + g * a.w_stride;
  const BlockQ8A* x[C];
  column_blocks<C>(a, c0, x);
  F acc[C];
  for (int c = 0; c < C; ++c) acc[c] = V::zero_f();
  const I flip = V::set1_i8(static_cast<char>(0x80));
  for (int64_t b = 0; b < nb; ++b, rec += kRecord) {
    if (prefetch == Prefetch::Ahead) prefetch_record(rec + V::kPrefetchBytes, kRecord);
    if (prefetch == Prefetch::NextGroup) prefetch_record(rec + a.w_stride, kRecord);
    const F d = V::load_half(rec);
    I w[8];  // vector k: elements 4k..4k+3 of each row, plus 128
    for (int k = 0; k < 8; ++k) w[k] = V::xor_(V::load(rec + kQsOffset + kVector * k), flip);
    for (int c = 0; c < C; ++c) {
      const BlockQ8A& xb = x[c][b];
      I lo = V::set1_i32(offset[(c0 + c) * nb + b]);
      I hi = V::dpbusd_bcast(V::zero_i(), w[1], xb.qs + 4);
      lo = V::dpbusd_bcast(lo, w[0], xb.qs);
      for (int k = 2; k < 8; k += 2) {
        lo = V::dpbusd_bcast(lo, w[k], xb.qs + 4 * k);
        hi = V::dpbusd_bcast(hi, w[k + 1], xb.qs + 4 * k + 4);
      }
      const F sum = V::to_f(V::add_i32(lo, hi));
      acc[c] = V::fmadd(sum, V::mul(d, V::set1_f(xb.d)), acc[c]);
    }
  }
  for (int c = 0; c < C; ++c) V::store(a.y + (c0 + c) * a.ldy + g * V::kRows, acc[c]);
}

// The group function for weight type T over V's records. `sums`: activation_sums' values for
// the type (kSums), or null.
template <class V, WeightType T, int C>
void group(const GemmArgs& a, int64_t g, int64_t c0, Prefetch prefetch, const int32_t* sums) {
  if constexpr (T == WeightType::Q8_0) {
    group_q8<V, C>(a, g, c0, prefetch, sums);
  } else if constexpr (T == WeightType::Q4_0 || T == WeightType::Q4_1 || T == WeightType::Q5_0 ||
                       T == WeightType::Q5_1) {
    group_q4<V, T, C>(a, g, c0, prefetch);
  } else if constexpr (T == WeightType::IQ4_NL) {
    group_iq4nl<V, C>(a, g, c0, prefetch, sums);
  } else if constexpr (T == WeightType::Q4_K || T == WeightType::Q5_K) {
    group_k4<V, T, C>(a, g, c0, prefetch);
  } else if constexpr (T == WeightType::Q6_K) {
    group_q6k<V, C>(a, g, c0, prefetch, sums);
  } else if constexpr (T == WeightType::Q3_K) {
    group_q3k<V, C>(a, g, c0, prefetch, sums);
  } else if constexpr (T == WeightType::Q2_K) {
    group_q2k<V, C>(a, g, c0, prefetch, sums);
  } else {
    static_assert(T == WeightType::IQ4_XS);
    group_iq4xs<V, C>(a, g, c0, prefetch, sums);
  }
}

// The activation sums a type's group function reads (gemm.h), if any.
template <WeightType T>
inline constexpr int kSums =
    T == WeightType::Q8_0 || T == WeightType::IQ4_NL || T == WeightType::IQ4_XS ? 1  // Offsets128
    : T == WeightType::Q6_K || T == WeightType::Q3_K || T == WeightType::Q2_K   ? 2  // Pairs
                                                                                : 0;

// Group<T, C>::run(a, g, c0, prefetch, offset) computes row group g against columns
// [c0, c0 + C). Columns go in chunks of 64 that stay in L2 while every row group passes over
// them; within a chunk, tiles of 8 columns (the 32 vector registers hold a tile's 8 weight
// vectors and 8 accumulators) and one tile of whatever is left, so that a verified draft chain or
// a few streams (2–8 columns) unpack each record once. run_tiles' `group_rows`: rows per group.
template <WeightType T, template <WeightType, int> class Group, int C>
void tail_tile(const GemmArgs& a, int64_t g, int64_t c, int64_t n, Prefetch prefetch,
               const int32_t* offset) {
  if constexpr (C > 0) {
    if (n == C) return Group<T, C>::run(a, g, c, prefetch, offset);
    tail_tile<T, Group, C - 1>(a, g, c, n, prefetch, offset);
  }
}

template <WeightType T, template <WeightType, int> class Group>
void run_tiles(const GemmArgs& a, int group_rows) {
  const int32_t* offset = nullptr;
  if constexpr (kSums<T> == 1) offset = activation_sums(a, ActivationSums::Offsets128);
  if constexpr (kSums<T> == 2) offset = activation_sums(a, ActivationSums::Pairs);
  constexpr int64_t kColChunk = 64;
  constexpr int kTile = 8;
  const int64_t groups = a.rows / group_rows;
  for (int64_t cc = 0; cc < a.cols; cc += kColChunk) {
    const int64_t c_end = std::min(a.cols, cc + kColChunk);
    for (int64_t g = 0; g < groups; ++g) {
      int tile = 0;
      const auto mode = [&] {
        const int t = tile++;
        return t == 0 ? Prefetch::Ahead : t == 1 ? Prefetch::NextGroup : Prefetch::None;
      };
      int64_t c = cc;
      for (; c + kTile <= c_end; c += kTile) Group<T, kTile>::run(a, g, c, mode(), offset);
      if (c < c_end) tail_tile<T, Group, kTile - 1>(a, g, c, c_end - c, mode(), offset);
    }
  }
}

// gemm_x8_vnni / gemm_x16_vnni: run_tiles for the weight type. The two kernels' Group templates
// and vector structs must have different names: instantiations of these templates are merged
// across the two files by their mangled names, which do not tell two anonymous namespaces apart.
template <template <WeightType, int> class Group>
void run_typed(const GemmArgs& a, int group_rows) {
  switch (a.type) {
    case WeightType::Q4_0:
      return run_tiles<WeightType::Q4_0, Group>(a, group_rows);
    case WeightType::Q4_1:
      return run_tiles<WeightType::Q4_1, Group>(a, group_rows);
    case WeightType::Q8_0:
      return run_tiles<WeightType::Q8_0, Group>(a, group_rows);
    case WeightType::Q5_0:
      return run_tiles<WeightType::Q5_0, Group>(a, group_rows);
    case WeightType::Q5_1:
      return run_tiles<WeightType::Q5_1, Group>(a, group_rows);
    case WeightType::IQ4_NL:
      return run_tiles<WeightType::IQ4_NL, Group>(a, group_rows);
    case WeightType::Q2_K:
      return run_tiles<WeightType::Q2_K, Group>(a, group_rows);
    case WeightType::Q3_K:
      return run_tiles<WeightType::Q3_K, Group>(a, group_rows);
    case WeightType::Q4_K:
      return run_tiles<WeightType::Q4_K, Group>(a, group_rows);
    case WeightType::Q5_K:
      return run_tiles<WeightType::Q5_K, Group>(a, group_rows);
    case WeightType::Q6_K:
      return run_tiles<WeightType::Q6_K, Group>(a, group_rows);
    case WeightType::IQ4_XS:
      return run_tiles<WeightType::IQ4_XS, Group>(a, group_rows);
    default:
      return;
  }
}

}  // namespace tokenfab::kernels::vnni
