#include "kernels/cpu/repack.h"

#include <cstring>

#include "kernels/cpu/cpu_features.h"

namespace tokenfab::kernels {

bool x8_supported(WeightType type) {
  return is_block_quantized(type);
}

size_t packed_block_bytes(WeightType type, int group_rows) {
  return x8_supported(type) ? static_cast<size_t>(group_rows) * block_bytes(type) : 0;
}

size_t x8_block_bytes(WeightType type) {
  return packed_block_bytes(type, kX8Rows);
}

namespace {

// Writes one record of R rows (R = 8 or 16) field by field (repack.h); `blocks[r]` is row r's
// GGUF block, `out` advances past each field.
template <int R>
struct RecordWriter {
  const uint8_t* const* blocks;
  uint8_t* out;

  // `units` units of `unit` bytes from byte `offset` of each block: unit u of row r at
  // out + unit·(R·u + r). Words (unit 4) make the level vectors, pairs (unit 2) the Q6_K / Q2_K
  // scales, one unit of 2 an fp16 per row.
  void interleave(size_t offset, int units, int unit) {
    for (int u = 0; u < units; ++u)
      for (int r = 0; r < R; ++r)
        std::memcpy(out + unit * (R * u + r), blocks[r] + offset + unit * u, unit);
    out += static_cast<size_t>(units) * unit * R;
  }
  void halves(size_t offset) { interleave(offset, 1, 2); }
  void words(size_t offset, int n) { interleave(offset, n, 4); }
  void pairs(size_t offset, int n) { interleave(offset, n, 2); }

  // Q5_0 / Q5_1: the fifth bits in the order of the qs words (qh' in repack.h).
  void fifth_bits(size_t qh_offset) {
    for (int r = 0; r < R; ++r) {
      uint32_t qh;
      std::memcpy(&qh, blocks[r] + qh_offset, sizeof qh);
      uint8_t bytes[4] = {};
      for (int j = 0; j < 4; ++j)
        for (int k = 0; k < 4; ++k)
          bytes[j] |= static_cast<uint8_t>(((qh >> (4 * k + j)) & 1) << k |
                                           ((qh >> (16 + 4 * k + j)) & 1) << (4 + k));
      std::memcpy(out + 4 * r, bytes, sizeof bytes);
    }
    out += 4 * R;
  }
};

template <int R>
void pack_record(WeightType type, const uint8_t* const* blocks, uint8_t* out) {
  RecordWriter<R> w{blocks, out};
  switch (type) {
    case WeightType::Q4_0:
    case WeightType::IQ4_NL:
      w.halves(0);
      w.words(2, 4);
      return;
    case WeightType::Q4_1:
      w.halves(0);
      w.halves(2);
      w.words(4, 4);
      return;
    case WeightType::Q8_0:
      w.halves(0);
      w.words(2, 8);
      return;
    case WeightType::Q5_0:
      w.halves(offsetof(BlockQ5_0, d));
      w.fifth_bits(offsetof(BlockQ5_0, qh));
      w.words(offsetof(BlockQ5_0, qs), 4);
      return;
    case WeightType::Q5_1:
      w.halves(offsetof(BlockQ5_1, d));
      w.halves(offsetof(BlockQ5_1, m));
      w.fifth_bits(offsetof(BlockQ5_1, qh));
      w.words(offsetof(BlockQ5_1, qs), 4);
      return;
    case WeightType::Q4_K:
      w.halves(offsetof(BlockQ4_K, d));
      w.halves(offsetof(BlockQ4_K, dmin));
      w.words(offsetof(BlockQ4_K, scales), 3);
      w.words(offsetof(BlockQ4_K, qs), 32);
      return;
    case WeightType::Q5_K:
      w.halves(offsetof(BlockQ5_K, d));
      w.halves(offsetof(BlockQ5_K, dmin));
      w.words(offsetof(BlockQ5_K, scales), 3);
      w.words(offsetof(BlockQ5_K, qh), 8);
      w.words(offsetof(BlockQ5_K, qs), 32);
      return;
    case WeightType::Q6_K:
      w.halves(offsetof(BlockQ6_K, d));
      w.pairs(offsetof(BlockQ6_K, scales), 8);
      w.words(offsetof(BlockQ6_K, ql), 32);
      w.words(offsetof(BlockQ6_K, qh), 16);
      return;
    case WeightType::Q3_K:
      w.halves(offsetof(BlockQ3_K, d));
      w.words(offsetof(BlockQ3_K, scales), 3);
      w.words(offsetof(BlockQ3_K, hmask), 8);
      w.words(offsetof(BlockQ3_K, qs), 16);
      return;
    case WeightType::Q2_K:
      w.halves(offsetof(BlockQ2_K, d));
      w.halves(offsetof(BlockQ2_K, dmin));
      w.pairs(offsetof(BlockQ2_K, scales), 8);
      w.words(offsetof(BlockQ2_K, qs), 16);
      return;
    case WeightType::IQ4_XS:
      w.halves(offsetof(BlockIQ4_XS, d));
      w.halves(offsetof(BlockIQ4_XS, scales_h));
      w.words(offsetof(BlockIQ4_XS, scales_l), 1);
      w.words(offsetof(BlockIQ4_XS, qs), 32);
      return;
    default:
      return;
  }
}

template <int R>
void repack_groups(WeightType type, const uint8_t* src, size_t src_stride, uint8_t* dst,
                   int64_t rows, int64_t k) {
  const int64_t nb = k / block_elements(type);
  const size_t block = static_cast<size_t>(block_bytes(type));
  const size_t record = packed_block_bytes(type, R);
  for (int64_t g = 0; g < rows / R; ++g) {
    const uint8_t* group_src = src + g * R * src_stride;
    for (int64_t b = 0; b < nb; ++b, dst += record) {
      const uint8_t* blocks[R];
      for (int r = 0; r < R; ++r) blocks[r] = group_src + r * src_stride + b * block;
      pack_record<R>(type, blocks, dst);
    }
  }
}

}  // namespace

void expand_q8b(const BlockQ8A* x, BlockQ8B* y, int64_t nb) {
  for (int64_t b = 0; b < nb; ++b) {
    BlockQ8B& out = y[b];
    out.d = x[b].d;
    out.s = x[b].s;
    std::memset(out.pad, 0, sizeof out.pad);
    for (int k = 0; k < 4; ++k) {
      int32_t lo, hi;
      std::memcpy(&lo, x[b].qs + 4 * k, sizeof lo);
      std::memcpy(&hi, x[b].qs + 16 + 4 * k, sizeof hi);
      for (int lane = 0; lane < 8; ++lane) {
        out.q[2 * k][lane] = lo;
        out.q[2 * k + 1][lane] = hi;
      }
    }
  }
}

void repack_x8(WeightType type, const uint8_t* src, size_t src_stride, uint8_t* dst, int64_t rows,
               int64_t k) {
  repack_groups<kX8Rows>(type, src, src_stride, dst, rows, k);
}

void repack_x16(WeightType type, const uint8_t* src, size_t src_stride, uint8_t* dst, int64_t rows,
                int64_t k) {
  repack_groups<kX16Rows>(type, src, src_stride, dst, rows, k);
}

void repack(WeightType type, int group_rows, const uint8_t* src, size_t src_stride, uint8_t* dst,
            int64_t rows, int64_t k) {
  if (group_rows == kX16Rows) {
    repack_x16(type, src, src_stride, dst, rows, k);
  } else {
    repack_x8(type, src, src_stride, dst, rows, k);
  }
}

int preferred_group_rows(WeightType type, int64_t rows) {
  if (!x8_supported(type)) return 0;
  if (use_avx512_vnni() && rows % kX16Rows == 0) return kX16Rows;
  if (use_avx2() && rows % kX8Rows == 0) return kX8Rows;
  return 0;
}

}  // namespace tokenfab::kernels
