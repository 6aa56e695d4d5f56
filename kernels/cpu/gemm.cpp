// The scalar reference of the matmul kernels: the definition every fast kernel follows.
//
// A row's dot product with an activation row is a sum over the activation's Q8A blocks j (32
// elements each: x_i = a_j.d · a_j.q_i, a_j.s = a_j.d · Σ_i a_j.q_i) of one float term per block,
// added in block order: acc = ((term_0 + term_1) + term_2) + …. Each term is the weight's exact
// integer dot product with a_j.q (the sub-block scales folded in as integers), then a few float
// steps. Per weight type, with q the stored level, Σ over the block's 32 elements, and each
// float expression evaluated left to right:
//
//   Q4_0    term = d·a.d·Σ q·a.q − 8·d·a.s                               (w = d·(q − 8))
//   Q4_1    term = d·a.d·Σ q·a.q + m·a.s                                 (w = d·q + m)
//   Q8_0    term = d·a.d·Σ q·a.q                                         (w = d·q)
//   Q5_0    term = d·a.d·Σ q·a.q − 16·d·a.s, q in 0..31                  (w = d·(q − 16))
//   Q5_1    term = d·a.d·Σ q·a.q + m·a.s, q in 0..31                     (w = d·q + m)
//   IQ4_NL  term = d·a.d·Σ v[q]·a.q, v = kIQ4Values                      (w = d·v[q])
// The super-block types: a 256-element weight block meets eight Q8A blocks; block j covers
// sub-block j (32-element sub-blocks) or sub-blocks 2j and 2j + 1 (16-element ones):
//   Q4_K, Q5_K  term_j = d·a.d·(sc_j·Σ q·a.q) − dmin·m_j·a.s             (w = d·sc·q − dmin·m)
//   IQ4_XS      term_j = d·a.d·((ls_j − 32)·Σ v[q]·a.q)                  (w = d·(ls − 32)·v[q])
//   Q6_K        term_j = d·a.d·Σ_t sc_t·Σ_t (q − 32)·a.q                 (w = d·sc·(q − 32))
//   Q3_K        term_j = d·a.d·Σ_t (sc_t − 32)·Σ_t (q − 4)·a.q           (w = d·(sc − 32)·(q − 4))
//   Q2_K        term_j = d·a.d·Σ_t sc_t·Σ_t q·a.q − dmin·a.d·Σ_t m_t·Σ_t a.q
//                                                                         (w = d·sc·q − dmin·m)
// where t runs over the block's two 16-element sub-blocks and Σ_t over each one's 16 elements.
// The integer parts (the products of the parentheses, held in int32) are exact in every kernel;
// only the float steps around them may differ between kernels, by rounding.

#include "kernels/cpu/gemm.h"

#include <vector>

#include "kernels/cpu/cpu_features.h"

namespace tokenfab::kernels {

size_t activation_row_bytes(WeightType type, int64_t k) {
  return is_block_quantized(type) ? static_cast<size_t>(k / kQK) * sizeof(BlockQ8A)
                                  : static_cast<size_t>(k) * sizeof(float);
}

void q8a_pair_sums(const BlockQ8A* x, int64_t nb, int32_t* out) {
  for (int64_t b = 0; b < nb; ++b) {
    int32_t lo = 0, hi = 0;
    for (int i = 0; i < kQK / 2; ++i) {
      lo += x[b].qs[i];
      hi += x[b].qs[kQK / 2 + i];
    }
    out[b] =
        static_cast<int32_t>(static_cast<uint32_t>(lo & 0xffff) | static_cast<uint32_t>(hi) << 16);
  }
}

const int32_t* activation_sums(const GemmArgs& a, ActivationSums kind) {
  thread_local std::vector<int32_t> sums;  // never shrinks
  const int64_t nb = a.k / kQK;
  if (sums.size() < static_cast<size_t>(a.cols * nb)) sums.resize(static_cast<size_t>(a.cols * nb));
  for (int64_t c = 0; c < a.cols; ++c) {
    const auto* x = reinterpret_cast<const BlockQ8A*>(a.x + c * a.x_stride);
    int32_t* out = sums.data() + c * nb;
    if (kind == ActivationSums::Pairs) {
      q8a_pair_sums(x, nb, out);
      continue;
    }
    for (int64_t b = 0; b < nb; ++b) {
      int32_t sum = 0;
      for (int i = 0; i < kQK; ++i) sum += x[b].qs[i];
      out[b] = -128 * sum;
    }
  }
  return sums.data();
}

namespace {

// Σ over the 16 or 32 elements [i0, i0 + n) of a block of w·a.q, w given per element.
template <typename Weight>
int32_t idot(const BlockQ8A& a, int i0, int n, Weight w) {
  int32_t sum = 0;
  for (int i = i0; i < i0 + n; ++i) sum += w(i) * a.qs[i];
  return sum;
}

int32_t asum(const BlockQ8A& a, int i0, int n) {
  return idot(a, i0, n, [](int) { return 1; });
}

float f(int32_t v) {
  return static_cast<float>(v);
}

// The five- and four-bit levels of the 32-element types (Q4_0 nibble order).
int nibble(const uint8_t* qs, int i) {
  return i < kQK / 2 ? qs[i] & 0x0f : qs[i - kQK / 2] >> 4;
}
int fifth_bit(const uint8_t* qh, int i) {
  return (qh[i / 8] >> (i % 8)) & 1;
}

float term_legacy(WeightType type, const uint8_t* wblock, const BlockQ8A& a) {
  switch (type) {
    case WeightType::Q4_0: {
      const auto& w = *reinterpret_cast<const BlockQ4_0*>(wblock);
      const float d = fp16_to_fp32(w.d);
      return d * a.d * f(idot(a, 0, kQK, [&](int i) { return nibble(w.qs, i); })) - 8.0f * d * a.s;
    }
    case WeightType::Q4_1: {
      const auto& w = *reinterpret_cast<const BlockQ4_1*>(wblock);
      return fp16_to_fp32(w.d) * a.d * f(idot(a, 0, kQK, [&](int i) { return nibble(w.qs, i); })) +
             fp16_to_fp32(w.m) * a.s;
    }
    case WeightType::Q8_0: {
      const auto& w = *reinterpret_cast<const BlockQ8_0*>(wblock);
      return fp16_to_fp32(w.d) * a.d * f(idot(a, 0, kQK, [&](int i) { return w.qs[i]; }));
    }
    case WeightType::Q5_0: {
      const auto& w = *reinterpret_cast<const BlockQ5_0*>(wblock);
      const float d = fp16_to_fp32(w.d);
      const auto q = [&](int i) { return nibble(w.qs, i) | fifth_bit(w.qh, i) << 4; };
      return d * a.d * f(idot(a, 0, kQK, q)) - 16.0f * d * a.s;
    }
    case WeightType::Q5_1: {
      const auto& w = *reinterpret_cast<const BlockQ5_1*>(wblock);
      const auto q = [&](int i) { return nibble(w.qs, i) | fifth_bit(w.qh, i) << 4; };
      return fp16_to_fp32(w.d) * a.d * f(idot(a, 0, kQK, q)) + fp16_to_fp32(w.m) * a.s;
    }
    case WeightType::IQ4_NL: {
      const auto& w = *reinterpret_cast<const BlockIQ4_NL*>(wblock);
      const auto v = [&](int i) { return static_cast<int>(kIQ4Values[nibble(w.qs, i)]); };
      return fp16_to_fp32(w.d) * a.d * f(idot(a, 0, kQK, v));
    }
    default:
      return 0.0f;
  }
}

// Q4_K / Q5_K: 6-bit scale and min of sub-block s (ggml's get_scale_min_k4).
void scale_min_k4(const uint8_t* q, int s, int* sc, int* m) {
  if (s < 4) {
    *sc = q[s] & 63;
    *m = q[s + 4] & 63;
  } else {
    *sc = (q[s + 4] & 0x0f) | (q[s - 4] >> 6) << 4;
    *m = (q[s + 4] >> 4) | (q[s] >> 6) << 4;
  }
}

// Level q of element e = 128·h + 32·k + l of a 2-bit plane (Q2_K's and Q3_K's qs).
int two_bits(const uint8_t* qs, int e) {
  return (qs[32 * (e / 128) + e % 32] >> 2 * (e % 128 / 32)) & 3;
}

// The eight terms of one super-block, each added to acc in turn.
void add_super_block(WeightType type, const uint8_t* wblock, const BlockQ8A* a, float& acc) {
  switch (type) {
    case WeightType::Q4_K:
    case WeightType::Q5_K: {
      // The two layouts share d, dmin and scales; Q5_K adds qh before qs.
      const auto& w4 = *reinterpret_cast<const BlockQ4_K*>(wblock);
      const auto& w5 = *reinterpret_cast<const BlockQ5_K*>(wblock);
      const bool five = type == WeightType::Q5_K;
      const uint8_t* qs = five ? w5.qs : w4.qs;
      const float d = fp16_to_fp32(w4.d), dmin = fp16_to_fp32(w4.dmin);
      for (int j = 0; j < 8; ++j) {
        int sc, m;
        scale_min_k4(w4.scales, j, &sc, &m);
        const auto q = [&](int l) {
          const int lo = (qs[32 * (j / 2) + l] >> 4 * (j % 2)) & 0x0f;
          return five ? lo | ((w5.qh[l] >> j) & 1) << 4 : lo;
        };
        acc += d * a[j].d * f(sc * idot(a[j], 0, kQK, q)) - dmin * f(m) * a[j].s;
      }
      return;
    }
    case WeightType::IQ4_XS: {
      const auto& w = *reinterpret_cast<const BlockIQ4_XS*>(wblock);
      const float d = fp16_to_fp32(w.d);
      for (int j = 0; j < 8; ++j) {
        const int ls = ((w.scales_l[j / 2] >> 4 * (j % 2)) & 0x0f) | ((w.scales_h >> 2 * j) & 3)
                                                                         << 4;
        const auto v = [&](int i) {
          return static_cast<int>(kIQ4Values[nibble(w.qs + 16 * j, i)]);
        };
        acc += d * a[j].d * f((ls - 32) * idot(a[j], 0, kQK, v));
      }
      return;
    }
    case WeightType::Q6_K: {
      const auto& w = *reinterpret_cast<const BlockQ6_K*>(wblock);
      const float d = fp16_to_fp32(w.d);
      for (int j = 0; j < 8; ++j) {
        const auto q = [&](int i) {
          const int e = 32 * j + i, h = e / 128, k = e % 128 / 32, l = e % 32;
          const int lo = (w.ql[64 * h + 32 * (k % 2) + l] >> 4 * (k / 2)) & 0x0f;
          const int hi = (w.qh[32 * h + l] >> 2 * k) & 3;
          return (lo | hi << 4) - 32;
        };
        const int32_t isum =
            w.scales[2 * j] * idot(a[j], 0, 16, q) + w.scales[2 * j + 1] * idot(a[j], 16, 16, q);
        acc += d * a[j].d * f(isum);
      }
      return;
    }
    case WeightType::Q3_K: {
      const auto& w = *reinterpret_cast<const BlockQ3_K*>(wblock);
      const float d = fp16_to_fp32(w.d);
      const auto scale = [&](int s) {
        return (((w.scales[s % 8] >> 4 * (s / 8)) & 0x0f) |
                ((w.scales[8 + s % 4] >> 2 * (s / 4)) & 3) << 4) -
               32;
      };
      for (int j = 0; j < 8; ++j) {
        const auto q = [&](int i) {
          const int e = 32 * j + i;
          return (two_bits(w.qs, e) | ((w.hmask[e % 32] >> (e / 32)) & 1) << 2) - 4;
        };
        const int32_t isum =
            scale(2 * j) * idot(a[j], 0, 16, q) + scale(2 * j + 1) * idot(a[j], 16, 16, q);
        acc += d * a[j].d * f(isum);
      }
      return;
    }
    case WeightType::Q2_K: {
      const auto& w = *reinterpret_cast<const BlockQ2_K*>(wblock);
      const float d = fp16_to_fp32(w.d), dmin = fp16_to_fp32(w.dmin);
      for (int j = 0; j < 8; ++j) {
        const uint8_t s0 = w.scales[2 * j], s1 = w.scales[2 * j + 1];
        const auto q = [&](int i) { return two_bits(w.qs, 32 * j + i); };
        const int32_t isum =
            (s0 & 0x0f) * idot(a[j], 0, 16, q) + (s1 & 0x0f) * idot(a[j], 16, 16, q);
        const int32_t imin = (s0 >> 4) * asum(a[j], 0, 16) + (s1 >> 4) * asum(a[j], 16, 16);
        acc += d * a[j].d * f(isum) - dmin * a[j].d * f(imin);
      }
      return;
    }
    default:
      return;
  }
}

float float_weight(WeightType type, const uint8_t* w, int64_t i) {
  switch (type) {
    case WeightType::F32:
      return reinterpret_cast<const float*>(w)[i];
    case WeightType::F16:
      return fp16_to_fp32(reinterpret_cast<const uint16_t*>(w)[i]);
    case WeightType::BF16:
      return bf16_to_fp32(reinterpret_cast<const uint16_t*>(w)[i]);
    default:
      return 0.0f;
  }
}

}  // namespace

void gemm_scalar(const GemmArgs& a) {
  const bool quantized = is_block_quantized(a.type);
  const int64_t per_block = quantized ? block_elements(a.type) : 1;
  const int64_t nb = a.k / per_block;
  const auto wblock = static_cast<size_t>(block_bytes(a.type));
  for (int64_t c = 0; c < a.cols; ++c) {
    const uint8_t* xrow = a.x + c * a.x_stride;
    for (int64_t r = 0; r < a.rows; ++r) {
      const uint8_t* wrow = a.w + r * a.w_stride;
      float acc = 0.0f;
      if (quantized) {
        const auto* xb = reinterpret_cast<const BlockQ8A*>(xrow);
        for (int64_t b = 0; b < nb; ++b) {
          if (per_block == kQK) {
            acc += term_legacy(a.type, wrow + b * wblock, xb[b]);
          } else {
            add_super_block(a.type, wrow + b * wblock, xb + b * (kQK_K / kQK), acc);
          }
        }
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
