#pragma once
// What the two AVX-512 VNNI kernels over packed records share (gemm_x8_avx512.cpp on 8-row
// records, gemm_x16_avx512.cpp on 16-row ones; only those files, compiled with the AVX-512
// flags, include this): record prefetches, Q8_0's offsets, the group functions over a vector
// width's operations, and the walk over row groups and column tiles that calls them.

#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "kernels/cpu/gemm.h"

namespace tokenfab::kernels::vnni {

// The first tile over a row group streams its records from memory and prefetches ahead of them;
// where a row group has more tiles, the second one prefetches the next group's records instead,
// so that the first tile of every group finds them in cache and the stream from memory spreads
// over the whole group's work.
enum class Prefetch { None, Ahead, NextGroup };

inline void prefetch_record(const uint8_t* rec, size_t bytes) {
  for (size_t line = 0; line < bytes; line += 64)
    _mm_prefetch(reinterpret_cast<const char*>(rec + line), _MM_HINT_T0);
}

// Four activation bytes, read by vpdpbusd's embedded broadcast.
using Bytes4 = int32_t __attribute__((may_alias, aligned(1)));

// offset[b] = −128 · Σ q of block b: Q8_0's weights are offset by +128 to unsigned bytes, and
// this is the offset's share of a row's block sum.
inline void q8a_offsets(const BlockQ8A* x, int64_t nb, int32_t* offset) {
  for (int64_t b = 0; b < nb; ++b) {
    int32_t sum = 0;
    for (int i = 0; i < kQK; ++i) sum += x[b].qs[i];
    offset[b] = -128 * sum;
  }
}

// The group functions of both kernels, written once over a vector width's operations V (a struct
// in each kernel's file): V::I and V::F its integer and float vectors, V::kRows the rows of a
// record (one per 32-bit lane), V::kPrefetchBytes how far ahead the first tile over a row group
// prefetches its records, and dpbusd_bcast (vpdpbusd with the four activation bytes at p
// broadcast to every lane from memory), load / load_half (record bytes; fp16 scales to floats)
// and the plain lane-wise operations below. A record is, per row, its fp16 d (and Q4_1's m), then
// its quants as vectors of four bytes of every row.
//
// The activation blocks of columns c0 … c0 + C − 1. (The group functions spell their record
// prefetches out: GCC 12 at -O3 dropped every prefetch of a helper function holding them, whose
// only effect they are.)
template <int C>
inline void column_blocks(const GemmArgs& a, int64_t c0, const BlockQ8A* (&x)[C]) {
  for (int c = 0; c < C; ++c) x[c] = reinterpret_cast<const BlockQ8A*>(a.x + (c0 + c) * a.x_stride);
}

// Q4: 4 loads unpacked into 8 vectors of nibbles; per activation column, 8 vpdpbusd in two chains
// of four (so a column's block is not one 8-deep dependency), then one FMA with the rows' scales
// and one for the minimums, the two sharing one accumulator per column.
template <class V, WeightType T, int C>
void group_q4(const GemmArgs& a, int64_t g, int64_t c0, Prefetch prefetch) {
  using I = typename V::I;
  using F = typename V::F;
  constexpr size_t kScales = 2 * V::kRows;  // bytes of one fp16 per row
  constexpr size_t kQsOffset = T == WeightType::Q4_1 ? 2 * kScales : kScales;
  constexpr size_t kRecord = kQsOffset + 16 * V::kRows;
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
    const F m = T == WeightType::Q4_1 ? V::load_half(rec + kScales) : V::mul(d, V::set1_f(-8.0f));
    I w[8];  // w[2k]: low nibbles of vector k (elements 4k..4k+3), w[2k + 1]: high (16+4k..)
    for (int k = 0; k < 4; ++k) {
      const I p = V::load(rec + kQsOffset + kVector * k);
      w[2 * k] = V::and_(p, mask);
      w[2 * k + 1] = V::and_(V::srli16_4(p), mask);
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
// row sum, is added back per block (`offset`: per column, nb values, from q8a_offsets). The
// result is the exact integer Σ w·q_a, as in the AVX2 kernel.
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

// The group function for weight type T over V's records.
template <class V, WeightType T, int C>
void group(const GemmArgs& a, int64_t g, int64_t c0, Prefetch prefetch, const int32_t* offset) {
  if constexpr (T == WeightType::Q8_0) {
    group_q8<V, C>(a, g, c0, prefetch, offset);
  } else {
    group_q4<V, T, C>(a, g, c0, prefetch);
  }
}

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
  thread_local std::vector<int32_t> offsets;  // Q8_0's, per calling thread; never shrinks
  const int32_t* offset = nullptr;
  if constexpr (T == WeightType::Q8_0) {
    const int64_t nb = a.k / kQK;
    if (offsets.size() < static_cast<size_t>(a.cols * nb)) offsets.resize(a.cols * nb);
    for (int64_t c = 0; c < a.cols; ++c)
      q8a_offsets(reinterpret_cast<const BlockQ8A*>(a.x + c * a.x_stride), nb,
                  offsets.data() + c * nb);
    offset = offsets.data();
  }
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
    default:
      return;
  }
}

}  // namespace tokenfab::kernels::vnni
