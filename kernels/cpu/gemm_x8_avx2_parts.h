#pragma once
// What the AVX2 kernels over x8 records share (gemm_x8_avx2.cpp, gemm_x8_q5_avx2.cpp,
// gemm_x8_kquants_avx2.cpp; include only from files compiled with the AVX2 flags): the record
// prefetch, the activation broadcasts, the float steps per block and the walk over row groups and
// column tiles.

#include <immintrin.h>

#include <algorithm>
#include <cstring>

#include "kernels/cpu/gemm_x8_tables.h"
#include "kernels/cpu/repack.h"

namespace tokenfab::kernels::x8avx2 {

// The first tile over a row group streams its weight records straight from memory (decode reads
// each record once; small batches — a verified draft chain, a few streams — once per column
// chunk): records this many bytes ahead are prefetched while the current one is computed on; the
// hardware prefetcher alone leaves the memory idle at the start of every thread's range. On the
// 2-core AVX2 development machine (Zen 3) the embedded model decoded at 349–390 tok/s with 2 or
// 4 KiB ahead against 314–339 with 640 bytes in a quiet hour (`bench --threads 2`, interleaved
// runs; 8 KiB was no better), 2 % faster on average in a busy one, when the host's neighbours held
// the memory. Later tiles over the same group find it in L1.
inline constexpr size_t kPrefetchBytes = 4096;

inline void prefetch_ahead(const uint8_t* rec, size_t bytes) {
  for (size_t line = 0; line < bytes; line += 64)
    _mm_prefetch(reinterpret_cast<const char*>(rec + kPrefetchBytes + line), _MM_HINT_T0);
}

inline __m256i load(const uint8_t* p) {
  return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
}

inline __m256 load_half(const uint8_t* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}

// A 16-byte control or table (gemm_x8_tables.h) in both 128-bit halves.
inline __m256i table(const x8tables::Shuffle& t) {
  return _mm256_broadcastsi128_si256(_mm_load_si128(reinterpret_cast<const __m128i*>(t.b)));
}

inline __m256i broadcast4(const int8_t* p) {
  int32_t v;
  std::memcpy(&v, p, sizeof v);
  return _mm256_set1_epi32(v);
}

// u8 weights of vector w × the four activation bytes at p in every lane → 16 int16 pair sums.
inline __m256i mul4(__m256i w, const int8_t* p) {
  return _mm256_maddubs_epi16(w, broadcast4(p));
}

// x shifted by N bits in each 16-bit lane: left for N > 0, right for N < 0.
template <int N>
inline __m256i shift16(__m256i x) {
  if constexpr (N > 0) {
    return _mm256_slli_epi16(x, N);
  } else if constexpr (N < 0) {
    return _mm256_srli_epi16(x, -N);
  } else {
    return x;
  }
}

// The float steps of one activation block, the same in every packed kernel of every width (so
// that their results agree bit for bit): acc += isum · (d · a.d).
inline __m256 add_block(__m256 acc, __m256i isum, __m256 d, const BlockQ8A& x) {
  return _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), _mm256_mul_ps(d, _mm256_set1_ps(x.d)), acc);
}

// Column tiles: Group<C>::run(a, g, c0, prefetch, sums) computes row group g against columns
// [c0, c0 + C); `sums` is what activation_sums gave for the type, or null. Columns go in chunks
// of 64 that stay in L2 while every row group passes over them; within a chunk, tiles of 4 and
// one tile of the 1–3 left over, so that each record is unpacked once for all its columns (a
// verified draft chain or a few streams are 2–5 columns).
template <template <int> class Group>
void walk(const GemmArgs& a, const int32_t* sums) {
  constexpr int C = 4;
  constexpr int64_t kColChunk = 64;
  const int64_t groups = a.rows / kX8Rows;
  for (int64_t cc = 0; cc < a.cols; cc += kColChunk) {
    const int64_t c_end = std::min(a.cols, cc + kColChunk);
    for (int64_t g = 0; g < groups; ++g) {
      int64_t c = cc;
      for (; c + C <= c_end; c += C) Group<C>::run(a, g, c, c == cc, sums);
      switch (c_end - c) {
        case 3:
          Group<3>::run(a, g, c, c == cc, sums);
          break;
        case 2:
          Group<2>::run(a, g, c, c == cc, sums);
          break;
        case 1:
          Group<1>::run(a, g, c, c == cc, sums);
          break;
        default:
          break;
      }
    }
  }
}

}  // namespace tokenfab::kernels::x8avx2
