#include "kernels/cuda/gemv_blocks.h"

#include <cmath>
#include <cstring>

namespace tokenfab::kernels {

namespace {

uint32_t scale_pair(uint16_t d, uint16_t m) {
  return static_cast<uint32_t>(d) | uint32_t{m} << 16;
}

}  // namespace

GemvWeights gemv_format(WeightType type) {
  switch (type) {
    case WeightType::Q4_0:
    case WeightType::Q4_1:
      return GemvWeights::kQ4;
    case WeightType::Q8_0:
      return GemvWeights::kQ8;
    default:
      return GemvWeights::kBf16;
  }
}

bool gemv_blocks_representable(WeightType type, const void* data, int64_t rows, int64_t k) {
  if (gemv_format(type) == GemvWeights::kBf16 || rows < 0 || k <= 0 || k % kQK != 0) return false;
  // Q4_0's offset as a minimum, −8·d: exact in fp16 unless it overflows (|d| above 8188); scales
  // up to 4096 are taken (real files' are far smaller), and a NaN or infinite one is not.
  if (type == WeightType::Q4_0) {
    const auto* b = static_cast<const BlockQ4_0*>(data);
    const int64_t blocks = rows * (k / kQK);
    for (int64_t i = 0; i < blocks; ++i)
      if (!(std::fabs(fp16_to_fp32(b[i].d)) <= 4096.0f)) return false;
  }
  return true;
}

bool append_gemv_blocks(WeightType type, const void* data, int64_t rows, int64_t k,
                        GemvBlocks& out) {
  const GemvWeights format = gemv_format(type);
  if (!gemv_blocks_representable(type, data, rows, k)) return false;
  if (out.format != GemvWeights::kBf16 && (out.format != format || out.k != k)) return false;
  const int64_t blocks = rows * (k / kQK);
  const size_t q0 = out.q.size(), s0 = out.scales.size();
  out.q.resize(q0 + static_cast<size_t>(blocks) * gemv_block_quant_bytes(format));
  out.scales.resize(s0 + static_cast<size_t>(blocks));
  uint8_t* q = out.q.data() + q0;
  uint32_t* scales = out.scales.data() + s0;
  for (int64_t i = 0; i < blocks; ++i) {
    switch (type) {
      case WeightType::Q4_0: {
        const BlockQ4_0& b = static_cast<const BlockQ4_0*>(data)[i];
        std::memcpy(q + 16 * i, b.qs, 16);
        scales[i] = scale_pair(b.d, fp32_to_fp16(-8.0f * fp16_to_fp32(b.d)));
        break;
      }
      case WeightType::Q4_1: {
        const BlockQ4_1& b = static_cast<const BlockQ4_1*>(data)[i];
        std::memcpy(q + 16 * i, b.qs, 16);
        scales[i] = scale_pair(b.d, b.m);
        break;
      }
      default: {  // Q8_0
        const BlockQ8_0& b = static_cast<const BlockQ8_0*>(data)[i];
        std::memcpy(q + 32 * i, b.qs, 32);
        scales[i] = scale_pair(b.d, 0);
        break;
      }
    }
  }
  out.format = format;
  out.k = k;
  out.rows += rows;
  return true;
}

float gemv_block_value(const GemvBlocks& blocks, int64_t row, int64_t i) {
  const int64_t block = row * (blocks.k / kQK) + i / kQK;
  const int j = static_cast<int>(i % kQK);
  const uint32_t pair = blocks.scales[static_cast<size_t>(block)];
  const float d = fp16_to_fp32(static_cast<uint16_t>(pair & 0xffff));
  const float m = fp16_to_fp32(static_cast<uint16_t>(pair >> 16));
  float q = 0.0f;
  if (blocks.format == GemvWeights::kQ4) {
    const uint8_t byte = blocks.q[static_cast<size_t>(block * 16 + j % 16)];
    q = static_cast<float>(j < 16 ? byte & 0x0f : byte >> 4);
  } else {
    int8_t v = 0;
    std::memcpy(&v, &blocks.q[static_cast<size_t>(block * 32 + j)], 1);
    q = static_cast<float>(v);
  }
  const float product = q * d;
  return product + m;
}

}  // namespace tokenfab::kernels
