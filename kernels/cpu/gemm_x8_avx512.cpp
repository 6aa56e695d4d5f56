// AVX-512 VNNI kernels over the row-interleaved x8 layout (repack.h), on 256-bit vectors
// (AVX512VL): `vpdpbusd` multiplies four u8 weight bytes by four s8 activation bytes and adds the
// four products into a 32-bit lane, which is one row's sum over the four elements a record vector
// holds — the x8 layout is exactly the operand shape it wants. Per row group and block:
// Q4: 4 loads unpacked into 8 vectors of nibbles; per activation row, 8 vpdpbusd, each taking its
// four activation bytes as an embedded broadcast from memory (so no layout like BlockQ8B is
// needed at any width), then one FMA with the eight rows' scales and one for the minimums.
// Q8_0: weights offset to unsigned bytes, the offset's share taken back once per block. Q5_0,
// Q5_1, IQ4_NL and the super-block types likewise, each sub-block's sum then times its scale
// (gemm_vnni_groups.h). (The group functions are gemm_vnni_tiles.h's and gemm_vnni_groups.h's,
// shared with the 512-bit kernel over x16 records.)
//
// The 32-bit block sums are the exact integers the AVX2 kernels form (no partial sum can overflow
// there either), and the float work after them is the same operations in the same order, so the
// results equal gemm_x8_avx2's bit for bit: which kernel a CPU runs never changes an output.

#include <immintrin.h>

#include "kernels/cpu/gemm_vnni_tiles.h"
#include "kernels/cpu/repack.h"

namespace tokenfab::kernels {

namespace {

// The 256-bit operations of the shared group functions (gemm_vnni_tiles.h) over 8-row records.
struct V256 {
  using I = __m256i;
  using F = __m256;
  static constexpr int kRows = kX8Rows;
  // Eight Q4_1 records ahead. (This kernel now runs only for matrices whose rows do not divide
  // into the x16 records of gemm_x16_avx512.cpp, or where the caller packed x8 itself.)
  static constexpr size_t kPrefetchBytes = 1280;

  // vpdpbusd with an embedded {1to8} broadcast, which the compiler does not form from
  // _mm256_set1_epi32 (it issues a separate broadcast instead, one more µop per multiply).
  static I dpbusd_bcast(I acc, I w, const int8_t* p) {
    __asm__("vpdpbusd %2%{1to8%}, %1, %0"
            : "+v"(acc)
            : "v"(w), "m"(*reinterpret_cast<const vnni::Bytes4*>(p)));
    return acc;
  }
  static I load(const uint8_t* p) { return _mm256_loadu_si256(reinterpret_cast<const I*>(p)); }
  static F load_half(const uint8_t* p) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
  static I zero_i() { return _mm256_setzero_si256(); }
  static F zero_f() { return _mm256_setzero_ps(); }
  static I set1_i8(char v) { return _mm256_set1_epi8(v); }
  static I set1_i32(int32_t v) { return _mm256_set1_epi32(v); }
  static F set1_f(float v) { return _mm256_set1_ps(v); }
  static I and_(I x, I y) { return _mm256_and_si256(x, y); }
  static I xor_(I x, I y) { return _mm256_xor_si256(x, y); }
  static I srli16_4(I x) { return _mm256_srli_epi16(x, 4); }
  static I add_i32(I x, I y) { return _mm256_add_epi32(x, y); }
  static F to_f(I x) { return _mm256_cvtepi32_ps(x); }
  static F mul(F x, F y) { return _mm256_mul_ps(x, y); }
  static F fmadd(F x, F y, F z) { return _mm256_fmadd_ps(x, y, z); }
  static void store(float* p, F x) { _mm256_storeu_ps(p, x); }
  static I or_(I x, I y) { return _mm256_or_si256(x, y); }
  static I sub_i8(I x, I y) { return _mm256_sub_epi8(x, y); }
  static I sub_i32(I x, I y) { return _mm256_sub_epi32(x, y); }
  static I mullo_i32(I x, I y) { return _mm256_mullo_epi32(x, y); }
  static I madd_i16(I x, I y) { return _mm256_madd_epi16(x, y); }
  static I shuffle_i8(I x, I control) { return _mm256_shuffle_epi8(x, control); }
  static I table(const x8tables::Shuffle& t) {
    return _mm256_broadcastsi128_si256(_mm_load_si128(reinterpret_cast<const __m128i*>(t.b)));
  }
  // Left by N for N > 0, logical right by −N for N < 0, in each 16-bit lane.
  template <int N>
  static I shift16(I x) {
    if constexpr (N > 0) return _mm256_slli_epi16(x, N);
    if constexpr (N < 0) return _mm256_srli_epi16(x, -N);
    return x;
  }
  template <int N>
  static I srai16(I x) {
    return _mm256_srai_epi16(x, N);
  }
  template <int N>
  static I slli32(I x) {
    return _mm256_slli_epi32(x, N);
  }
  template <int N>
  static I srli32(I x) {
    return _mm256_srli_epi32(x, N);
  }
  template <int N>
  static I srai32(I x) {
    return _mm256_srai_epi32(x, N);
  }
  // kRows pairs of bytes / kRows uint16 from p, widened.
  static I cvt_i8_i16(const uint8_t* p) {
    return _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
  static I cvt_u8_i16(const uint8_t* p) {
    return _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
  static I cvt_u16_i32(const uint8_t* p) {
    return _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
};

template <WeightType T, int C>
struct X8Group {
  static void run(const GemmArgs& a, int64_t g, int64_t c0, vnni::Prefetch prefetch,
                  const int32_t* offset) {
    vnni::group<V256, T, C>(a, g, c0, prefetch, offset);
  }
};

}  // namespace

void gemm_x8_vnni(const GemmArgs& a) {
  vnni::run_typed<X8Group>(a, kX8Rows);
}

}  // namespace tokenfab::kernels
