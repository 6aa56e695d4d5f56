#include "kernels/cpu/quantize.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "kernels/cpu/cpu_features.h"

namespace tokenfab::kernels {

const char* weight_type_name(WeightType type) {
  switch (type) {
    case WeightType::F32: return "F32";
    case WeightType::F16: return "F16";
    case WeightType::BF16: return "BF16";
    case WeightType::Q4_0: return "Q4_0";
    case WeightType::Q4_1: return "Q4_1";
    case WeightType::Q8_0: return "Q8_0";
  }
  return "?";
}

bool is_block_quantized(WeightType type) {
  return type == WeightType::Q4_0 || type == WeightType::Q4_1 || type == WeightType::Q8_0;
}

uint64_t row_bytes(WeightType type, uint64_t n) {
  switch (type) {
    case WeightType::F32: return n * 4;
    case WeightType::F16:
    case WeightType::BF16: return n * 2;
    case WeightType::Q4_0: return n / kQK * sizeof(BlockQ4_0);
    case WeightType::Q4_1: return n / kQK * sizeof(BlockQ4_1);
    case WeightType::Q8_0: return n / kQK * sizeof(BlockQ8_0);
  }
  return 0;
}

void quantize_row_q4_0(const float* x, BlockQ4_0* y, int64_t n) {
  for (int64_t b = 0; b < n / kQK; ++b, x += kQK) {
    // The element of largest magnitude maps to -8 exactly, keeping its sign.
    float max = 0.0f, amax = 0.0f;
    for (int i = 0; i < kQK; ++i) {
      if (std::fabs(x[i]) > amax) {
        amax = std::fabs(x[i]);
        max = x[i];
      }
    }
    const float d = max / -8.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    y[b].d = fp32_to_fp16(d);
    for (int j = 0; j < kQK / 2; ++j) {
      const int lo = std::min(15, static_cast<int>(x[j] * id + 8.5f));
      const int hi = std::min(15, static_cast<int>(x[j + kQK / 2] * id + 8.5f));
      y[b].qs[j] = static_cast<uint8_t>(lo | (hi << 4));
    }
  }
}

void quantize_row_q4_1(const float* x, BlockQ4_1* y, int64_t n) {
  for (int64_t b = 0; b < n / kQK; ++b, x += kQK) {
    const auto [lo_it, hi_it] = std::minmax_element(x, x + kQK);
    const float min = *lo_it, max = *hi_it;
    const float d = (max - min) / 15.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    y[b].d = fp32_to_fp16(d);
    y[b].m = fp32_to_fp16(min);
    for (int j = 0; j < kQK / 2; ++j) {
      const int lo = std::min(15, static_cast<int>((x[j] - min) * id + 0.5f));
      const int hi = std::min(15, static_cast<int>((x[j + kQK / 2] - min) * id + 0.5f));
      y[b].qs[j] = static_cast<uint8_t>(lo | (hi << 4));
    }
  }
}

void quantize_row_q8_0(const float* x, BlockQ8_0* y, int64_t n) {
  for (int64_t b = 0; b < n / kQK; ++b, x += kQK) {
    float amax = 0.0f;
    for (int i = 0; i < kQK; ++i) amax = std::max(amax, std::fabs(x[i]));
    const float d = amax / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    y[b].d = fp32_to_fp16(d);
    for (int i = 0; i < kQK; ++i) y[b].qs[i] = static_cast<int8_t>(std::lrintf(x[i] * id));
  }
}

void quantize_row(WeightType type, const float* x, void* dst, int64_t n) {
  switch (type) {
    case WeightType::F32: std::copy(x, x + n, static_cast<float*>(dst)); return;
    case WeightType::F16: {
      auto* out = static_cast<uint16_t*>(dst);
      for (int64_t i = 0; i < n; ++i) out[i] = fp32_to_fp16(x[i]);
      return;
    }
    case WeightType::BF16: {
      auto* out = static_cast<uint16_t*>(dst);
      for (int64_t i = 0; i < n; ++i) out[i] = fp32_to_bf16(x[i]);
      return;
    }
    case WeightType::Q4_0: quantize_row_q4_0(x, static_cast<BlockQ4_0*>(dst), n); return;
    case WeightType::Q4_1: quantize_row_q4_1(x, static_cast<BlockQ4_1*>(dst), n); return;
    case WeightType::Q8_0: quantize_row_q8_0(x, static_cast<BlockQ8_0*>(dst), n); return;
  }
}

void dequantize_row(WeightType type, const void* src, float* y, int64_t n) {
  switch (type) {
    case WeightType::F32: {
      const auto* in = static_cast<const float*>(src);
      std::copy(in, in + n, y);
      return;
    }
    case WeightType::F16: {
      const auto* in = static_cast<const uint16_t*>(src);
      for (int64_t i = 0; i < n; ++i) y[i] = fp16_to_fp32(in[i]);
      return;
    }
    case WeightType::BF16: {
      const auto* in = static_cast<const uint16_t*>(src);
      for (int64_t i = 0; i < n; ++i) y[i] = bf16_to_fp32(in[i]);
      return;
    }
    case WeightType::Q4_0: {
      const auto* blocks = static_cast<const BlockQ4_0*>(src);
      for (int64_t b = 0; b < n / kQK; ++b, y += kQK) {
        const float d = fp16_to_fp32(blocks[b].d);
        for (int j = 0; j < kQK / 2; ++j) {
          y[j] = d * static_cast<float>((blocks[b].qs[j] & 0x0f) - 8);
          y[j + kQK / 2] = d * static_cast<float>((blocks[b].qs[j] >> 4) - 8);
        }
      }
      return;
    }
    case WeightType::Q4_1: {
      const auto* blocks = static_cast<const BlockQ4_1*>(src);
      for (int64_t b = 0; b < n / kQK; ++b, y += kQK) {
        const float d = fp16_to_fp32(blocks[b].d);
        const float m = fp16_to_fp32(blocks[b].m);
        for (int j = 0; j < kQK / 2; ++j) {
          y[j] = d * static_cast<float>(blocks[b].qs[j] & 0x0f) + m;
          y[j + kQK / 2] = d * static_cast<float>(blocks[b].qs[j] >> 4) + m;
        }
      }
      return;
    }
    case WeightType::Q8_0: {
      const auto* blocks = static_cast<const BlockQ8_0*>(src);
      for (int64_t b = 0; b < n / kQK; ++b, y += kQK) {
        const float d = fp16_to_fp32(blocks[b].d);
        for (int i = 0; i < kQK; ++i) y[i] = d * static_cast<float>(blocks[b].qs[i]);
      }
      return;
    }
  }
}

void quantize_row_q8a_scalar(const float* x, BlockQ8A* y, int64_t n) {
  for (int64_t b = 0; b < n / kQK; ++b, x += kQK) {
    float amax = 0.0f;
    for (int i = 0; i < kQK; ++i) amax = std::max(amax, std::fabs(x[i]));
    // For a block so small that 127/amax is not finite (amax < ~3.7e-37), q = x / d instead,
    // clamped because a subnormal d is coarse.
    const float id = amax != 0.0f ? 127.0f / amax : 0.0f;
    const bool tiny = !(id <= std::numeric_limits<float>::max());
    const float d = amax / 127.0f;
    int sum = 0;
    for (int i = 0; i < kQK; ++i) {
      const int q = d == 0.0f ? 0
                    : tiny    ? std::clamp(static_cast<int>(std::nearbyint(x[i] / d)), -127, 127)
                         : static_cast<int>(std::nearbyint(x[i] * id));
      y[b].qs[i] = static_cast<int8_t>(q);
      sum += q;
    }
    y[b].d = d;
    y[b].s = d * static_cast<float>(sum);
  }
}

void quantize_row_q8a(const float* x, BlockQ8A* y, int64_t n) {
  if (use_avx2()) {
    quantize_row_q8a_avx2(x, y, n);
  } else {
    quantize_row_q8a_scalar(x, y, n);
  }
}

}  // namespace tokenfab::kernels
