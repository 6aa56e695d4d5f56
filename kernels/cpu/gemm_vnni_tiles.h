#pragma once
// What the two AVX-512 VNNI kernels over packed records share (gemm_x8_avx512.cpp on 8-row
// records, gemm_x16_avx512.cpp on 16-row ones; only those files, compiled with the AVX-512
// flags, include this): record prefetches, Q8_0's offsets, and the walk over row groups and
// column tiles that calls a kernel's group function.

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
// must have different names: instantiations of these templates are merged across the two files
// by their mangled names, which do not tell two anonymous namespaces apart.
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
