// Q5_0 and Q5_1: blocks of 32 five-bit values (ggml's layouts). The dequantizers do ggml's
// arithmetic in ggml's order; the quantizers search each block's scale (quant_search.h).

#include "kernels/cpu/quant_search.h"
#include "kernels/cpu/quantize.h"

namespace tokenfab::kernels {

namespace {

// Candidates per block (quant_search.h): δ in steps of ½ over [−2, 2] and one refinement (Q5_0:
// the extreme value near −16).
constexpr int kQ5Steps = 8;
constexpr float kQ5Range = 2.0f;

// Packs 32 levels (0..31): the low four bits in Q4_0's nibble order, bit 4 of element i as bit i
// of the little-endian 32-bit qh.
void pack_q5(const uint8_t* q, uint8_t* qs, uint8_t* qh) {
  uint32_t h = 0;
  for (int j = 0; j < kQK / 2; ++j) {
    qs[j] = static_cast<uint8_t>((q[j] & 0x0f) | (q[j + kQK / 2] & 0x0f) << 4);
  }
  for (int i = 0; i < kQK; ++i) h |= static_cast<uint32_t>(q[i] >> 4) << i;
  for (int k = 0; k < 4; ++k) qh[k] = static_cast<uint8_t>(h >> 8 * k);
}

// The 32 levels (0..31) of a Q5 block, element order.
void unpack_q5(const uint8_t* qs, const uint8_t* qh, int* q) {
  const uint32_t h = static_cast<uint32_t>(qh[0]) | static_cast<uint32_t>(qh[1]) << 8 |
                     static_cast<uint32_t>(qh[2]) << 16 | static_cast<uint32_t>(qh[3]) << 24;
  for (int j = 0; j < kQK / 2; ++j) {
    q[j] = (qs[j] & 0x0f) | static_cast<int>((h >> j) & 1) << 4;
    q[j + kQK / 2] = (qs[j] >> 4) | static_cast<int>((h >> (j + 16)) & 1) << 4;
  }
}

}  // namespace

void quantize_row_q5_0(const float* x, BlockQ5_0* y, int64_t n) {
  using quant::round_clamped;
  for (int64_t b = 0; b < n / kQK; ++b, x += kQK) {
    const float s = quant::search_scale_symmetric<kQK>(x, 16, 15, kQ5Steps, kQ5Range, 1);
    y[b].d = fp32_to_fp16(s);
    const float d = fp16_to_fp32(y[b].d);
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    uint8_t q[kQK];
    for (int i = 0; i < kQK; ++i) {
      q[i] = static_cast<uint8_t>(round_clamped(x[i] * id, -16.0f, 15.0f) + 16.0f);
    }
    pack_q5(q, y[b].qs, y[b].qh);
  }
}

void quantize_row_q5_1(const float* x, BlockQ5_1* y, int64_t n) {
  using quant::round_clamped;
  for (int64_t b = 0; b < n / kQK; ++b, x += kQK) {
    const quant::ScaleMin f = quant::search_scale_min<kQK>(x, 31, false, kQ5Steps, kQ5Range, 1);
    y[b].d = fp32_to_fp16(f.scale);
    y[b].m = fp32_to_fp16(f.min);
    const float d = fp16_to_fp32(y[b].d), m = fp16_to_fp32(y[b].m);
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    uint8_t q[kQK];
    for (int i = 0; i < kQK; ++i) {
      q[i] = static_cast<uint8_t>(round_clamped((x[i] - m) * id, 0.0f, 31.0f));
    }
    pack_q5(q, y[b].qs, y[b].qh);
  }
}

// ggml: y = (q − 16) · d, the integer converted first.
void dequantize_row_q5_0(const BlockQ5_0* x, float* y, int64_t n) {
  for (int64_t b = 0; b < n / kQK; ++b, y += kQK) {
    const float d = fp16_to_fp32(x[b].d);
    int q[kQK];
    unpack_q5(x[b].qs, x[b].qh, q);
    for (int i = 0; i < kQK; ++i) y[i] = static_cast<float>(q[i] - 16) * d;
  }
}

// ggml: y = q · d + m, rounded after the product and after the sum (no fused multiply-add).
void dequantize_row_q5_1(const BlockQ5_1* x, float* y, int64_t n) {
  for (int64_t b = 0; b < n / kQK; ++b, y += kQK) {
    const float d = fp16_to_fp32(x[b].d), m = fp16_to_fp32(x[b].m);
    int q[kQK];
    unpack_q5(x[b].qs, x[b].qh, q);
    for (int i = 0; i < kQK; ++i) {
      const float p = static_cast<float>(q[i]) * d;
      y[i] = p + m;
    }
  }
}

}  // namespace tokenfab::kernels
