// The K-quant quantizers (Q2_K … Q6_K): super-blocks of 256 in sub-blocks of 16 or 32.
//
// Each super-block is quantized in three steps:
//   1. every sub-block gets its own continuous scale (and min) from a least-squares search over
//      candidate scales (quant_search.h);
//   2. those are quantized to the format's small integers times an fp16 super-block scale d (and
//      dmin), the largest on the top integer;
//   3. every value gets the level nearest to it under the scales as the dequantizer will compute
//      them (d · sc in f32); then d (and dmin) are refitted by least squares with the levels and
//      small integers fixed, and the refit is kept when it lowers the super-block's error; last,
//      each sub-block tries its small integers one step up and down and keeps what lowers its
//      error.
// Layouts: quant_types.h. Deterministic; no allocation.

#include "kernels/cpu/quant_search.h"
#include "kernels/cpu/quantize.h"

namespace tokenfab::kernels {

using quant::round_clamped;

namespace {

// Candidates per sub-block (quant_search.h): nstep + 1 values of δ over [−range, range], plus one
// refinement, chosen on Gaussian data as the point past which more candidates gain < 1 % of
// the squared error.
struct Search {
  int nstep;
  float range;
};
constexpr Search kQ2Search{8, 0.6f};  // levels 0..3, 16 values
constexpr Search kQ3Search{6, 1.0f};  // levels −4..3, 16 values, the extreme on −4
constexpr Search kQ4Search{8, 1.0f};  // levels 0..15, 32 values
constexpr Search kQ5Search{8, 2.0f};  // levels 0..31, 32 values
constexpr Search kQ6Search{8, 4.0f};  // levels −32..31, 16 values, the extreme on −32
constexpr int kRefine = 1;

// ---------------------------------------------------------------------------------------------
// Step 2: sub-block scales to small integers.

// v[0..k) ≥ 0 ≈ D · q, q integers in [0, qmax], D = max(v) / qmax rounded to fp16.
float quantize_scales_unsigned(const float* v, int k, int qmax, uint8_t* q) {
  float vmax = 0.0f;
  for (int j = 0; j < k; ++j) vmax = std::max(vmax, v[j]);
  const float d = quant::to_fp16_and_back(vmax / static_cast<float>(qmax));
  const float id = d > 0.0f ? 1.0f / d : 0.0f;
  for (int j = 0; j < k; ++j) {
    q[j] = static_cast<uint8_t>(round_clamped(v[j] * id, 0.0f, static_cast<float>(qmax)));
  }
  return d;
}

// v[0..k) ≈ D · q, q integers in [−qneg, qpos]: the value of largest magnitude goes to −qneg.
float quantize_scales_signed(const float* v, int k, int qneg, int qpos, int* q) {
  float vmax = 0.0f;
  for (int j = 0; j < k; ++j) {
    if (std::fabs(v[j]) > std::fabs(vmax)) vmax = v[j];
  }
  const float d = quant::to_fp16_and_back(vmax / static_cast<float>(-qneg));
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  for (int j = 0; j < k; ++j) {
    q[j] = static_cast<int>(
        round_clamped(v[j] * id, static_cast<float>(-qneg), static_cast<float>(qpos)));
  }
  return d;
}

// ---------------------------------------------------------------------------------------------
// Step 3, scale-and-min formats (Q2_K, Q4_K, Q5_K): value = d·sc[s]·L − dmin·m[s], L in
// [0, nmax], sub-blocks of `sub` values.

struct AsymSuper {
  int nsub, sub, nmax;
};

// One sub-block of `sub` values: the levels nearest to x under d·sc and dmin·m (computed as
// the dequantizer computes them), and their squared error.
float sub_error_asym(const float* x, int sub, int nmax, float d, float dmin, int sc, int m,
                     uint8_t* l) {
  const float ds = d * static_cast<float>(sc);
  const float dm = dmin * static_cast<float>(m);
  const float id = ds != 0.0f ? 1.0f / ds : 0.0f;
  quant::F4 err = {};
  for (int i = 0; i < sub; i += 4) {
    const quant::F4 xv = quant::load4(x + i);
    const quant::F4 q = quant::levels4((xv + dm) * id, 0.0f, static_cast<float>(nmax));
    quant::store_levels4(q, l + i);
    const quant::F4 e = ds * q - dm - xv;
    err += e * e;
  }
  return quant::sum4(err);
}

float assign_asym(const AsymSuper& f, const float* x, float d, float dmin, const uint8_t* sc,
                  const uint8_t* m, uint8_t* l) {
  float err = 0.0f;
  for (int s = 0; s < f.nsub; ++s) {
    const int o = s * f.sub;
    err += sub_error_asym(x + o, f.sub, f.nmax, d, dmin, sc[s], m[s], l + o);
  }
  return err;
}

// Steps 2 and 3 for one super-block: sub-block fits (scale[s], min[s] ≥ 0, value ≈ scale·L −
// min) in; fp16 d and dmin, small integers sc, m (0..qmax) and levels l out. Last, each
// sub-block tries its sc and m one step either way under the final d and dmin.
void finish_asym(const AsymSuper& f, const float* x, const float* scale, const float* min, int qmax,
                 uint16_t* d_out, uint16_t* dmin_out, uint8_t* sc, uint8_t* m, uint8_t* l) {
  float d = quantize_scales_unsigned(scale, f.nsub, qmax, sc);
  float dmin = quantize_scales_unsigned(min, f.nsub, qmax, m);
  const float err = assign_asym(f, x, d, dmin, sc, m, l);

  // Least squares for (d, dmin) with a_i = sc·L, b_i = −m fixed: [Σa² Σab; Σab Σb²] [d; dmin]
  // = [Σax; Σbx].
  double saa = 0, sab = 0, sbb = 0, sax = 0, sbx = 0;
  for (int s = 0; s < f.nsub; ++s) {
    const double b = -static_cast<double>(m[s]);
    for (int i = s * f.sub; i < (s + 1) * f.sub; ++i) {
      const double a = static_cast<double>(sc[s]) * l[i];
      saa += a * a;
      sab += a * b;
      sbb += b * b;
      sax += a * x[i];
      sbx += b * x[i];
    }
  }
  const double det = saa * sbb - sab * sab;
  if (det > 0 && saa > 0) {
    const float d2 = quant::to_fp16_and_back(static_cast<float>((sax * sbb - sbx * sab) / det));
    const float dmin2 = quant::to_fp16_and_back(static_cast<float>((sbx * saa - sax * sab) / det));
    uint8_t l2[kQK_K];
    if (d2 > 0.0f && dmin2 >= 0.0f && assign_asym(f, x, d2, dmin2, sc, m, l2) < err) {
      d = d2;
      dmin = dmin2;
      std::copy(l2, l2 + f.nsub * f.sub, l);
    }
  }

  for (int s = 0; s < f.nsub; ++s) {
    const int o = s * f.sub;
    uint8_t trial[32];
    float best = sub_error_asym(x + o, f.sub, f.nmax, d, dmin, sc[s], m[s], trial);
    const int sc0 = sc[s], m0 = m[s];
    for (int dsc = -1; dsc <= 1; ++dsc) {
      for (int dm = -1; dm <= 1; ++dm) {
        const int sc1 = sc0 + dsc, m1 = m0 + dm;
        if ((dsc == 0 && dm == 0) || sc1 < 0 || sc1 > qmax || m1 < 0 || m1 > qmax) continue;
        const float e = sub_error_asym(x + o, f.sub, f.nmax, d, dmin, sc1, m1, trial);
        if (e < best) {
          best = e;
          sc[s] = static_cast<uint8_t>(sc1);
          m[s] = static_cast<uint8_t>(m1);
          std::copy(trial, trial + f.sub, l + o);
        }
      }
    }
  }
  *d_out = fp32_to_fp16(d);
  *dmin_out = fp32_to_fp16(dmin);
}

// Step 1 for the scale-and-min formats: scale[s] ≥ 0 and min[s] ≥ 0 per sub-block.
template <int Sub>
void fit_asym(const float* x, int nsub, int nmax, Search search, float* scale, float* min) {
  for (int s = 0; s < nsub; ++s) {
    const quant::ScaleMin fit =
        quant::search_scale_min<Sub>(x + s * Sub, nmax, true, search.nstep, search.range, kRefine);
    scale[s] = fit.scale;
    min[s] = -fit.min;
  }
}

// ---------------------------------------------------------------------------------------------
// Step 3, scale-only formats (Q3_K, Q6_K): value = d·sc[s]·L, L in [lo, hi], sub-blocks of 16.

// One sub-block of 16: the levels nearest to x under d·sc, and their squared error.
float sub_error_sym(const float* x, float d, int sc, int lo, int hi, int8_t* l) {
  const float ds = d * static_cast<float>(sc);
  const float id = ds != 0.0f ? 1.0f / ds : 0.0f;
  quant::F4 err = {};
  for (int i = 0; i < 16; i += 4) {
    const quant::F4 xv = quant::load4(x + i);
    const quant::F4 q = quant::levels4(xv * id, static_cast<float>(lo), static_cast<float>(hi));
    quant::store_levels4(q, l + i);
    const quant::F4 e = ds * q - xv;
    err += e * e;
  }
  return quant::sum4(err);
}

float assign_sym(const float* x, float d, const int* sc, int lo, int hi, int8_t* l) {
  float err = 0.0f;
  for (int s = 0; s < kQK_K / 16; ++s)
    err += sub_error_sym(x + 16 * s, d, sc[s], lo, hi, l + 16 * s);
  return err;
}

// Steps 1–3 for one scale-only super-block: fp16 d, small integers sc in [−qneg, qpos], levels l.
// Last, each sub-block tries its sc one step either way under the final d.
void quantize_sym_super(const float* x, int lo, int hi, Search search, int qneg, int qpos,
                        uint16_t* d_out, int* sc, int8_t* l) {
  float scale[kQK_K / 16];
  for (int s = 0; s < kQK_K / 16; ++s) {
    scale[s] =
        quant::search_scale_symmetric<16>(x + 16 * s, -lo, hi, search.nstep, search.range, kRefine);
  }
  float d = quantize_scales_signed(scale, kQK_K / 16, qneg, qpos, sc);
  const float err = assign_sym(x, d, sc, lo, hi, l);

  double saa = 0, sax = 0;  // least squares for d alone
  for (int s = 0; s < kQK_K / 16; ++s) {
    for (int i = s * 16; i < (s + 1) * 16; ++i) {
      const double a = static_cast<double>(sc[s]) * l[i];
      saa += a * a;
      sax += a * x[i];
    }
  }
  if (saa > 0) {
    const float d2 = quant::to_fp16_and_back(static_cast<float>(sax / saa));
    int8_t l2[kQK_K];
    if (assign_sym(x, d2, sc, lo, hi, l2) < err) {
      d = d2;
      std::copy(l2, l2 + kQK_K, l);
    }
  }

  for (int s = 0; s < kQK_K / 16; ++s) {
    int8_t trial[16];
    float best = sub_error_sym(x + 16 * s, d, sc[s], lo, hi, trial);
    const int sc0 = sc[s];
    for (const int sc1 : {sc0 - 1, sc0 + 1}) {
      if (sc1 < -qneg || sc1 > qpos) continue;
      const float e = sub_error_sym(x + 16 * s, d, sc1, lo, hi, trial);
      if (e < best) {
        best = e;
        sc[s] = sc1;
        std::copy(trial, trial + 16, l + 16 * s);
      }
    }
  }
  *d_out = fp32_to_fp16(d);
}

// Q4_K / Q5_K: 6-bit scales and mins, packed as get_scale_min_k4 reads them.
void pack_scales_k4(const uint8_t* sc, const uint8_t* m, uint8_t* out) {
  for (int j = 0; j < 4; ++j) {
    out[j] = static_cast<uint8_t>(sc[j] | (sc[j + 4] >> 4) << 6);
    out[j + 4] = static_cast<uint8_t>(m[j] | (m[j + 4] >> 4) << 6);
    out[j + 8] = static_cast<uint8_t>((sc[j + 4] & 0x0f) | (m[j + 4] & 0x0f) << 4);
  }
}

}  // namespace

void quantize_row_q2_k(const float* x, BlockQ2_K* y, int64_t n) {
  const AsymSuper f{16, 16, 3};
  for (int64_t b = 0; b < n / kQK_K; ++b, x += kQK_K) {
    float scale[16], min[16];
    uint8_t sc[16], m[16], l[kQK_K];
    fit_asym<16>(x, 16, 3, kQ2Search, scale, min);
    finish_asym(f, x, scale, min, 15, &y[b].d, &y[b].dmin, sc, m, l);
    for (int s = 0; s < 16; ++s) y[b].scales[s] = static_cast<uint8_t>(sc[s] | m[s] << 4);
    for (int h = 0; h < 2; ++h) {
      for (int j = 0; j < 32; ++j) {
        const uint8_t* e = l + 128 * h + j;
        y[b].qs[32 * h + j] = static_cast<uint8_t>(e[0] | e[32] << 2 | e[64] << 4 | e[96] << 6);
      }
    }
  }
}

void quantize_row_q3_k(const float* x, BlockQ3_K* y, int64_t n) {
  for (int64_t b = 0; b < n / kQK_K; ++b, x += kQK_K) {
    int sc[16];
    int8_t l[kQK_K];
    quantize_sym_super(x, -4, 3, kQ3Search, 32, 31, &y[b].d, sc, l);
    std::fill(y[b].scales, y[b].scales + 12, uint8_t{0});
    for (int s = 0; s < 16; ++s) {
      const int u = sc[s] + 32;  // 0..63
      y[b].scales[s % 8] |= static_cast<uint8_t>((u & 0x0f) << 4 * (s / 8));
      y[b].scales[8 + s % 4] |= static_cast<uint8_t>((u >> 4) << 2 * (s / 4));
    }
    std::fill(y[b].hmask, y[b].hmask + 32, uint8_t{0});
    std::fill(y[b].qs, y[b].qs + 64, uint8_t{0});
    for (int e = 0; e < kQK_K; ++e) {
      const int u = l[e] + 4;  // 0..7
      y[b].qs[32 * (e / 128) + e % 32] |= static_cast<uint8_t>((u & 3) << 2 * (e % 128 / 32));
      y[b].hmask[e % 32] |= static_cast<uint8_t>((u >> 2) << (e / 32));
    }
  }
}

void quantize_row_q4_k(const float* x, BlockQ4_K* y, int64_t n) {
  const AsymSuper f{8, 32, 15};
  for (int64_t b = 0; b < n / kQK_K; ++b, x += kQK_K) {
    float scale[8], min[8];
    uint8_t sc[8], m[8], l[kQK_K];
    fit_asym<32>(x, 8, 15, kQ4Search, scale, min);
    finish_asym(f, x, scale, min, 63, &y[b].d, &y[b].dmin, sc, m, l);
    pack_scales_k4(sc, m, y[b].scales);
    for (int g = 0; g < 4; ++g) {
      for (int j = 0; j < 32; ++j) {
        y[b].qs[32 * g + j] = static_cast<uint8_t>(l[64 * g + j] | l[64 * g + 32 + j] << 4);
      }
    }
  }
}

void quantize_row_q5_k(const float* x, BlockQ5_K* y, int64_t n) {
  const AsymSuper f{8, 32, 31};
  for (int64_t b = 0; b < n / kQK_K; ++b, x += kQK_K) {
    float scale[8], min[8];
    uint8_t sc[8], m[8], l[kQK_K];
    fit_asym<32>(x, 8, 31, kQ5Search, scale, min);
    finish_asym(f, x, scale, min, 63, &y[b].d, &y[b].dmin, sc, m, l);
    pack_scales_k4(sc, m, y[b].scales);
    for (int g = 0; g < 4; ++g) {
      for (int j = 0; j < 32; ++j) {
        const uint8_t lo = l[64 * g + j], hi = l[64 * g + 32 + j];
        y[b].qs[32 * g + j] = static_cast<uint8_t>((lo & 0x0f) | (hi & 0x0f) << 4);
      }
    }
    std::fill(y[b].qh, y[b].qh + 32, uint8_t{0});
    for (int e = 0; e < kQK_K; ++e) {
      y[b].qh[e % 32] |= static_cast<uint8_t>((l[e] >> 4) << (e / 32));
    }
  }
}

void quantize_row_q6_k(const float* x, BlockQ6_K* y, int64_t n) {
  for (int64_t b = 0; b < n / kQK_K; ++b, x += kQK_K) {
    int sc[16];
    int8_t l[kQK_K];
    quantize_sym_super(x, -32, 31, kQ6Search, 128, 127, &y[b].d, sc, l);
    for (int s = 0; s < 16; ++s) y[b].scales[s] = static_cast<int8_t>(sc[s]);
    for (int h = 0; h < 2; ++h) {
      for (int j = 0; j < 32; ++j) {
        int u[4];  // element 128·h + 32·k + j, as 0..63
        for (int k = 0; k < 4; ++k) u[k] = l[128 * h + 32 * k + j] + 32;
        y[b].ql[64 * h + j] = static_cast<uint8_t>((u[0] & 0x0f) | (u[2] & 0x0f) << 4);
        y[b].ql[64 * h + 32 + j] = static_cast<uint8_t>((u[1] & 0x0f) | (u[3] & 0x0f) << 4);
        y[b].qh[32 * h + j] = static_cast<uint8_t>(u[0] >> 4 | (u[1] >> 4) << 2 | (u[2] >> 4) << 4 |
                                                   (u[3] >> 4) << 6);
      }
    }
  }
}

}  // namespace tokenfab::kernels
