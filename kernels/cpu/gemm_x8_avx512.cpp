// AVX-512 VNNI kernels over the row-interleaved x8 layout (repack.h), on 256-bit vectors
// (AVX512VL): `vpdpbusd` multiplies four u8 weight bytes by four s8 activation bytes and adds the
// four products into a 32-bit lane, which is one row's sum over the four elements a record vector
// holds — the x8 layout is exactly the operand shape it wants. Per row group and block:
// Q4: 4 loads unpacked into 8 vectors of nibbles; per activation row, 8 vpdpbusd, each taking its
// four activation bytes as an embedded broadcast from memory (so no layout like BlockQ8B is
// needed at any width), then one FMA with the eight rows' scales and one for the minimums.
// Q8_0: weights offset to unsigned bytes, the offset's share taken back once per block.
//
// The 32-bit block sums are the exact integers the AVX2 kernels form (no partial sum can overflow
// there either), and the float work after them is the same operations in the same order, so the
// results equal gemm_x8_avx2's bit for bit: which kernel a CPU runs never changes an output.

#include <immintrin.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "kernels/cpu/repack.h"

namespace tokenfab::kernels {

namespace {

// The first tile over a row group streams its records from memory and prefetches this far ahead
// (twice the AVX2 kernel's distance: the VNNI kernel computes a record in fewer cycles, so more
// of them must be in flight to keep the memory busy). Where a row group has more tiles, the
// second one prefetches the next group's records instead, so that the first tile of every group
// finds them in cache and the stream from memory spreads over the whole group's work.
constexpr size_t kPrefetchBytes = 1280;
enum class Prefetch { None, Ahead, NextGroup };

inline void prefetch_record(const uint8_t* rec, size_t bytes) {
  for (size_t line = 0; line < bytes; line += 64)
    _mm_prefetch(reinterpret_cast<const char*>(rec + line), _MM_HINT_T0);
}

// acc + the four-byte products of w's lanes with the four bytes at p in every lane: vpdpbusd with
// an embedded {1to8} broadcast, which the compiler does not form from _mm256_set1_epi32 (it
// issues a separate broadcast instead, one more µop per multiply).
using Bytes4 = int32_t __attribute__((may_alias, aligned(1)));  // four activation bytes
inline __m256i dpbusd_bcast(__m256i acc, __m256i w, const int8_t* p) {
  __asm__("vpdpbusd %2%{1to8%}, %1, %0" : "+v"(acc) : "v"(w), "m"(*reinterpret_cast<const Bytes4*>(p)));
  return acc;
}

// offset[b] = −128 · Σ q of block b.
void q8a_offsets(const BlockQ8A* x, int64_t nb, int32_t* offset) {
  for (int64_t b = 0; b < nb; ++b) {
    int32_t sum = 0;
    for (int i = 0; i < kQK; ++i) sum += x[b].qs[i];
    offset[b] = -128 * sum;
  }
}

template <WeightType T, int C>
void group_q4(const GemmArgs& a, int64_t g, int64_t c0, Prefetch prefetch) {
  constexpr size_t kRecord = T == WeightType::Q4_1 ? 160 : 144;
  constexpr size_t kQsOffset = T == WeightType::Q4_1 ? 32 : 16;
  const int64_t nb = a.k / kQK;
  const uint8_t* rec = a.w + g * a.w_stride;
  const BlockQ8A* x[C];
  for (int c = 0; c < C; ++c) x[c] = reinterpret_cast<const BlockQ8A*>(a.x + (c0 + c) * a.x_stride);
  __m256 acc[C];  // the block sums and the minimum terms share one accumulator per column
  for (int c = 0; c < C; ++c) acc[c] = _mm256_setzero_ps();
  const __m256i mask = _mm256_set1_epi8(0x0f);
  for (int64_t b = 0; b < nb; ++b, rec += kRecord) {
    if (prefetch == Prefetch::Ahead) prefetch_record(rec + kPrefetchBytes, kRecord);
    if (prefetch == Prefetch::NextGroup) prefetch_record(rec + a.w_stride, kRecord);
    const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(rec)));
    const __m256 m =
        T == WeightType::Q4_1
            ? _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(rec + 16)))
            : _mm256_mul_ps(d, _mm256_set1_ps(-8.0f));
    __m256i w[8];  // w[2k]: low nibbles of vector k (elements 4k..4k+3), w[2k + 1]: high (16+4k..)
    for (int k = 0; k < 4; ++k) {
      const __m256i p =
          _mm256_loadu_si256(reinterpret_cast<const __m256i*>(rec + kQsOffset + 32 * k));
      w[2 * k] = _mm256_and_si256(p, mask);
      w[2 * k + 1] = _mm256_and_si256(_mm256_srli_epi16(p, 4), mask);
    }
    for (int c = 0; c < C; ++c) {
      const BlockQ8A& xb = x[c][b];
      // Two chains of four, so a column's block is not one 8-deep dependency.
      __m256i lo = dpbusd_bcast(_mm256_setzero_si256(), w[0], xb.qs);
      __m256i hi = dpbusd_bcast(_mm256_setzero_si256(), w[1], xb.qs + 16);
      for (int k = 1; k < 4; ++k) {
        lo = dpbusd_bcast(lo, w[2 * k], xb.qs + 4 * k);
        hi = dpbusd_bcast(hi, w[2 * k + 1], xb.qs + 16 + 4 * k);
      }
      const __m256 sum = _mm256_cvtepi32_ps(_mm256_add_epi32(lo, hi));
      acc[c] = _mm256_fmadd_ps(sum, _mm256_mul_ps(d, _mm256_broadcast_ss(&xb.d)), acc[c]);
      acc[c] = _mm256_fmadd_ps(m, _mm256_broadcast_ss(&xb.s), acc[c]);
    }
  }
  for (int c = 0; c < C; ++c) _mm256_storeu_ps(a.y + (c0 + c) * a.ldy + g * kX8Rows, acc[c]);
}

// Q8_0 weights are signed, and vpdpbusd multiplies unsigned by signed bytes: the weights are
// offset to unsigned (w + 128, one xor per record vector) and −128·Σq_a, the offset's share of the
// row sum, is added back per block (`offset`: per column, nb values, from q8a_offsets). The
// result is the exact integer Σ w·q_a, as in the AVX2 kernel.
template <int C>
void group_q8(const GemmArgs& a, int64_t g, int64_t c0, Prefetch prefetch, const int32_t* offset) {
  constexpr size_t kRecord = 272;
  const int64_t nb = a.k / kQK;
  const uint8_t* rec = a.w + g * a.w_stride;
  const BlockQ8A* x[C];
  for (int c = 0; c < C; ++c) x[c] = reinterpret_cast<const BlockQ8A*>(a.x + (c0 + c) * a.x_stride);
  __m256 acc[C];
  for (int c = 0; c < C; ++c) acc[c] = _mm256_setzero_ps();
  const __m256i flip = _mm256_set1_epi8(static_cast<char>(0x80));
  for (int64_t b = 0; b < nb; ++b, rec += kRecord) {
    if (prefetch == Prefetch::Ahead) prefetch_record(rec + kPrefetchBytes, kRecord);
    if (prefetch == Prefetch::NextGroup) prefetch_record(rec + a.w_stride, kRecord);
    const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(rec)));
    const auto* qs = reinterpret_cast<const __m256i*>(rec + 16);
    __m256i w[8];  // vector k: elements 4k..4k+3 of each row, plus 128
    for (int k = 0; k < 8; ++k) w[k] = _mm256_xor_si256(_mm256_loadu_si256(qs + k), flip);
    for (int c = 0; c < C; ++c) {
      const BlockQ8A& xb = x[c][b];
      __m256i lo = _mm256_set1_epi32(offset[(c0 + c) * nb + b]);
      __m256i hi = dpbusd_bcast(_mm256_setzero_si256(), w[1], xb.qs + 4);
      lo = dpbusd_bcast(lo, w[0], xb.qs);
      for (int k = 2; k < 8; k += 2) {
        lo = dpbusd_bcast(lo, w[k], xb.qs + 4 * k);
        hi = dpbusd_bcast(hi, w[k + 1], xb.qs + 4 * k + 4);
      }
      const __m256 sum = _mm256_cvtepi32_ps(_mm256_add_epi32(lo, hi));
      acc[c] = _mm256_fmadd_ps(sum, _mm256_mul_ps(d, _mm256_set1_ps(xb.d)), acc[c]);
    }
  }
  for (int c = 0; c < C; ++c) _mm256_storeu_ps(a.y + (c0 + c) * a.ldy + g * kX8Rows, acc[c]);
}

template <WeightType T, int C>
void group(const GemmArgs& a, int64_t g, int64_t c0, Prefetch prefetch, const int32_t* offset) {
  if constexpr (T == WeightType::Q8_0) {
    group_q8<C>(a, g, c0, prefetch, offset);
  } else {
    group_q4<T, C>(a, g, c0, prefetch);
  }
}

template <WeightType T, int C>
void tail_tile(const GemmArgs& a, int64_t g, int64_t c, int64_t n, Prefetch prefetch,
               const int32_t* offset) {
  if constexpr (C > 0) {
    if (n == C) return group<T, C>(a, g, c, prefetch, offset);
    tail_tile<T, C - 1>(a, g, c, n, prefetch, offset);
  }
}

// Columns in chunks of 64 that stay in L2 while every row group passes over them; within a chunk,
// tiles of kTile columns (the 32 vector registers hold a tile's 8 weight vectors and 8
// accumulators) and one tile of whatever is left, so that a verified draft chain or a few
// streams (2–8 columns) unpack each record once.
template <WeightType T>
void gemm_x8_typed(const GemmArgs& a) {
  // Q8_0's per-block offsets, per calling thread; grows to the largest input, never shrinks.
  thread_local std::vector<int32_t> offsets;
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
  const int64_t groups = a.rows / kX8Rows;
  for (int64_t cc = 0; cc < a.cols; cc += kColChunk) {
    const int64_t c_end = std::min(a.cols, cc + kColChunk);
    for (int64_t g = 0; g < groups; ++g) {
      int tile = 0;
      const auto mode = [&] {
        const int t = tile++;
        return t == 0 ? Prefetch::Ahead : t == 1 ? Prefetch::NextGroup : Prefetch::None;
      };
      int64_t c = cc;
      for (; c + kTile <= c_end; c += kTile) group<T, kTile>(a, g, c, mode(), offset);
      if (c < c_end) tail_tile<T, kTile - 1>(a, g, c, c_end - c, mode(), offset);
    }
  }
}

}  // namespace

void gemm_x8_vnni(const GemmArgs& a) {
  switch (a.type) {
    case WeightType::Q4_0:
      gemm_x8_typed<WeightType::Q4_0>(a);
      return;
    case WeightType::Q4_1:
      gemm_x8_typed<WeightType::Q4_1>(a);
      return;
    case WeightType::Q8_0:
      gemm_x8_typed<WeightType::Q8_0>(a);
      return;
    default:
      return;
  }
}

}  // namespace tokenfab::kernels
