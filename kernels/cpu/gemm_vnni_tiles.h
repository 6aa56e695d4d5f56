#pragma once
// What the two AVX-512 VNNI kernels over packed records share (gemm_x8_avx512.cpp on 8-row
// records, gemm_x16_avx512.cpp on 16-row ones; only those files, compiled with the AVX-512
// flags, include this): the group functions of Q4_0, Q4_1, Q5_0, Q5_1 and Q8_0 over a vector
// width's operations (the other types' are in gemm_vnni_groups.h), and the walk over row groups
// and column tiles (gemm_packed_walk.h) that calls them.

#include <immintrin.h>

#include <cstdint>

#include "kernels/cpu/gemm.h"
#include "kernels/cpu/gemm_packed_walk.h"
#include "kernels/cpu/gemm_vnni_base.h"
#include "kernels/cpu/gemm_vnni_groups.h"

namespace tokenfab::kernels::vnni {

// Q4 (and Q5): 4 loads unpacked into 8 vectors of nibbles (Q5: each with its fifth bits from the
// record's qh' word, one shift and mask per vector); per activation column one dot8, then one FMA
// with the rows' scales and one for the minimums (−8d, −16d, or m), the two sharing one
// accumulator per column.
template <class V, WeightType T, int C>
void group_q4(const GemmArgs& a, int64_t g, int64_t c0, Prefetch prefetch) {
  using I = typename V::I;
  using F = typename V::F;
  constexpr bool kMin = T == WeightType::Q4_1 || T == WeightType::Q5_1;
  constexpr bool kFive = T == WeightType::Q5_0 || T == WeightType::Q5_1;
  constexpr size_t kScales = 2 * V::kRows;  // bytes of one fp16 per row
  constexpr size_t kQh = kMin ? 2 * kScales : kScales;
  constexpr size_t kQs = kFive ? kQh + 4 * V::kRows : kQh;
  static_assert(kQs + 16 * V::kRows == V::kRows * block_bytes(T));
  constexpr size_t kRecord = V::kRows * block_bytes(T);
  Tile<V, C> tile(a, c0);
  auto& [x, acc] = tile;
  const uint8_t* rec = a.w + g * a.w_stride;
  for (int64_t b = 0; b < a.k / block_elements(T); ++b, rec += kRecord) {
    prefetch_records<V>(a, rec, kRecord, prefetch);
    const F d = V::load_half(rec);
    const F m = kMin ? V::load_half(rec + kScales) : V::mul(d, V::set1_f(kFive ? -16.0f : -8.0f));
    I w[8];
    unpack_nibbles<V>(rec + kQs, w);
    if constexpr (kFive) {
      // qh' bit k of each byte: the low nibble's fifth bit of vector k; bit 4 + k: the high's.
      const I qh = V::load(rec + kQh);
      const I fifth = V::set1_i8(0x10);
      for_each_index<4>([&](auto k) {
        constexpr int K = decltype(k)::value;
        w[K] = V::or_(w[K], V::and_(V::template shift16<4 - K>(qh), fifth));
        w[4 + K] = V::or_(w[4 + K], V::and_(V::template shift16<-K>(qh), fifth));
      });
    }
    for (int c = 0; c < C; ++c) {
      const BlockQ8A& xb = x[c][b];
      acc[c] = add_block<V>(acc[c], dot8<V>(V::zero_i(), w, xb.qs), d, xb);
      acc[c] = V::fmadd(m, V::set1_f(xb.s), acc[c]);
    }
  }
  tile.store(a, g, c0);
}

// Q8_0 weights are signed, and vpdpbusd multiplies unsigned by signed bytes: the weights are
// offset to unsigned (w + 128, one xor per record vector) and −128·Σq_a, the offset's share of the
// row sum, is added back per block (`offset`: per column, nb values, activation_sums' Offsets128).
// The result is the exact integer Σ w·q_a, as in the AVX2 kernel.
template <class V, int C>
void group_q8(const GemmArgs& a, int64_t g, int64_t c0, Prefetch prefetch, const int32_t* offset) {
  using I = typename V::I;
  const int64_t nb = a.k / kQK;
  const I flip = V::set1_i8(static_cast<char>(0x80));
  constexpr size_t kRecord = V::kRows * block_bytes(WeightType::Q8_0);
  Tile<V, C> tile(a, c0);
  auto& [x, acc] = tile;
  const uint8_t* rec = a.w + g * a.w_stride;
  for (int64_t b = 0; b < a.k / block_elements(WeightType::Q8_0); ++b, rec += kRecord) {
    prefetch_records<V>(a, rec, kRecord, prefetch);
    const typename V::F d = V::load_half(rec);
    I w[8];  // vector k: elements 4k..4k+3 of each row, plus 128
    for (int k = 0; k < 8; ++k)
      w[k] = V::xor_(V::load(rec + 2 * V::kRows + 4 * V::kRows * k), flip);
    for (int c = 0; c < C; ++c) {
      const I start = V::set1_i32(offset[(c0 + c) * nb + b]);
      acc[c] = add_block<V>(acc[c], dot8<V>(start, w, x[c][b].qs), d, x[c][b]);
    }
  }
  tile.store(a, g, c0);
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

// Group<T, C>::run(a, g, c0, prefetch, offset) computes row group g (group_rows rows) against
// columns [c0, c0 + C). Tiles of 8 columns (walk_column_tiles; the 32 vector registers hold a
// tile's 8 weight vectors and 8 accumulators): the first over a row group prefetches ahead of its
// records, the second the next group's.
template <WeightType T, template <WeightType, int> class Group>
void run_tiles(const GemmArgs& a, int group_rows) {
  const int32_t* offset = nullptr;
  if constexpr (kSums<T> == 1) offset = activation_sums(a, ActivationSums::Offsets128);
  if constexpr (kSums<T> == 2) offset = activation_sums(a, ActivationSums::Pairs);
  walk_column_tiles<8>(a, group_rows, [&]<int C>(int64_t g, int64_t c0, int tile) {
    const Prefetch mode = tile == 0   ? Prefetch::Ahead
                          : tile == 1 ? Prefetch::NextGroup
                                      : Prefetch::None;
    Group<T, C>::run(a, g, c0, mode, offset);
  });
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
