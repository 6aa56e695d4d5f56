// AVX-512 VNNI kernels over the x16 layout (repack.h) on 512-bit vectors: a record vector holds
// four bytes of each of 16 rows, so one `vpdpbusd` with its four activation bytes broadcast from
// memory ({1to16}) adds the products of 16 rows at once, twice what the 256-bit kernel over x8
// records does per instruction (gemm_x8_avx512.cpp). On a CPU whose vector units are 512 bits
// wide that halves the multiplies of a step of several rows (a verified draft chain, a few
// streams); the unpacking of each record is shared by all of a tile's columns as there.
//
// Each lane is one row and takes exactly the steps gemm_x8_avx2 takes for that row — the same
// 32-bit block sums (Q8_0's and the IQ4 values offset to unsigned bytes and the offset's share
// added back, as in the x8 VNNI kernel; sub-block scales folded in as integers), then per
// activation block one FMA with d·d_x and, where the type has minimums, one for them, in block
// order — so the results equal the x8 kernels' bit for bit.

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

// The 512-bit operations of the shared group functions (gemm_vnni_tiles.h) over 16-row records.
struct V512 {
  using I = __m512i;
  using F = __m512;
  static constexpr int kRows = kX16Rows;
  // On 2 vCPUs of a Zen 5 EPYC a product of the LM head's shape from memory ran fastest from
  // about 8 KiB ahead (of 0.6–8 KiB tried), and from 2 KiB ahead slower than the x8 kernel.
  static constexpr size_t kPrefetchBytes = 8192;

  // vpdpbusd with an embedded {1to16} broadcast: one µop with its load.
  static I dpbusd_bcast(I acc, I w, const int8_t* p) {
    __asm__("vpdpbusd %2%{1to16%}, %1, %0"
            : "+v"(acc)
            : "v"(w), "m"(*reinterpret_cast<const vnni::Bytes4*>(p)));
    return acc;
  }
  static I load(const uint8_t* p) { return _mm512_loadu_si512(p); }
  static F load_half(const uint8_t* p) {
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  }
  static I zero_i() { return _mm512_setzero_si512(); }
  static F zero_f() { return _mm512_setzero_ps(); }
  static I set1_i8(char v) { return _mm512_set1_epi8(v); }
  static I set1_i32(int32_t v) { return _mm512_set1_epi32(v); }
  static F set1_f(float v) { return _mm512_set1_ps(v); }
  static I and_(I x, I y) { return _mm512_and_si512(x, y); }
  static I xor_(I x, I y) { return _mm512_xor_si512(x, y); }
  static I srli16_4(I x) { return _mm512_srli_epi16(x, 4); }
  static I add_i32(I x, I y) { return _mm512_add_epi32(x, y); }
  static F to_f(I x) { return _mm512_cvtepi32_ps(x); }
  static F mul(F x, F y) { return _mm512_mul_ps(x, y); }
  static F fmadd(F x, F y, F z) { return _mm512_fmadd_ps(x, y, z); }
  static void store(float* p, F x) { _mm512_storeu_ps(p, x); }
  static I or_(I x, I y) { return _mm512_or_si512(x, y); }
  static I sub_i8(I x, I y) { return _mm512_sub_epi8(x, y); }
  static I sub_i32(I x, I y) { return _mm512_sub_epi32(x, y); }
  static I mullo_i32(I x, I y) { return _mm512_mullo_epi32(x, y); }
  static I madd_i16(I x, I y) { return _mm512_madd_epi16(x, y); }
  static I shuffle_i8(I x, I control) { return _mm512_shuffle_epi8(x, control); }
  static I table(const x8tables::Shuffle& t) {
    return _mm512_broadcast_i32x4(_mm_load_si128(reinterpret_cast<const __m128i*>(t.b)));
  }
  // Left by N for N > 0, logical right by −N for N < 0, in each 16-bit lane.
  template <int N>
  static I shift16(I x) {
    if constexpr (N > 0) return _mm512_slli_epi16(x, N);
    if constexpr (N < 0) return _mm512_srli_epi16(x, -N);
    return x;
  }
  template <int N>
  static I srai16(I x) {
    return _mm512_srai_epi16(x, N);
  }
  template <int N>
  static I slli32(I x) {
    return _mm512_slli_epi32(x, N);
  }
  template <int N>
  static I srli32(I x) {
    return _mm512_srli_epi32(x, N);
  }
  template <int N>
  static I srai32(I x) {
    return _mm512_srai_epi32(x, N);
  }
  // kRows pairs of bytes / kRows uint16 from p, widened.
  static I cvt_i8_i16(const uint8_t* p) {
    return _mm512_cvtepi8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  }
  static I cvt_u8_i16(const uint8_t* p) {
    return _mm512_cvtepu8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  }
  static I cvt_u16_i32(const uint8_t* p) {
    return _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  }
};

template <WeightType T, int C>
struct X16Group {
  static void run(const GemmArgs& a, int64_t g, int64_t c0, vnni::Prefetch prefetch,
                  const int32_t* offset) {
    vnni::group<V512, T, C>(a, g, c0, prefetch, offset);
  }
};

}  // namespace

void gemm_x16_vnni(const GemmArgs& a) {
  vnni::run_typed<X16Group>(a, kX16Rows);
}

}  // namespace tokenfab::kernels
