#pragma once
// The walk of the kernels over packed records (the x8 AVX2 kernels, the x8 / x16 AVX-512 VNNI
// ones) over row groups and column tiles. Plain C++: safe to include from a file of any
// instruction set (each kernel instantiates it with its own lambda).

#include <algorithm>
#include <cstdint>

#include "kernels/cpu/gemm.h"

namespace tokenfab::kernels {

template <int C, class Run>
inline void run_tail_tile(Run& run, int64_t g, int64_t c, int64_t n, int tile) {
  if constexpr (C > 0) {
    if (n == C) return run.template operator()<C>(g, c, tile);
    run_tail_tile<C - 1>(run, g, c, n, tile);
  }
}

// run.template operator()<C>(g, c, tile) computes row group g (group_rows rows) against columns
// [c, c + C); `tile` counts the tiles before it over the same group and column chunk (the first
// streams the group's records from memory, so it is the one that prefetches). Columns go in chunks
// of 64 that stay in L2 while every row group passes over them; within a chunk, tiles of kTile
// columns and one tile of whatever is left, so that each record is unpacked once for all the
// tile's columns (a verified draft chain or a few streams are 2–8 columns).
template <int kTile, class Run>
void walk_column_tiles(const GemmArgs& a, int group_rows, Run&& run) {
  constexpr int64_t kColChunk = 64;
  const int64_t groups = a.rows / group_rows;
  for (int64_t cc = 0; cc < a.cols; cc += kColChunk) {
    const int64_t c_end = std::min(a.cols, cc + kColChunk);
    for (int64_t g = 0; g < groups; ++g) {
      int tile = 0;
      int64_t c = cc;
      for (; c + kTile <= c_end; c += kTile) run.template operator()<kTile>(g, c, tile++);
      if (c < c_end) run_tail_tile<kTile - 1>(run, g, c, c_end - c, tile);
    }
  }
}

}  // namespace tokenfab::kernels
