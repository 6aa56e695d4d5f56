#pragma once
// The basics of the AVX-512 VNNI kernels over packed records (gemm_vnni_tiles.h,
// gemm_vnni_groups.h; only files compiled with the AVX-512 flags include these): record
// prefetches, the embedded-broadcast operand, the walk of a row group's records against a tile
// of columns, the vpdpbusd chains and the float steps per block.

#include <immintrin.h>

#include <cstdint>

#include "kernels/cpu/for_each_index.h"
#include "kernels/cpu/gemm.h"

namespace tokenfab::kernels::vnni {

// The first tile over a row group streams its records from memory and prefetches ahead of them;
// where a row group has more tiles, the second one prefetches the next group's records instead,
// so that the first tile of every group finds them in cache and the stream from memory spreads
// over the whole group's work.
enum class Prefetch { None, Ahead, NextGroup };

// prefetcht0 of the record at rec, line by line: volatile asm, as x8avx2::prefetch_ahead, so
// that GCC cannot delete the loop, whose only effect the prefetches are.
inline void prefetch_record(const uint8_t* rec, size_t bytes) {
  for (size_t line = 0; line < bytes; line += 64)
    __asm__ volatile("prefetcht0 %0" : : "m"(rec[line]));
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
// A group function's tile of columns c0 … c0 + C − 1: x[c] column c's activation blocks, acc[c]
// its accumulators (8 or 16 rows' sums), stored as the group's rows of column c at the end. Each
// group function walks its row group's records in its own loop, prefetch_records first: with the
// loop body passed as a lambda to a shared walker instead, GCC 12 kept the accumulators of the
// 3- to 7-column tiles on the stack (taken by reference) or copied them with 512-bit moves (taken
// by value; the 256-bit kernel ran up to 37 % slower).
template <class V, int C>
struct Tile {
  const BlockQ8A* x[C];
  typename V::F acc[C];

  Tile(const GemmArgs& a, int64_t c0) {
    for (int c = 0; c < C; ++c) {
      x[c] = reinterpret_cast<const BlockQ8A*>(a.x + (c0 + c) * a.x_stride);
      acc[c] = V::zero_f();
    }
  }
  void store(const GemmArgs& a, int64_t g, int64_t c0) const {
    for (int c = 0; c < C; ++c) V::store(a.y + (c0 + c) * a.ldy + g * V::kRows, acc[c]);
  }
};

// The prefetches of the record at rec (`bytes` long) under `mode` (Prefetch).
template <class V>
inline void prefetch_records(const GemmArgs& a, const uint8_t* rec, size_t bytes, Prefetch mode) {
  if (mode == Prefetch::Ahead) prefetch_record(rec + V::kPrefetchBytes, bytes);
  if (mode == Prefetch::NextGroup) prefetch_record(rec + a.w_stride, bytes);
}

// Weight vectors w[v] (unsigned bytes, four of each row per lane) meet the four activation
// bytes q + 4v: the exact Σ_v w[v]·q over v0 … v0 + N − 1 from `start`, one vpdpbusd chain.
template <class V, int N>
inline typename V::I chain(typename V::I start, const typename V::I* w, const int8_t* q, int v0) {
  typename V::I s = start;
  for (int v = v0; v < v0 + N; ++v) s = V::dpbusd_bcast(s, w[v], q + 4 * v);
  return s;
}

// The same over all 8 vectors (a whole Q8A block) in two interleaved chains (even and odd v), so
// that a column's block is not one 8-deep dependency.
template <class V>
inline typename V::I dot8(typename V::I start, const typename V::I* w, const int8_t* q) {
  typename V::I even = V::dpbusd_bcast(start, w[0], q);
  typename V::I odd = V::dpbusd_bcast(V::zero_i(), w[1], q + 4);
  for (int v = 2; v < 8; v += 2) {
    even = V::dpbusd_bcast(even, w[v], q + 4 * v);
    odd = V::dpbusd_bcast(odd, w[v + 1], q + 4 * v + 4);
  }
  return V::add_i32(even, odd);
}

// Sub-blocks of 16 elements (Q6_K, Q3_K, Q2_K): the first half's sum times sca, the second's
// times scb (per-row int32 scales).
template <class V>
inline typename V::I scaled_halves(const typename V::I* w, const int8_t* q, typename V::I sca,
                                   typename V::I scb) {
  return V::add_i32(V::mullo_i32(chain<V, 4>(V::zero_i(), w, q, 0), sca),
                    V::mullo_i32(chain<V, 4>(V::zero_i(), w, q, 4), scb));
}

// The four record vectors at qs (32 elements of each row in Q4_0's nibble order) as the 8
// vectors dot8 takes: w[k] the low nibbles of vector k (elements 4k..4k+3), w[4 + k] its high
// nibbles (elements 16+4k..).
template <class V>
inline void unpack_nibbles(const uint8_t* qs, typename V::I* w) {
  const typename V::I mask = V::set1_i8(0x0f);
  for (int k = 0; k < 4; ++k) {
    const typename V::I p = V::load(qs + 4 * V::kRows * k);
    w[k] = V::and_(p, mask);
    w[4 + k] = V::and_(V::srli16_4(p), mask);
  }
}

// The float steps of one activation block, as x8avx2::add_block (so that the results agree with
// the AVX2 kernels' bit for bit): acc += isum · (d · a.d).
template <class V>
inline typename V::F add_block(typename V::F acc, typename V::I isum, typename V::F d,
                               const BlockQ8A& x) {
  return V::fmadd(V::to_f(isum), V::mul(d, V::set1_f(x.d)), acc);
}

}  // namespace tokenfab::kernels::vnni
