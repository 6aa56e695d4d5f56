#pragma once
// Row-interleaved ("x8") weight layouts for the AVX2 kernels, built once at load time from the
// GGUF blocks. Rows are taken in groups of 8; for each group and each block index b the packed
// record holds the 8 rows' blocks b, rearranged so that one 32-byte vector holds the same few
// elements (or the same scale) of all 8 rows, four bytes (or one 32-bit lane) per row in row
// order. For Q4_0 / Q4_1 (144 / 160 bytes):
//   d[8]  fp16 scales of the 8 rows' blocks b
//   m[8]  fp16 minimums (Q4_1 only)
//   qs    4 × 32 bytes; vector k, byte 4r+j = GGUF qs byte 4k+j of row r, i.e. low nibble =
//         element 4k+j, high nibble = element 16+4k+j of row r
// and for Q8_0 (272 bytes):
//   d[8]  fp16 scales
//   qs    8 × 32 bytes; vector k, byte 4r+j = element 4k+j of row r
// One 32-bit broadcast of four activation bytes then multiplies the same four elements of all
// eight rows at once, and the eight row sums of a block land in the eight lanes of one register.
//
// The other types, in the same manner. "words W of F" below: the GGUF field F of each row read
// as 4-byte words, vector w holding word w of the 8 rows (byte 4r+j = byte 4w+j of row r's F);
// "pairs" likewise with 2-byte units (2r+j); "d[8]" one fp16 per row.
//   Q5_0    d[8] | qh' | words 0..3 of qs                                    (176 bytes)
//   Q5_1    d[8] | m[8] | qh' | words 0..3 of qs                             (192)
//           qh': one word per row, byte j holding the fifth bits of the two nibbles of byte j
//           of each qs word k: bit k = GGUF qh bit 4k+j (the low nibble's element), bit 4+k = qh
//           bit 16+4k+j (the high nibble's)
//   IQ4_NL  as Q4_0                                                          (144)
//   Q4_K    d[8] | dmin[8] | words 0..2 of scales | words 0..31 of qs        (1152)
//   Q5_K    d[8] | dmin[8] | words 0..2 of scales | words 0..7 of qh | words 0..31 of qs (1408)
//   Q6_K    d[8] | pairs 0..7 of scales | words 0..31 of ql | words 0..15 of qh  (1680)
//   Q3_K    d[8] | words 0..2 of scales | words 0..7 of hmask | words 0..15 of qs  (880)
//   Q2_K    d[8] | dmin[8] | pairs 0..7 of scales | words 0..15 of qs       (672)
//   IQ4_XS  d[8] | scales_h[8] | words 0 of scales_l | words 0..31 of qs     (1088)
// In the super-block types each 32-byte piece of a GGUF level field (qs, ql, qh, hmask) holds,
// in its bytes l = 0..31, element l of one or several 32-element sub-blocks (nibbles, bit pairs,
// single bits), so vectors 8p..8p+7 meet the eight four-byte groups of those sub-blocks' Q8A
// blocks. The bytes per row are exactly those of the GGUF layout (packed_block_bytes(type, R) ==
// R · block_bytes(type)), so decode reads no more memory and a packed matrix takes the bytes of
// the file's.

#include <cstddef>
#include <cstdint>

#include "kernels/cpu/gemm.h"
#include "kernels/cpu/quant_types.h"

namespace tokenfab::kernels {

inline constexpr int kX8Rows = 8;
// The x16 layout is the same with 16 rows a group (d[16], m[16], each vector 64 bytes: four bytes
// of each of 16 rows), for the AVX-512 kernel whose 512-bit vectors take a whole record vector
// (gemm_x16_vnni). Where both kernels run, the results are the same bit for bit.
inline constexpr int kX16Rows = 16;

// Every block-quantized type has the x8 and x16 layouts (the float types none).
bool x8_supported(WeightType type);
// Bytes of one packed record (group_rows rows × one block): group_rows · block_bytes(type).
size_t packed_block_bytes(WeightType type, int group_rows);
size_t x8_block_bytes(WeightType type);
// Bytes between consecutive row groups for rows of k elements.
inline size_t packed_group_stride(WeightType type, int group_rows, int64_t k) {
  return packed_block_bytes(type, group_rows) * static_cast<size_t>(k / block_elements(type));
}
inline size_t x8_group_stride(WeightType type, int64_t k) {
  return packed_group_stride(type, kX8Rows, k);
}

// src: `rows` GGUF rows (rows % 8 == 0) `src_stride` bytes apart; dst: rows/8 groups.
void repack_x8(WeightType type, const uint8_t* src, size_t src_stride, uint8_t* dst, int64_t rows,
               int64_t k);
// The same into rows/16 groups of the x16 layout (rows % 16 == 0).
void repack_x16(WeightType type, const uint8_t* src, size_t src_stride, uint8_t* dst, int64_t rows,
                int64_t k);
// repack_x8 or repack_x16 by group_rows (8 or 16).
void repack(WeightType type, int group_rows, const uint8_t* src, size_t src_stride, uint8_t* dst,
            int64_t rows, int64_t k);
// The packing this CPU's kernels read fastest for a matrix of `rows` rows of `type`: 16 (x16)
// with AVX-512 VNNI, 8 (x8) with AVX2, 0 (the GGUF rows) otherwise or where the rows do not
// divide into groups.
int preferred_group_rows(WeightType type, int64_t rows);

// GemmArgs as for gemm(), except w points at packed row groups, w_stride is the group stride,
// and rows is a multiple of 8. Same results as gemm_scalar on the GGUF layout, up to float
// summation order. (Q5_0, Q5_1, IQ4_NL: gemm_x8_q5_avx2.cpp; the super-block types:
// gemm_x8_kquants_avx2.cpp.)
void gemm_x8_avx2(const GemmArgs& a);
void gemm_x8_q5_avx2(const GemmArgs& a);
void gemm_x8_kquants_avx2(const GemmArgs& a);

// Activations for the Q4 x8 kernel at prefill widths: one BlockQ8A with its four-byte groups
// already broadcast, in the order the kernel multiplies them (q[2k]: bytes 4k..4k+3, the elements
// the low nibbles of weight vector k hold; q[2k+1]: bytes 16+4k..16+4k+3, the high nibbles'), so
// the kernel reads each straight into its multiply instead of broadcasting it for every row group
// (the broadcasts compete with the multiplies for the vector pipes). 288 bytes per 32 elements:
// worth it once enough columns share each row group's unpacked weights.
struct alignas(32) BlockQ8B {
  float d;
  float s;
  uint8_t pad[24];
  int32_t q[8][8];
};
static_assert(sizeof(BlockQ8B) == 288);

// Narrower inputs keep the BlockQ8A layout: at decode-batch widths the weights come from memory,
// and Q8B's shorter column chunks (gemm_x8_q8b_avx2) would read them more than once per call.
inline constexpr int64_t kQ8BMinCols = 64;

void expand_q8b(const BlockQ8A* x, BlockQ8B* y, int64_t nb);
// As gemm_x8_avx2 for Q4_0 / Q4_1 weights, with x pointing at BlockQ8B rows (x_stride bytes apart).
void gemm_x8_q8b_avx2(const GemmArgs& a);

// AVX-512 VNNI (256-bit vectors, AVX512VL) version of gemm_x8_avx2 for every packed type on
// BlockQ8A rows at any width (gemm_x8_avx512.cpp); equal to gemm_x8_avx2 bit for bit.
void gemm_x8_vnni(const GemmArgs& a);

// The same on the x16 layout with 512-bit vectors (gemm_x16_avx512.cpp): GemmArgs as for
// gemm_x8_avx2 with w at x16 row groups, w_stride the x16 group stride and rows % 16 == 0; each
// row's integer sums and float steps are gemm_x8_avx2's, so its results are too, bit for bit.
// Needs AVX-512 VNNI.
void gemm_x16_vnni(const GemmArgs& a);

}  // namespace tokenfab::kernels
