// AVX2 kernels over the row-interleaved x8 layout (repack.h) for Q4_0, Q4_1 and Q8_0 (the other
// types: gemm_x8_q5_avx2.cpp, gemm_x8_kquants_avx2.cpp). Per row group and block:
// Q4: 4 loads unpacked into 8 vectors of nibbles; per activation row, 8 broadcasts of 4 bytes
// (BlockQ8A) or 8 loads of ready-broadcast vectors (BlockQ8B, prefill widths), 8 maddubs summed in
// 16 bits (|sum| ≤ 8·2·15·127 < 2^15), one madd to 32 bits, one FMA with the eight rows' scales,
// one FMA for the minimums. Q8_0 uses the sign trick per vector and widens each product to 32 bits
// (8·2·127·127 would overflow 16 bits).

#include <immintrin.h>

#include <algorithm>
#include <cstring>
#include <type_traits>

#include "kernels/cpu/gemm_x8_avx2_parts.h"
#include "kernels/cpu/repack.h"

namespace tokenfab::kernels {

namespace {

using x8avx2::broadcast4;
using x8avx2::kPrefetchBytes;

// Activation vector v of a block for the Q4 kernel: v = 2k holds elements 4k..4k+3 (they meet the
// low nibbles of weight vector k), v = 2k + 1 elements 16+4k..16+4k+3 (the high nibbles), each
// four-byte group repeated in all eight lanes.
inline __m256i act(const BlockQ8A& x, int v) {
  return broadcast4(x.qs + 16 * (v & 1) + 4 * (v >> 1));
}
inline __m256i act(const BlockQ8B& x, int v) {
  return _mm256_load_si256(reinterpret_cast<const __m256i*>(x.q[v]));
}

template <WeightType T, typename X, int C>
void group_q4(const GemmArgs& a, int64_t g, int64_t c0, bool prefetch) {
  constexpr size_t kRecord = T == WeightType::Q4_1 ? 160 : 144;
  constexpr size_t kQsOffset = T == WeightType::Q4_1 ? 32 : 16;
  const int64_t nb = a.k / kQK;
  const uint8_t* rec = a.w + g * a.w_stride;
  const X* x[C];
  for (int c = 0; c < C; ++c) x[c] = reinterpret_cast<const X*>(a.x + (c0 + c) * a.x_stride);
  __m256 acc[C];  // the block sums and the minimum terms share one accumulator per column
  for (int c = 0; c < C; ++c) acc[c] = _mm256_setzero_ps();
  const __m256i mask = _mm256_set1_epi8(0x0f);
  const __m256i ones = _mm256_set1_epi16(1);
  for (int64_t b = 0; b < nb; ++b, rec += kRecord) {
    if (prefetch) {
      for (size_t line = 0; line < kRecord; line += 64)
        _mm_prefetch(reinterpret_cast<const char*>(rec + kPrefetchBytes + line), _MM_HINT_T0);
    }
    const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(rec)));
    const __m256 m =
        T == WeightType::Q4_1
            ? _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(rec + 16)))
            : _mm256_mul_ps(d, _mm256_set1_ps(-8.0f));
    __m256i w[8];  // w[2k]: low nibbles of vector k, w[2k + 1]: its high nibbles
    for (int k = 0; k < 4; ++k) {
      const __m256i p =
          _mm256_loadu_si256(reinterpret_cast<const __m256i*>(rec + kQsOffset + 32 * k));
      w[2 * k] = _mm256_and_si256(p, mask);
      w[2 * k + 1] = _mm256_and_si256(_mm256_srli_epi16(p, 4), mask);
    }
    for (int c = 0; c < C; ++c) {
      const X& xb = x[c][b];
      __m256i part[4];
      for (int i = 0; i < 4; ++i)
        part[i] = _mm256_add_epi16(_mm256_maddubs_epi16(w[2 * i], act(xb, 2 * i)),
                                   _mm256_maddubs_epi16(w[2 * i + 1], act(xb, 2 * i + 1)));
      const __m256i s =
          _mm256_add_epi16(_mm256_add_epi16(part[0], part[1]), _mm256_add_epi16(part[2], part[3]));
      const __m256 sum = _mm256_cvtepi32_ps(_mm256_madd_epi16(s, ones));
      acc[c] = _mm256_fmadd_ps(sum, _mm256_mul_ps(d, _mm256_broadcast_ss(&xb.d)), acc[c]);
      acc[c] = _mm256_fmadd_ps(m, _mm256_broadcast_ss(&xb.s), acc[c]);
    }
  }
  for (int c = 0; c < C; ++c) _mm256_storeu_ps(a.y + (c0 + c) * a.ldy + g * kX8Rows, acc[c]);
}

template <int C>
void group_q8(const GemmArgs& a, int64_t g, int64_t c0, bool prefetch) {
  constexpr size_t kRecord = 272;
  const int64_t nb = a.k / kQK;
  const uint8_t* rec = a.w + g * a.w_stride;
  const BlockQ8A* x[C];
  for (int c = 0; c < C; ++c) x[c] = reinterpret_cast<const BlockQ8A*>(a.x + (c0 + c) * a.x_stride);
  __m256 acc[C];
  for (int c = 0; c < C; ++c) acc[c] = _mm256_setzero_ps();
  const __m256i ones = _mm256_set1_epi16(1);
  for (int64_t b = 0; b < nb; ++b, rec += kRecord) {
    if (prefetch) {
      for (size_t line = 0; line < kRecord; line += 64)
        _mm_prefetch(reinterpret_cast<const char*>(rec + kPrefetchBytes + line), _MM_HINT_T0);
    }
    const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(rec)));
    const auto* qs = reinterpret_cast<const __m256i*>(rec + 16);
    // Vector by vector, each weight vector's magnitudes made once for all the tile's columns
    // (the columns' own integer sums and float steps are unchanged, so are the results).
    __m256i s[C];
    for (int c = 0; c < C; ++c) s[c] = _mm256_setzero_si256();
    for (int k = 0; k < 8; ++k) {
      const __m256i w = _mm256_loadu_si256(qs + k);
      const __m256i w_abs = _mm256_sign_epi8(w, w);
      for (int c = 0; c < C; ++c) {
        const __m256i p =
            _mm256_maddubs_epi16(w_abs, _mm256_sign_epi8(broadcast4(x[c][b].qs + 4 * k), w));
        s[c] = _mm256_add_epi32(s[c], _mm256_madd_epi16(p, ones));
      }
    }
    for (int c = 0; c < C; ++c)
      acc[c] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s[c]),
                               _mm256_mul_ps(d, _mm256_set1_ps(x[c][b].d)), acc[c]);
  }
  for (int c = 0; c < C; ++c) _mm256_storeu_ps(a.y + (c0 + c) * a.ldy + g * kX8Rows, acc[c]);
}

template <WeightType T, typename X, int C>
void group(const GemmArgs& a, int64_t g, int64_t c0, bool prefetch) {
  if constexpr (T == WeightType::Q8_0) {
    group_q8<C>(a, g, c0, prefetch);
  } else {
    group_q4<T, X, C>(a, g, c0, prefetch);
  }
}

// Columns in chunks that stay in L2 while every row group passes over them (64 BlockQ8A rows;
// BlockQ8B rows are 7.2× larger, so as many as fit in about 224 KiB); within a chunk, tiles of C
// columns (and one tile of the 1–3 left over) share each unpacked weight record.
template <WeightType T, typename X>
void gemm_x8_typed(const GemmArgs& a) {
  constexpr int C = 4;
  int64_t col_chunk = 64;
  if constexpr (std::is_same_v<X, BlockQ8B>) {
    const int64_t row_bytes = a.k / kQK * static_cast<int64_t>(sizeof(BlockQ8B));
    col_chunk = std::clamp<int64_t>((224 << 10) / row_bytes / C * C, C, 64);
  }
  const int64_t groups = a.rows / kX8Rows;
  for (int64_t cc = 0; cc < a.cols; cc += col_chunk) {
    const int64_t c_end = std::min(a.cols, cc + col_chunk);
    for (int64_t g = 0; g < groups; ++g) {
      int64_t c = cc;
      for (; c + C <= c_end; c += C) group<T, X, C>(a, g, c, c == cc);
      // The rest in one tile, so that each record is unpacked once for all its columns (a
      // verified draft chain or a few streams are 2–5 columns).
      switch (c_end - c) {
        case 3:
          group<T, X, 3>(a, g, c, c == cc);
          break;
        case 2:
          group<T, X, 2>(a, g, c, c == cc);
          break;
        case 1:
          group<T, X, 1>(a, g, c, c == cc);
          break;
        default:
          break;
      }
    }
  }
}

}  // namespace

void gemm_x8_avx2(const GemmArgs& a) {
  switch (a.type) {
    case WeightType::Q4_0:
      gemm_x8_typed<WeightType::Q4_0, BlockQ8A>(a);
      return;
    case WeightType::Q4_1:
      gemm_x8_typed<WeightType::Q4_1, BlockQ8A>(a);
      return;
    case WeightType::Q8_0:
      gemm_x8_typed<WeightType::Q8_0, BlockQ8A>(a);
      return;
    case WeightType::Q5_0:
    case WeightType::Q5_1:
    case WeightType::IQ4_NL:
      gemm_x8_q5_avx2(a);
      return;
    default:
      gemm_x8_kquants_avx2(a);
      return;
  }
}

void gemm_x8_q8b_avx2(const GemmArgs& a) {
  switch (a.type) {
    case WeightType::Q4_0:
      gemm_x8_typed<WeightType::Q4_0, BlockQ8B>(a);
      return;
    case WeightType::Q4_1:
      gemm_x8_typed<WeightType::Q4_1, BlockQ8B>(a);
      return;
    default:
      return;
  }
}

}  // namespace tokenfab::kernels
