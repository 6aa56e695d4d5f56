// AVX-512 VNNI kernels over the x16 layout (repack.h) on 512-bit vectors: a record vector holds
// four bytes of each of 16 rows, so one `vpdpbusd` with its four activation bytes broadcast from
// memory ({1to16}) adds the products of 16 rows at once, twice what the 256-bit kernel over x8
// records does per instruction (gemm_x8_avx512.cpp). On a CPU whose vector units are 512 bits
// wide that halves the multiplies of a step of several rows (a verified draft chain, a few
// streams); the unpacking of each record is shared by all of a tile's columns as there.
//
// Each lane is one row and takes exactly the steps gemm_x8_avx2 takes for that row — the same
// 32-bit block sums (Q8_0's weights offset to unsigned bytes and the offset's share added back,
// as in the x8 VNNI kernel), then per block one FMA with d·d_x and, for Q4, one with m·s_x, in
// block order — so the results equal the x8 kernels' bit for bit.

// GCC 12 warns that the undefined pass-through operand of its own 512-bit conversion intrinsics
// (_mm512_cvtph_ps, _mm512_cvtepi32_ps) may be used uninitialized; it is never read.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop
#else
#include <immintrin.h>
#endif

#include "kernels/cpu/gemm_vnni_tiles.h"
#include "kernels/cpu/repack.h"

namespace tokenfab::kernels {

namespace {

using vnni::Bytes4;
using vnni::Prefetch;
using vnni::prefetch_record;

// How far ahead the first tile over a row group prefetches its records (vnni::Prefetch). On 2
// vCPUs of a Zen 5 EPYC a product of the LM head's shape from memory ran fastest from about
// 8 KiB ahead (of 0.6–8 KiB tried), and from 2 KiB ahead slower than the x8 kernel.
constexpr size_t kPrefetchBytes = 8192;

// acc + the four-byte products of w's lanes with the four bytes at p in every lane (an embedded
// {1to16} broadcast, one µop with its load).
inline __m512i dpbusd_bcast(__m512i acc, __m512i w, const int8_t* p) {
  __asm__("vpdpbusd %2%{1to16%}, %1, %0"
          : "+v"(acc)
          : "v"(w), "m"(*reinterpret_cast<const Bytes4*>(p)));
  return acc;
}

inline __m512 load_half16(const uint8_t* p) {
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}

template <WeightType T, int C>
void group_q4(const GemmArgs& a, int64_t g, int64_t c0, Prefetch prefetch) {
  constexpr size_t kRecord = T == WeightType::Q4_1 ? 320 : 288;
  constexpr size_t kQsOffset = T == WeightType::Q4_1 ? 64 : 32;
  const int64_t nb = a.k / kQK;
  const uint8_t* rec = a.w + g * a.w_stride;
  const BlockQ8A* x[C];
  for (int c = 0; c < C; ++c) x[c] = reinterpret_cast<const BlockQ8A*>(a.x + (c0 + c) * a.x_stride);
  __m512 acc[C];
  for (int c = 0; c < C; ++c) acc[c] = _mm512_setzero_ps();
  const __m512i mask = _mm512_set1_epi8(0x0f);
  for (int64_t b = 0; b < nb; ++b, rec += kRecord) {
    if (prefetch == Prefetch::Ahead) prefetch_record(rec + kPrefetchBytes, kRecord);
    if (prefetch == Prefetch::NextGroup) prefetch_record(rec + a.w_stride, kRecord);
    const __m512 d = load_half16(rec);
    const __m512 m =
        T == WeightType::Q4_1 ? load_half16(rec + 32) : _mm512_mul_ps(d, _mm512_set1_ps(-8.0f));
    __m512i w[8];  // w[2k]: low nibbles of vector k (elements 4k..4k+3), w[2k + 1]: high (16+4k..)
    for (int k = 0; k < 4; ++k) {
      const __m512i p = _mm512_loadu_si512(rec + kQsOffset + 64 * k);
      w[2 * k] = _mm512_and_si512(p, mask);
      w[2 * k + 1] = _mm512_and_si512(_mm512_srli_epi16(p, 4), mask);
    }
    for (int c = 0; c < C; ++c) {
      const BlockQ8A& xb = x[c][b];
      __m512i lo = dpbusd_bcast(_mm512_setzero_si512(), w[0], xb.qs);
      __m512i hi = dpbusd_bcast(_mm512_setzero_si512(), w[1], xb.qs + 16);
      for (int k = 1; k < 4; ++k) {
        lo = dpbusd_bcast(lo, w[2 * k], xb.qs + 4 * k);
        hi = dpbusd_bcast(hi, w[2 * k + 1], xb.qs + 16 + 4 * k);
      }
      const __m512 sum = _mm512_cvtepi32_ps(_mm512_add_epi32(lo, hi));
      acc[c] = _mm512_fmadd_ps(sum, _mm512_mul_ps(d, _mm512_set1_ps(xb.d)), acc[c]);
      acc[c] = _mm512_fmadd_ps(m, _mm512_set1_ps(xb.s), acc[c]);
    }
  }
  for (int c = 0; c < C; ++c) _mm512_storeu_ps(a.y + (c0 + c) * a.ldy + g * kX16Rows, acc[c]);
}

template <int C>
void group_q8(const GemmArgs& a, int64_t g, int64_t c0, Prefetch prefetch, const int32_t* offset) {
  constexpr size_t kRecord = 544;
  const int64_t nb = a.k / kQK;
  const uint8_t* rec = a.w + g * a.w_stride;
  const BlockQ8A* x[C];
  for (int c = 0; c < C; ++c) x[c] = reinterpret_cast<const BlockQ8A*>(a.x + (c0 + c) * a.x_stride);
  __m512 acc[C];
  for (int c = 0; c < C; ++c) acc[c] = _mm512_setzero_ps();
  const __m512i flip = _mm512_set1_epi8(static_cast<char>(0x80));
  for (int64_t b = 0; b < nb; ++b, rec += kRecord) {
    if (prefetch == Prefetch::Ahead) prefetch_record(rec + kPrefetchBytes, kRecord);
    if (prefetch == Prefetch::NextGroup) prefetch_record(rec + a.w_stride, kRecord);
    const __m512 d = load_half16(rec);
    __m512i w[8];  // vector k: elements 4k..4k+3 of each row, plus 128
    for (int k = 0; k < 8; ++k)
      w[k] = _mm512_xor_si512(_mm512_loadu_si512(rec + 32 + 64 * k), flip);
    for (int c = 0; c < C; ++c) {
      const BlockQ8A& xb = x[c][b];
      __m512i lo = _mm512_set1_epi32(offset[(c0 + c) * nb + b]);
      __m512i hi = dpbusd_bcast(_mm512_setzero_si512(), w[1], xb.qs + 4);
      lo = dpbusd_bcast(lo, w[0], xb.qs);
      for (int k = 2; k < 8; k += 2) {
        lo = dpbusd_bcast(lo, w[k], xb.qs + 4 * k);
        hi = dpbusd_bcast(hi, w[k + 1], xb.qs + 4 * k + 4);
      }
      const __m512 sum = _mm512_cvtepi32_ps(_mm512_add_epi32(lo, hi));
      acc[c] = _mm512_fmadd_ps(sum, _mm512_mul_ps(d, _mm512_set1_ps(xb.d)), acc[c]);
    }
  }
  for (int c = 0; c < C; ++c) _mm512_storeu_ps(a.y + (c0 + c) * a.ldy + g * kX16Rows, acc[c]);
}

template <WeightType T, int C>
struct X16Group {
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

void gemm_x16_vnni(const GemmArgs& a) {
  vnni::run_typed<X16Group>(a, kX16Rows);
}

}  // namespace tokenfab::kernels
