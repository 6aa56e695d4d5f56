#pragma once
// The basics of the AVX-512 VNNI kernels over packed records (gemm_vnni_tiles.h,
// gemm_vnni_groups.h; only files compiled with the AVX-512 flags include these): record
// prefetches, the embedded-broadcast operand, the columns of a tile.

#include <immintrin.h>

#include <cstdint>
#include <utility>

#include "kernels/cpu/gemm.h"

namespace tokenfab::kernels::vnni {

// The first tile over a row group streams its records from memory and prefetches ahead of them;
// where a row group has more tiles, the second one prefetches the next group's records instead,
// so that the first tile of every group finds them in cache and the stream from memory spreads
// over the whole group's work.
enum class Prefetch { None, Ahead, NextGroup };

inline void prefetch_record(const uint8_t* rec, size_t bytes) {
  for (size_t line = 0; line < bytes; line += 64)
    _mm_prefetch(reinterpret_cast<const char*>(rec + line), _MM_HINT_T0);
}

// Four activation bytes, read by vpdpbusd's embedded broadcast.
using Bytes4 = int32_t __attribute__((may_alias, aligned(1)));

// The group functions of both kernels, written once over a vector width's operations V (a struct
// in each kernel's file): V::I and V::F its integer and float vectors, V::kRows the rows of a
// record (one per 32-bit lane), V::kPrefetchBytes how far ahead the first tile over a row group
// prefetches its records, and dpbusd_bcast (vpdpbusd with the four activation bytes at p
// broadcast to every lane from memory), load / load_half (record bytes; fp16 scales to floats)
// and plain lane-wise operations (V256 / V512 list them). Records: repack.h.
//
// The activation blocks of columns c0 … c0 + C − 1. (The group functions spell their record
// prefetches out: GCC 12 at -O3 dropped every prefetch of a helper function holding them, whose
// only effect they are.)
template <int C>
inline void column_blocks(const GemmArgs& a, int64_t c0, const BlockQ8A* (&x)[C]) {
  for (int c = 0; c < C; ++c) x[c] = reinterpret_cast<const BlockQ8A*>(a.x + (c0 + c) * a.x_stride);
}

// The float steps of one activation block, as x8avx2::add_block (so that the results agree with
// the AVX2 kernels' bit for bit): acc += isum · (d · a.d).
template <class V>
inline typename V::F add_block(typename V::F acc, typename V::I isum, typename V::F d,
                               const BlockQ8A& x) {
  return V::fmadd(V::to_f(isum), V::mul(d, V::set1_f(x.d)), acc);
}

// f(std::integral_constant<int, J>) for J = 0 … N − 1, each J a compile-time constant (the
// immediates of the shifts that unpack block J).
template <int N, typename F>
inline void for_each_index(F&& f) {
  [&]<int... J>(std::integer_sequence<int, J...>) {
    (f(std::integral_constant<int, J>{}), ...);
  }
  (std::make_integer_sequence<int, N>{});
}

}  // namespace tokenfab::kernels::vnni
