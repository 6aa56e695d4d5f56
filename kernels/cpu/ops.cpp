#include "kernels/cpu/ops.h"

#include <algorithm>
#include <cmath>

#include "kernels/cpu/cpu_features.h"
#include "kernels/cpu/quant_types.h"

namespace tokenfab::kernels {

void rms_norm(const float* x, const float* w, float* y, int64_t n, float eps) {
  double sum = 0.0;
  for (int64_t i = 0; i < n; ++i) sum += static_cast<double>(x[i]) * x[i];
  const float scale = 1.0f / std::sqrt(static_cast<float>(sum / static_cast<double>(n)) + eps);
  for (int64_t i = 0; i < n; ++i) y[i] = x[i] * scale * w[i];
}

void rope_table(int64_t pos, int rot_dim, float base, float* cos_out, float* sin_out) {
  for (int i = 0; i < rot_dim / 2; ++i) {
    const double theta = static_cast<double>(pos) *
                         std::pow(static_cast<double>(base), -2.0 * i / static_cast<double>(rot_dim));
    cos_out[i] = static_cast<float>(std::cos(theta));
    sin_out[i] = static_cast<float>(std::sin(theta));
  }
}

void rope_table_scaled(int64_t pos, int rot_dim, float base, float pos_scale, const float* factors,
                       float attn_factor, float* cos_out, float* sin_out) {
  for (int i = 0; i < rot_dim / 2; ++i) {
    double theta = static_cast<double>(pos) * static_cast<double>(pos_scale) *
                   std::pow(static_cast<double>(base), -2.0 * i / static_cast<double>(rot_dim));
    if (factors != nullptr) theta /= static_cast<double>(factors[i]);
    cos_out[i] = static_cast<float>(std::cos(theta) * attn_factor);
    sin_out[i] = static_cast<float>(std::sin(theta) * attn_factor);
  }
}

void rope_halves(float* x, int n_heads, int head_dim, int rot_dim, const float* cos_t,
                 const float* sin_t) {
  const int half = rot_dim / 2;
  for (int h = 0; h < n_heads; ++h) {
    float* v = x + static_cast<int64_t>(h) * head_dim;
    for (int i = 0; i < half; ++i) {
      const float a = v[i], b = v[i + half];
      v[i] = a * cos_t[i] - b * sin_t[i];
      v[i + half] = a * sin_t[i] + b * cos_t[i];
    }
  }
}

void gelu_tanh_mul(float* gate, const float* up, int64_t n) {
  constexpr float kSqrt2OverPi = 0.7978845608028654f;
  for (int64_t i = 0; i < n; ++i) {
    const float g = gate[i];
    gate[i] = 0.5f * g * (1.0f + std::tanh(kSqrt2OverPi * (g + 0.044715f * g * g * g))) * up[i];
  }
}

void softcap(float* x, int64_t n, float cap) {
  for (int64_t i = 0; i < n; ++i) x[i] = cap * std::tanh(x[i] / cap);
}

void rope(float* x, int n_heads, int head_dim, int rot_dim, const float* cos_t, const float* sin_t) {
  for (int h = 0; h < n_heads; ++h) {
    float* v = x + static_cast<int64_t>(h) * head_dim;
    for (int i = 0; i < rot_dim / 2; ++i) {
      const float a = v[2 * i], b = v[2 * i + 1];
      v[2 * i] = a * cos_t[i] - b * sin_t[i];
      v[2 * i + 1] = a * sin_t[i] + b * cos_t[i];
    }
  }
}

void silu_mul_scalar(float* gate, const float* up, int64_t n) {
  for (int64_t i = 0; i < n; ++i) gate[i] = gate[i] / (1.0f + std::exp(-gate[i])) * up[i];
}

void silu_mul(float* gate, const float* up, int64_t n) {
  if (use_avx2()) {
    silu_mul_avx2(gate, up, n);
  } else {
    silu_mul_scalar(gate, up, n);
  }
}

int64_t argmax_scalar(const float* x, int64_t n) {
  int64_t best = -1;
  for (int64_t i = 0; i < n; ++i) {
    if (std::isnan(x[i])) continue;
    if (best < 0 || x[i] > x[best]) best = i;
  }
  return best < 0 ? 0 : best;
}

int64_t argmax(const float* x, int64_t n) {
  return use_avx2() ? argmax_avx2(x, n) : argmax_scalar(x, n);
}

void fp32_to_fp16_row(const float* x, uint16_t* y, int64_t n) {
  if (use_avx2()) {
    fp32_to_fp16_row_avx2(x, y, n);
    return;
  }
  for (int64_t i = 0; i < n; ++i) y[i] = fp32_to_fp16(x[i]);
}

void add_inplace(float* y, const float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] += x[i];
}

void softmax_scalar(float* x, int64_t n) {
  const float max = *std::max_element(x, x + n);
  double sum = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    x[i] = std::exp(x[i] - max);
    sum += x[i];
  }
  const float inv = static_cast<float>(1.0 / sum);
  for (int64_t i = 0; i < n; ++i) x[i] *= inv;
}

}  // namespace tokenfab::kernels
