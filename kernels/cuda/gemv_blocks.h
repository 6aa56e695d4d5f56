#pragma once
// The weight layout of the quantized decode GEMV (gemv.cuh, GemvWeights::kQ4 and kQ8): a
// matrix's blocks of 32 elements split into two arrays, so that every load the kernel makes is
// aligned —
//   q:      (rows, k/2) bytes for kQ4 — a block's 16 bytes as in GGUF, byte j holding element j
//           in its low nibble and element j + 16 in its high one — or (rows, k) int8 for kQ8;
//   scales: (rows, k/32) pairs of fp16 bits (d in the low half, m in the high one), and
//           element = float(q)·d + m, each product and sum rounded in f32.
// Q4_1 keeps its (d, m); Q4_0's d·(q − 8) becomes m = −8·d (exact in fp16); Q8_0 is (d, 0).
// Every element then equals kernels::dequantize_row's value for the file's block exactly (bit for
// bit, but for Q4_0's zeros, which are +0 where d·(q − 8) gives −0 for a negative d).
// Built on the host from the file's blocks; plain C++.

#include <cstdint>
#include <vector>

#include "kernels/cpu/quant_types.h"

namespace tokenfab::kernels {

enum class GemvWeights : uint8_t {
  kBf16,  // (n, k) bf16 (GemvArgs::w)
  kQ4,    // GemvArgs::q and scales as above, from Q4_0 or Q4_1
  kQ8,    // from Q8_0
};

// The quantized GEMV form of a matrix type: kQ4 for Q4_0 and Q4_1, kQ8 for Q8_0, and kBf16 (no
// quantized form) for the others.
GemvWeights gemv_format(WeightType type);

// Bytes of quants per block of 32 elements in `format` (16 for kQ4, 32 for kQ8); each block also
// has its 4-byte scale pair.
inline int gemv_block_quant_bytes(GemvWeights format) {
  return format == GemvWeights::kQ4 ? 16 : 32;
}

// One matrix in the quantized GEMV's layout (format kBf16 while empty).
struct GemvBlocks {
  GemvWeights format = GemvWeights::kBf16;
  int64_t rows = 0, k = 0;
  std::vector<uint8_t> q;
  std::vector<uint32_t> scales;

  uint64_t bytes() const { return q.size() + scales.size() * sizeof(uint32_t); }
};

// Appends `rows` rows of k elements stored in `type`'s GGUF layout at `data` to `out`: the first
// call sets out's format and k, later calls (the parts of a stacked matrix) must match them.
// Returns false, leaving out unchanged, when the type has no quantized form, differs from out's
// format or k, k is not a multiple of 32, or a Q4_0 scale is too large for −8·d in fp16.
bool append_gemv_blocks(WeightType type, const void* data, int64_t rows, int64_t k,
                        GemvBlocks& out);

// Whether append_gemv_blocks accepts `rows` rows of k elements of `type` at `data` on their own:
// the type has a quantized form, k is a multiple of 32 and, for Q4_0, every scale is small enough.
bool gemv_blocks_representable(WeightType type, const void* data, int64_t rows, int64_t k);

// Element (row, i) as the GEMV computes it: float(q)·d + m, rounded in f32 after each operation.
float gemv_block_value(const GemvBlocks& blocks, int64_t row, int64_t i);

}  // namespace tokenfab::kernels
