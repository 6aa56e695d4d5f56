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

#include "kernels/cpu/gemm_vnni_tiles.h"
#include "kernels/cpu/repack.h"

namespace tokenfab::kernels {

namespace {

using vnni::Bytes4;
using vnni::Prefetch;
using vnni::prefetch_record;

// How far ahead the first tile over a row group prefetches its records (vnni::Prefetch): eight
// Q4_1 records. (This kernel now runs only for matrices whose rows do not divide into the x16
// records of gemm_x16_avx512.cpp, or where the caller packed x8 itself.)
constexpr size_t kPrefetchBytes = 1280;

// acc + the four-byte products of w's lanes with the four bytes at p in every lane: vpdpbusd with
// an embedded {1to8} broadcast, which the compiler does not form from _mm256_set1_epi32 (it
// issues a separate broadcast instead, one more µop per multiply).
inline __m256i dpbusd_bcast(__m256i acc, __m256i w, const int8_t* p) {
  __asm__("vpdpbusd %2%{1to8%}, %1, %0"
          : "+v"(acc)
          : "v"(w), "m"(*reinterpret_cast<const Bytes4*>(p)));
  return acc;
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
struct X8Group {
  static void run(const GemmArgs& a, int64_t g, int64_t c0, Prefetch prefetch,
                  const int32_t* offset) {
    if constexpr (T == WeightType::Q8_0) {
      group_q8<C>(a, g, c0, prefetch, offset);
    } else {
      group_q4<T, C>(a, g, c0, prefetch);
    }
  }
};

}  // namespace

void gemm_x8_vnni(const GemmArgs& a) {
  vnni::run_typed<X8Group>(a, kX8Rows);
}

}  // namespace tokenfab::kernels
