// IQ4_NL (blocks of 32) and IQ4_XS (super-blocks of 256): 4-bit indices into the non-linear
// table kIQ4Values. Dequantizers in ggml's order of operations; quantizers that search each
// block's scale against the table (quant_search.h).

#include "kernels/cpu/quant_search.h"
#include "kernels/cpu/quantize.h"

namespace tokenfab::kernels {

using quant::kIQ4Nearest;

namespace {

// Candidate scales per block of 32: the largest value on −127 + t, |t| ≤ kIQ4TriesLow, or on
// 113 + t, |t| ≤ kIQ4TriesHigh.
constexpr int kIQ4TriesLow = 5;
constexpr int kIQ4TriesHigh = 3;
constexpr int kIQ4Refine = 1;

// Indices nearest to x / d for 32 values, packed in Q4_0's nibble order; returns the squared
// error of d · kIQ4Values[index].
float pack_iq4(const float* x, float d, uint8_t* qs) {
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  uint8_t q[kQK];
  float err = 0.0f;
  for (int i = 0; i < kQK; ++i) {
    q[i] = static_cast<uint8_t>(kIQ4Nearest(x[i] * id));
    const float e = d * static_cast<float>(kIQ4Values[q[i]]) - x[i];
    err += e * e;
  }
  for (int j = 0; j < kQK / 2; ++j) qs[j] = static_cast<uint8_t>(q[j] | q[j + kQK / 2] << 4);
  return err;
}

}  // namespace

void quantize_row_iq4_nl(const float* x, BlockIQ4_NL* y, int64_t n) {
  for (int64_t b = 0; b < n / kQK; ++b, x += kQK) {
    y[b].d = fp32_to_fp16(quant::search_scale_iq4<kQK>(x, kIQ4TriesLow, kIQ4TriesHigh, kIQ4Refine));
    pack_iq4(x, fp16_to_fp32(y[b].d), y[b].qs);
  }
}

// Per sub-block of 32 a continuous scale from the search; the super-block scale d puts the one of
// largest magnitude on −32 (ls = 0); then each sub-block's 6-bit ls is rounded and, of ls − 1, ls
// and ls + 1, the one with the least error under the final d is kept.
void quantize_row_iq4_xs(const float* x, BlockIQ4_XS* y, int64_t n) {
  for (int64_t b = 0; b < n / kQK_K; ++b, x += kQK_K) {
    float scale[8], smax = 0.0f;
    for (int s = 0; s < 8; ++s) {
      scale[s] = quant::search_scale_iq4<kQK>(x + kQK * s, kIQ4TriesLow, kIQ4TriesHigh, kIQ4Refine);
      if (std::fabs(scale[s]) > std::fabs(smax)) smax = scale[s];
    }
    y[b].d = fp32_to_fp16(smax / -32.0f);
    const float d = fp16_to_fp32(y[b].d);
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    y[b].scales_h = 0;
    std::fill(y[b].scales_l, y[b].scales_l + 4, uint8_t{0});
    for (int s = 0; s < 8; ++s) {
      const float* xs = x + kQK * s;
      uint8_t* qs = y[b].qs + 16 * s;
      const int ls0 = static_cast<int>(quant::round_clamped(scale[s] * id, -32.0f, 31.0f)) + 32;
      int best_ls = ls0;
      float best_err = pack_iq4(xs, d * static_cast<float>(ls0 - 32), qs);
      for (const int ls : {ls0 - 1, ls0 + 1}) {
        if (ls < 0 || ls > 63) continue;
        uint8_t trial[16];
        const float err = pack_iq4(xs, d * static_cast<float>(ls - 32), trial);
        if (err < best_err) {
          best_err = err;
          best_ls = ls;
          std::copy(trial, trial + 16, qs);
        }
      }
      y[b].scales_l[s / 2] |= static_cast<uint8_t>((best_ls & 0x0f) << 4 * (s % 2));
      y[b].scales_h |= static_cast<uint16_t>((best_ls >> 4) << 2 * s);
    }
  }
}

// ggml: y = d · kvalues[q].
void dequantize_row_iq4_nl(const BlockIQ4_NL* x, float* y, int64_t n) {
  for (int64_t b = 0; b < n / kQK; ++b, y += kQK) {
    const float d = fp16_to_fp32(x[b].d);
    for (int j = 0; j < kQK / 2; ++j) {
      y[j] = d * static_cast<float>(kIQ4Values[x[b].qs[j] & 0x0f]);
      y[j + kQK / 2] = d * static_cast<float>(kIQ4Values[x[b].qs[j] >> 4]);
    }
  }
}

// ggml: dl = d · (ls − 32) first, then y = dl · kvalues[q]. Both products are exact in f32 (11 +
// 6 + 7 significant bits), so the order shows only in the sign of a zero (−0 · (ls − 32) · q),
// which the golden blocks check.
void dequantize_row_iq4_xs(const BlockIQ4_XS* x, float* y, int64_t n) {
  for (int64_t b = 0; b < n / kQK_K; ++b) {
    const float d = fp16_to_fp32(x[b].d);
    for (int s = 0; s < 8; ++s, y += kQK) {
      const int ls = ((x[b].scales_l[s / 2] >> 4 * (s % 2)) & 0x0f) | ((x[b].scales_h >> 2 * s) & 3)
                                                                          << 4;
      const float dl = d * static_cast<float>(ls - 32);
      const uint8_t* qs = x[b].qs + 16 * s;
      for (int j = 0; j < kQK / 2; ++j) {
        y[j] = dl * static_cast<float>(kIQ4Values[qs[j] & 0x0f]);
        y[j + kQK / 2] = dl * static_cast<float>(kIQ4Values[qs[j] >> 4]);
      }
    }
  }
}

}  // namespace tokenfab::kernels
