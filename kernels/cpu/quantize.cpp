#include "kernels/cpu/quantize.h"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdio>
#include <cstring>
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
    case WeightType::Q5_0: return "Q5_0";
    case WeightType::Q5_1: return "Q5_1";
    case WeightType::Q2_K: return "Q2_K";
    case WeightType::Q3_K: return "Q3_K";
    case WeightType::Q4_K: return "Q4_K";
    case WeightType::Q5_K: return "Q5_K";
    case WeightType::Q6_K: return "Q6_K";
    case WeightType::IQ4_NL: return "IQ4_NL";
    case WeightType::IQ4_XS: return "IQ4_XS";
  }
  return "?";
}

bool is_block_quantized(WeightType type) {
  return block_elements(type) > 1;
}

uint64_t row_bytes(WeightType type, uint64_t n) {
  const int elements = block_elements(type);
  return elements > 0 ? n / static_cast<uint64_t>(elements) * block_bytes(type) : 0;
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
    case WeightType::Q5_0: quantize_row_q5_0(x, static_cast<BlockQ5_0*>(dst), n); return;
    case WeightType::Q5_1: quantize_row_q5_1(x, static_cast<BlockQ5_1*>(dst), n); return;
    case WeightType::Q2_K: quantize_row_q2_k(x, static_cast<BlockQ2_K*>(dst), n); return;
    case WeightType::Q3_K: quantize_row_q3_k(x, static_cast<BlockQ3_K*>(dst), n); return;
    case WeightType::Q4_K: quantize_row_q4_k(x, static_cast<BlockQ4_K*>(dst), n); return;
    case WeightType::Q5_K: quantize_row_q5_k(x, static_cast<BlockQ5_K*>(dst), n); return;
    case WeightType::Q6_K: quantize_row_q6_k(x, static_cast<BlockQ6_K*>(dst), n); return;
    case WeightType::IQ4_NL: quantize_row_iq4_nl(x, static_cast<BlockIQ4_NL*>(dst), n); return;
    case WeightType::IQ4_XS: quantize_row_iq4_xs(x, static_cast<BlockIQ4_XS*>(dst), n); return;
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
    case WeightType::Q5_0: dequantize_row_q5_0(static_cast<const BlockQ5_0*>(src), y, n); return;
    case WeightType::Q5_1: dequantize_row_q5_1(static_cast<const BlockQ5_1*>(src), y, n); return;
    case WeightType::Q2_K: dequantize_row_q2_k(static_cast<const BlockQ2_K*>(src), y, n); return;
    case WeightType::Q3_K: dequantize_row_q3_k(static_cast<const BlockQ3_K*>(src), y, n); return;
    case WeightType::Q4_K: dequantize_row_q4_k(static_cast<const BlockQ4_K*>(src), y, n); return;
    case WeightType::Q5_K: dequantize_row_q5_k(static_cast<const BlockQ5_K*>(src), y, n); return;
    case WeightType::Q6_K: dequantize_row_q6_k(static_cast<const BlockQ6_K*>(src), y, n); return;
    case WeightType::IQ4_NL:
      dequantize_row_iq4_nl(static_cast<const BlockIQ4_NL*>(src), y, n);
      return;
    case WeightType::IQ4_XS:
      dequantize_row_iq4_xs(static_cast<const BlockIQ4_XS*>(src), y, n);
      return;
  }
}

namespace {

// Where a block type keeps its fp16 scales: byte offsets within the block, and their names.
struct ScaleField {
  int offset;  // -1: none
  const char* name;
};
struct ScaleFields {
  ScaleField first, second;
};

ScaleFields scale_fields(WeightType type) {
  constexpr ScaleField kNone{-1, ""};
  switch (type) {
    case WeightType::F32:
    case WeightType::F16:
    case WeightType::BF16: return {kNone, kNone};
    case WeightType::Q4_0:
    case WeightType::Q8_0:
    case WeightType::Q5_0:
    case WeightType::IQ4_NL:
    case WeightType::IQ4_XS: return {{0, "d"}, kNone};  // d first in each
    case WeightType::Q4_1:
    case WeightType::Q5_1: return {{0, "d"}, {2, "m"}};
    case WeightType::Q4_K:
    case WeightType::Q5_K: return {{0, "d"}, {2, "dmin"}};
    case WeightType::Q2_K:
      return {{offsetof(BlockQ2_K, d), "d"}, {offsetof(BlockQ2_K, dmin), "dmin"}};
    case WeightType::Q3_K: return {{offsetof(BlockQ3_K, d), "d"}, kNone};
    case WeightType::Q6_K: return {{offsetof(BlockQ6_K, d), "d"}, kNone};
  }
  return {kNone, kNone};
}

inline uint16_t load_u16(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

}  // namespace

std::string describe_bad_block(WeightType type, const void* row, int64_t n) {
  const ScaleFields f = scale_fields(type);
  if (f.first.offset < 0) return {};
  const auto* bytes = static_cast<const uint8_t*>(row);
  const int64_t stride = block_bytes(type);
  const int64_t blocks = n / block_elements(type);
  for (int64_t b = 0; b < blocks; ++b) {
    const uint8_t* block = bytes + b * stride;
    for (const ScaleField& field : {f.first, f.second}) {
      if (field.offset < 0) continue;
      const uint16_t h = load_u16(block + field.offset);
      if ((h & 0x7c00) != 0x7c00) continue;  // finite: exponent not all ones
      const char* what = (h & 0x03ff) ? "nan" : (h & 0x8000) ? "-inf" : "inf";
      char hex[8];
      std::snprintf(hex, sizeof hex, "%04x", static_cast<unsigned>(h));
      return "block " + std::to_string(b) + " of " + weight_type_name(type) + ": " + field.name +
             " is " + what + " (fp16 0x" + hex + ")";
    }
  }
  return {};
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
