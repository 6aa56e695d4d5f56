#include "kernels/cpu/gemm.h"

#include "kernels/cpu/cpu_features.h"

namespace tokenfab::kernels {

size_t activation_row_bytes(WeightType type, int64_t k) {
  return is_block_quantized(type) ? static_cast<size_t>(k / kQK) * sizeof(BlockQ8A)
                                  : static_cast<size_t>(k) * sizeof(float);
}

namespace {

// Integer dot of one weight block with one activation block, as the format defines it:
// returns the block's contribution to the row dot product.
float block_dot(WeightType type, const uint8_t* wblock, const BlockQ8A& a) {
  int sum = 0;
  switch (type) {
    case WeightType::Q4_0: {
      const auto& w = *reinterpret_cast<const BlockQ4_0*>(wblock);
      for (int j = 0; j < kQK / 2; ++j)
        sum += (w.qs[j] & 0x0f) * a.qs[j] + (w.qs[j] >> 4) * a.qs[j + kQK / 2];
      const float d = fp16_to_fp32(w.d);
      return d * a.d * static_cast<float>(sum) - 8.0f * d * a.s;
    }
    case WeightType::Q4_1: {
      const auto& w = *reinterpret_cast<const BlockQ4_1*>(wblock);
      for (int j = 0; j < kQK / 2; ++j)
        sum += (w.qs[j] & 0x0f) * a.qs[j] + (w.qs[j] >> 4) * a.qs[j + kQK / 2];
      return fp16_to_fp32(w.d) * a.d * static_cast<float>(sum) + fp16_to_fp32(w.m) * a.s;
    }
    case WeightType::Q8_0: {
      const auto& w = *reinterpret_cast<const BlockQ8_0*>(wblock);
      for (int i = 0; i < kQK; ++i) sum += w.qs[i] * a.qs[i];
      return fp16_to_fp32(w.d) * a.d * static_cast<float>(sum);
    }
    default: return 0.0f;
  }
}

float float_weight(WeightType type, const uint8_t* w, int64_t i) {
  switch (type) {
    case WeightType::F32: return reinterpret_cast<const float*>(w)[i];
    case WeightType::F16: return fp16_to_fp32(reinterpret_cast<const uint16_t*>(w)[i]);
    case WeightType::BF16: return bf16_to_fp32(reinterpret_cast<const uint16_t*>(w)[i]);
    default: return 0.0f;
  }
}

}  // namespace

void gemm_scalar(const GemmArgs& a) {
  const int64_t nb = a.k / kQK;
  const size_t wblock = row_bytes(a.type, kQK);
  for (int64_t c = 0; c < a.cols; ++c) {
    const uint8_t* xrow = a.x + c * a.x_stride;
    for (int64_t r = 0; r < a.rows; ++r) {
      const uint8_t* wrow = a.w + r * a.w_stride;
      float acc = 0.0f;
      if (is_block_quantized(a.type)) {
        const auto* xb = reinterpret_cast<const BlockQ8A*>(xrow);
        for (int64_t b = 0; b < nb; ++b) acc += block_dot(a.type, wrow + b * wblock, xb[b]);
      } else {
        const auto* xf = reinterpret_cast<const float*>(xrow);
        for (int64_t i = 0; i < a.k; ++i) acc += float_weight(a.type, wrow, i) * xf[i];
      }
      a.y[c * a.ldy + r] = acc;
    }
  }
}

void gemm(const GemmArgs& a) {
  if (use_avx2()) {
    gemm_avx2(a);
  } else {
    gemm_scalar(a);
  }
}

}  // namespace tokenfab::kernels
