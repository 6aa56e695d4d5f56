// The K-quant dequantizers (Q2_K … Q6_K): the scalar reference every K-quant kernel is tested
// against. Each does ggml's arithmetic (dequantize_row_q*_K) in ggml's order — the sub-block's
// scale d·sc first, then its product with the level, then the min subtracted — so that the
// results equal ggml's and gguf.quants' bit for bit (tests/data/quant_golden.json). With these
// widths every product is exact in f32 (at most 23 significant bits: Q6_K's 11-bit d times a
// scale of magnitude ≤ 128 times a level of magnitude ≤ 32), so the one rounding is the
// subtraction's and a fused multiply-subtract would give the same bits. Layouts: quant_types.h.

#include "kernels/cpu/quantize.h"

namespace tokenfab::kernels {

namespace {

// Q4_K / Q5_K: 6-bit scale and min of sub-block s (0..7) — ggml's get_scale_min_k4.
void scale_min_k4(int s, const uint8_t* q, int* sc, int* m) {
  if (s < 4) {
    *sc = q[s] & 63;
    *m = q[s + 4] & 63;
  } else {
    *sc = (q[s + 4] & 0x0f) | (q[s - 4] >> 6) << 4;
    *m = (q[s + 4] >> 4) | (q[s] >> 6) << 4;
  }
}

}  // namespace

void dequantize_row_q2_k(const BlockQ2_K* x, float* y, int64_t n) {
  for (int64_t b = 0; b < n / kQK_K; ++b) {
    const float d = fp16_to_fp32(x[b].d), dmin = fp16_to_fp32(x[b].dmin);
    for (int e = 0; e < kQK_K; ++e) {  // e = 128·h + 32·k + l
      const uint8_t sc = x[b].scales[e / 16];
      const float dl = d * static_cast<float>(sc & 0x0f);
      const float ml = dmin * static_cast<float>(sc >> 4);
      const int q = (x[b].qs[32 * (e / 128) + e % 32] >> 2 * (e % 128 / 32)) & 3;
      const float p = dl * static_cast<float>(q);
      *y++ = p - ml;
    }
  }
}

void dequantize_row_q3_k(const BlockQ3_K* x, float* y, int64_t n) {
  for (int64_t b = 0; b < n / kQK_K; ++b) {
    const float d = fp16_to_fp32(x[b].d);
    for (int s = 0; s < 16; ++s) {
      const int sc = ((x[b].scales[s % 8] >> 4 * (s / 8)) & 0x0f) |
                     ((x[b].scales[8 + s % 4] >> 2 * (s / 4)) & 3) << 4;
      const float dl = d * static_cast<float>(sc - 32);
      for (int e = 16 * s; e < 16 * (s + 1); ++e) {
        const int lo = (x[b].qs[32 * (e / 128) + e % 32] >> 2 * (e % 128 / 32)) & 3;
        const int hi = (x[b].hmask[e % 32] >> (e / 32)) & 1;
        *y++ = dl * static_cast<float>(lo - (hi ? 0 : 4));
      }
    }
  }
}

void dequantize_row_q4_k(const BlockQ4_K* x, float* y, int64_t n) {
  for (int64_t b = 0; b < n / kQK_K; ++b) {
    const float d = fp16_to_fp32(x[b].d), dmin = fp16_to_fp32(x[b].dmin);
    for (int s = 0; s < 8; ++s) {
      int sc, m;
      scale_min_k4(s, x[b].scales, &sc, &m);
      const float d1 = d * static_cast<float>(sc);
      const float m1 = dmin * static_cast<float>(m);
      const uint8_t* q = x[b].qs + 32 * (s / 2);
      const int shift = 4 * (s % 2);
      for (int l = 0; l < 32; ++l) {
        const float p = d1 * static_cast<float>((q[l] >> shift) & 0x0f);
        *y++ = p - m1;
      }
    }
  }
}

void dequantize_row_q5_k(const BlockQ5_K* x, float* y, int64_t n) {
  for (int64_t b = 0; b < n / kQK_K; ++b) {
    const float d = fp16_to_fp32(x[b].d), dmin = fp16_to_fp32(x[b].dmin);
    for (int s = 0; s < 8; ++s) {
      int sc, m;
      scale_min_k4(s, x[b].scales, &sc, &m);
      const float d1 = d * static_cast<float>(sc);
      const float m1 = dmin * static_cast<float>(m);
      const uint8_t* q = x[b].qs + 32 * (s / 2);
      const int shift = 4 * (s % 2);
      for (int l = 0; l < 32; ++l) {
        const int v = ((q[l] >> shift) & 0x0f) | ((x[b].qh[l] >> s) & 1) << 4;
        const float p = d1 * static_cast<float>(v);
        *y++ = p - m1;
      }
    }
  }
}

// ggml: y = d · sc · (q − 32), evaluated left to right.
void dequantize_row_q6_k(const BlockQ6_K* x, float* y, int64_t n) {
  for (int64_t b = 0; b < n / kQK_K; ++b) {
    const float d = fp16_to_fp32(x[b].d);
    for (int e = 0; e < kQK_K; ++e) {  // e = 128·h + 32·k + l
      const int h = e / 128, k = e % 128 / 32, l = e % 32;
      const int lo = (x[b].ql[64 * h + 32 * (k % 2) + l] >> 4 * (k / 2)) & 0x0f;
      const int hi = (x[b].qh[32 * h + l] >> 2 * k) & 3;
      const float ds = d * static_cast<float>(x[b].scales[e / 16]);
      *y++ = ds * static_cast<float>((lo | hi << 4) - 32);
    }
  }
}

}  // namespace tokenfab::kernels
