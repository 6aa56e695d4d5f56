#pragma once
// What the AVX2 tile kernels on the GGUF layout share (gemm_avx2.cpp for the 32-element and float
// types, gemm_kquants_avx2.cpp for the super-block types; include only from files compiled with
// the AVX2 flags): a quantized tile's accumulators and row / column pointers, and the walk over
// tiles.

#include <immintrin.h>

#include <algorithm>
#include <cstdint>

#include "kernels/cpu/gemm.h"
#include "kernels/cpu/simd_math_avx2.h"

namespace tokenfab::kernels::avx2 {

// A tile of R weight rows × C activation rows over Q8A activations: acc[r][c] holds 8 f32 partial
// sums of y[c][r], bias[r][c] the scalar sum of the minimums' terms (types with a per-block m),
// w[r] the first block of weight row r0 + r, x[c] of activation row c0 + c.
template <int R, int C>
struct QuantTile {
  __m256 acc[R][C];
  float bias[R][C];
  const uint8_t* w[R];
  const BlockQ8A* x[C];

  QuantTile(const GemmArgs& a, int64_t r0, int64_t c0) {
    for (int r = 0; r < R; ++r)
      for (int c = 0; c < C; ++c) {
        acc[r][c] = _mm256_setzero_ps();
        bias[r][c] = 0.0f;
      }
    for (int r = 0; r < R; ++r) w[r] = a.w + (r0 + r) * a.w_stride;
    for (int c = 0; c < C; ++c)
      x[c] = reinterpret_cast<const BlockQ8A*>(a.x + (c0 + c) * a.x_stride);
  }

  void store(const GemmArgs& a, int64_t r0, int64_t c0) const {
    for (int c = 0; c < C; ++c)
      for (int r = 0; r < R; ++r)
        a.y[(c0 + c) * a.ldy + r0 + r] = hsum_avx2(acc[r][c]) + bias[r][c];
  }
};

// Calls tile.template operator()<R', C'>(r0, c0) for tiles covering all of a (the kernels keep
// their tile functions out of line, [[gnu::noinline]]: inlined into this walk, GCC 12 made the
// 2 × 1 tiles of the 3- and 5-column products up to 1.9 times slower): rows in tiles of R
// (then 1), columns in tiles of C (then 1), columns in chunks of 64 so that a chunk's activations
// stay in L2 while every row tile passes over them.
template <int R, int C, class Tile>
void walk_tiles(const GemmArgs& a, Tile&& tile) {
  constexpr int64_t kColChunk = 64;
  for (int64_t cc = 0; cc < a.cols; cc += kColChunk) {
    const int64_t c_end = std::min(a.cols, cc + kColChunk);
    int64_t r = 0;
    for (; r + R <= a.rows; r += R) {
      int64_t c = cc;
      for (; c + C <= c_end; c += C) tile.template operator()<R, C>(r, c);
      for (; c < c_end; ++c) tile.template operator()<R, 1>(r, c);
    }
    for (; r < a.rows; ++r) {
      int64_t c = cc;
      for (; c + C <= c_end; c += C) tile.template operator()<1, C>(r, c);
      for (; c < c_end; ++c) tile.template operator()<1, 1>(r, c);
    }
  }
}

// The tile shape: for one activation row (decode) 4 × 1, four independent rows hiding the FMA
// latency; for several 2 × 4.
template <class Tile>
void walk_tiles(const GemmArgs& a, Tile&& tile) {
  if (a.cols == 1) {
    walk_tiles<4, 1>(a, tile);
  } else {
    walk_tiles<2, 4>(a, tile);
  }
}

}  // namespace tokenfab::kernels::avx2
