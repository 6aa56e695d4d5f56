#pragma once
// What the AVX2 kernels over x8 records share (gemm_x8_avx2.cpp, gemm_x8_q5_avx2.cpp,
// gemm_x8_kquants_avx2.cpp; include only from files compiled with the AVX2 flags): the record
// prefetch, the activation broadcasts, the int16 sums and their scaling, the float steps per
// block, the walk of a row group's records and the walk over row groups and column tiles.

#include <immintrin.h>

#include <cstring>

#include "kernels/cpu/for_each_index.h"
#include "kernels/cpu/gemm_packed_walk.h"
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

// prefetcht0 of the record at rec + kPrefetchBytes, line by line. As volatile asm: GCC 12 at -O3
// deleted the loop of _mm_prefetch calls here, whose only effect they are, in one shape of the
// code around it (all 180 prefetches of gemm_x8_kquants_avx2.o); objdump -d counts them.
inline void prefetch_ahead(const uint8_t* rec, size_t bytes) {
  for (size_t line = 0; line < bytes; line += 64)
    __asm__ volatile("prefetcht0 %0" : : "m"(rec[kPrefetchBytes + line]));
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

// Σ of mul4(w[v], activation bytes q + 4v) for v in [v0, v0 + N), in int16 (the caller bounds N
// so that the sum fits). These per-column sums are forced inline: GCC 12 otherwise left
// madd_runs<4, 8> an out-of-line call per column and block of Q5_K.
template <int N>
[[gnu::always_inline]] inline __m256i sum16(const __m256i* w, const int8_t* q, int v0) {
  if constexpr (N == 1) {
    return mul4(w[v0], q + 4 * v0);
  } else {
    return _mm256_add_epi16(sum16<N / 2>(w, q, v0), sum16<N / 2>(w, q, v0 + N / 2));
  }
}

// Σ over v in [v0, v0 + Count) as above, in int16 runs of N vectors, each run widened to int32
// by one madd against sc (16 int16 multipliers: each row's scale in both halves of its lane, or
// ones).
template <int N, int Count>
[[gnu::always_inline]] inline __m256i madd_runs(const __m256i* w, const int8_t* q, int v0,
                                                __m256i sc) {
  __m256i s = _mm256_madd_epi16(sum16<N>(w, q, v0), sc);
  for (int v = v0 + N; v < v0 + Count; v += N)
    s = _mm256_add_epi32(s, _mm256_madd_epi16(sum16<N>(w, q, v), sc));
  return s;
}

// Sub-blocks of 16 elements (Q6_K, Q3_K, Q2_K): the first half's 4 vectors times sca, the
// second's times scb, each in int16 runs of N.
template <int N>
[[gnu::always_inline]] inline __m256i scaled_halves(const __m256i* w, const int8_t* q, __m256i sca,
                                                    __m256i scb) {
  return _mm256_add_epi32(madd_runs<N, 4>(w, q, 0, sca), madd_runs<N, 4>(w, q, 4, scb));
}

// IQ4_NL, IQ4_XS: s[c] = Σ v[q]·a.q of the 32 indices in the four record vectors at qs (Q4_0's
// nibble order) against column c's block *xb[c], each maddubs (the sign trick: |v| against a with
// v's sign, ≤ 2·127·127 = 32258) widened at once by a madd against sc. Each weight vector's values
// and magnitudes are made once for all the tile's columns.
template <int C>
inline void iq4_sums(const uint8_t* qs, __m256i sc, const BlockQ8A* const (&xb)[C],
                     __m256i (&s)[C]) {
  const __m256i values = table(x8tables::kIQ4Signed), mask = _mm256_set1_epi8(0x0f);
  for (int c = 0; c < C; ++c) s[c] = _mm256_setzero_si256();
  for (int k = 0; k < 4; ++k) {
    const __m256i p = load(qs + 32 * k);
    for (int h = 0; h < 2; ++h) {
      const __m256i w =
          _mm256_shuffle_epi8(values, _mm256_and_si256(h ? _mm256_srli_epi16(p, 4) : p, mask));
      const __m256i w_abs = _mm256_sign_epi8(w, w);
      for (int c = 0; c < C; ++c) {
        const __m256i xs = _mm256_sign_epi8(broadcast4(xb[c]->qs + 16 * h + 4 * k), w);
        s[c] = _mm256_add_epi32(s[c], _mm256_madd_epi16(_mm256_maddubs_epi16(w_abs, xs), sc));
      }
    }
  }
}

// The float steps of one activation block, the same in every packed kernel of every width (so
// that their results agree bit for bit): acc += isum · (d · a.d).
inline __m256 add_block(__m256 acc, __m256i isum, __m256 d, const BlockQ8A& x) {
  return _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), _mm256_mul_ps(d, _mm256_set1_ps(x.d)), acc);
}

// A group's tile of columns c0 … c0 + C − 1: x[c] column c's activation blocks, acc[c] its
// accumulators (8 rows' sums), stored as the group's rows of column c at the end. Each group walks
// its records in its own loop (see vnni::Tile for why).
template <int C>
struct Tile {
  const BlockQ8A* x[C];
  __m256 acc[C];

  Tile(const GemmArgs& a, int64_t c0) {
    for (int c = 0; c < C; ++c) {
      x[c] = reinterpret_cast<const BlockQ8A*>(a.x + (c0 + c) * a.x_stride);
      acc[c] = _mm256_setzero_ps();
    }
  }
  void store(const GemmArgs& a, int64_t g, int64_t c0) const {
    for (int c = 0; c < C; ++c) _mm256_storeu_ps(a.y + (c0 + c) * a.ldy + g * kX8Rows, acc[c]);
  }
};

// Group<C>::run(a, g, c0, prefetch, sums) computes row group g against columns [c0, c0 + C);
// `sums` is what activation_sums gave for the type, or null. Tiles of 4 columns
// (walk_column_tiles), the first over each row group prefetching its records.
template <template <int> class Group>
void walk(const GemmArgs& a, const int32_t* sums) {
  walk_column_tiles<4>(a, kX8Rows, [&]<int C>(int64_t g, int64_t c0, int tile) {
    Group<C>::run(a, g, c0, tile == 0, sums);
  });
}

}  // namespace tokenfab::kernels::x8avx2
