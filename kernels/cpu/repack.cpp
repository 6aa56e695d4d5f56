#include "kernels/cpu/repack.h"

#include <cstring>

namespace tokenfab::kernels {

bool x8_supported(WeightType type) {
  return type == WeightType::Q4_0 || type == WeightType::Q4_1 || type == WeightType::Q8_0;
}

size_t x8_block_bytes(WeightType type) {
  switch (type) {
    case WeightType::Q4_0: return 16 + 128;
    case WeightType::Q4_1: return 32 + 128;
    case WeightType::Q8_0: return 16 + 256;
    default: return 0;
  }
}

namespace {

struct Q4View {
  uint16_t d;
  uint16_t m;
  const uint8_t* qs;
};

Q4View q4_block(WeightType type, const uint8_t* row, int64_t b) {
  if (type == WeightType::Q4_0) {
    const auto& blk = reinterpret_cast<const BlockQ4_0*>(row)[b];
    return {blk.d, 0, blk.qs};
  }
  const auto& blk = reinterpret_cast<const BlockQ4_1*>(row)[b];
  return {blk.d, blk.m, blk.qs};
}

void pack_q4_record(WeightType type, const uint8_t* src, size_t src_stride, int64_t b, uint8_t* out) {
  uint16_t d[kX8Rows], m[kX8Rows];
  uint8_t* qs = out + (type == WeightType::Q4_1 ? 32 : 16);
  for (int r = 0; r < kX8Rows; ++r) {
    const Q4View v = q4_block(type, src + r * src_stride, b);
    d[r] = v.d;
    m[r] = v.m;
    for (int k = 0; k < 4; ++k) std::memcpy(qs + 32 * k + 4 * r, v.qs + 4 * k, 4);
  }
  std::memcpy(out, d, sizeof d);
  if (type == WeightType::Q4_1) std::memcpy(out + 16, m, sizeof m);
}

void pack_q8_record(const uint8_t* src, size_t src_stride, int64_t b, uint8_t* out) {
  uint16_t d[kX8Rows];
  for (int r = 0; r < kX8Rows; ++r) {
    const auto& blk = reinterpret_cast<const BlockQ8_0*>(src + r * src_stride)[b];
    d[r] = blk.d;
    for (int k = 0; k < 8; ++k) std::memcpy(out + 16 + 32 * k + 4 * r, blk.qs + 4 * k, 4);
  }
  std::memcpy(out, d, sizeof d);
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
  const int64_t nb = k / kQK;
  const size_t record = x8_block_bytes(type);
  for (int64_t g = 0; g < rows / kX8Rows; ++g) {
    const uint8_t* group_src = src + g * kX8Rows * src_stride;
    for (int64_t b = 0; b < nb; ++b, dst += record) {
      if (type == WeightType::Q8_0) {
        pack_q8_record(group_src, src_stride, b, dst);
      } else {
        pack_q4_record(type, group_src, src_stride, b, dst);
      }
    }
  }
}

}  // namespace tokenfab::kernels
