#include "kernels/cpu/repack.h"

#include <cstring>

#include "kernels/cpu/cpu_features.h"

namespace tokenfab::kernels {

bool x8_supported(WeightType type) {
  return type == WeightType::Q4_0 || type == WeightType::Q4_1 || type == WeightType::Q8_0;
}

size_t packed_block_bytes(WeightType type, int group_rows) {
  const auto r = static_cast<size_t>(group_rows);
  switch (type) {
    case WeightType::Q4_0:
      return 2 * r + 16 * r;
    case WeightType::Q4_1:
      return 4 * r + 16 * r;
    case WeightType::Q8_0:
      return 2 * r + 32 * r;
    default:
      return 0;
  }
}

size_t x8_block_bytes(WeightType type) {
  return packed_block_bytes(type, kX8Rows);
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

// One record of R rows (R = 8 or 16): the R scales (and minimums), then each vector k of 4R
// bytes, four bytes per row in row order.
template <int R>
void pack_q4_record(WeightType type, const uint8_t* src, size_t src_stride, int64_t b,
                    uint8_t* out) {
  uint16_t d[R], m[R];
  uint8_t* qs = out + (type == WeightType::Q4_1 ? 4 * R : 2 * R);
  for (int r = 0; r < R; ++r) {
    const Q4View v = q4_block(type, src + r * src_stride, b);
    d[r] = v.d;
    m[r] = v.m;
    for (int k = 0; k < 4; ++k) std::memcpy(qs + 4 * R * k + 4 * r, v.qs + 4 * k, 4);
  }
  std::memcpy(out, d, sizeof d);
  if (type == WeightType::Q4_1) std::memcpy(out + 2 * R, m, sizeof m);
}

template <int R>
void pack_q8_record(const uint8_t* src, size_t src_stride, int64_t b, uint8_t* out) {
  uint16_t d[R];
  for (int r = 0; r < R; ++r) {
    const auto& blk = reinterpret_cast<const BlockQ8_0*>(src + r * src_stride)[b];
    d[r] = blk.d;
    for (int k = 0; k < 8; ++k) std::memcpy(out + 2 * R + 4 * R * k + 4 * r, blk.qs + 4 * k, 4);
  }
  std::memcpy(out, d, sizeof d);
}

template <int R>
void repack_groups(WeightType type, const uint8_t* src, size_t src_stride, uint8_t* dst,
                   int64_t rows, int64_t k) {
  const int64_t nb = k / kQK;
  const size_t record = packed_block_bytes(type, R);
  for (int64_t g = 0; g < rows / R; ++g) {
    const uint8_t* group_src = src + g * R * src_stride;
    for (int64_t b = 0; b < nb; ++b, dst += record) {
      if (type == WeightType::Q8_0) {
        pack_q8_record<R>(group_src, src_stride, b, dst);
      } else {
        pack_q4_record<R>(type, group_src, src_stride, b, dst);
      }
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
