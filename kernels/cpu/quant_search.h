#pragma once
// Scale searches shared by the weight quantizers (quantize_q5.cpp, quantize_k.cpp,
// quantize_iq4.cpp). For a run of N values they find the scale (and minimum) whose rounded
// integers reproduce the values with the least squared error among a set of candidates: each
// candidate inverse scale lies around the plain one (the extreme value on the last level), rounds
// the values to integers, and is then refitted by least squares with those integers fixed. The
// plain scale is one of the candidates, so the result is never worse than plain max-scaling
// before the scales themselves are quantized. Everything is deterministic: fixed candidates,
// fixed summation order, no threads.
//
// Internal to kernels/cpu.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "kernels/cpu/quant_types.h"

namespace tokenfab::kernels::quant {

// Round to nearest, ties to even, for |v| < 2^22: two float additions (no libm, vectorizable).
inline float round_nearest(float v) {
  constexpr float kMagic = 12582912.0f;  // 1.5 · 2^23
  return (v + kMagic) - kMagic;
}

// round_nearest(v) clamped to [lo, hi], for any v (NaN gives lo).
inline float round_clamped(float v, float lo, float hi) {
  v = lo < v ? v : lo;
  v = v < hi ? v : hi;
  return round_nearest(v);
}

// Four lanes of f32 / i32: GCC and Clang vector extensions (SSE2 on x86-64, NEON on Arm).
// The hot loops are written on them because compilers do not vectorize the scalar form: float
// selects under the default -ftrapping-math, and sums whose order they must keep.
typedef float F4 __attribute__((vector_size(16)));
typedef int32_t I4 __attribute__((vector_size(16)));

inline F4 load4(const float* p) {
  F4 v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

inline float sum4(F4 v) {
  return (v[0] + v[2]) + (v[1] + v[3]);
}

// Four levels (whole numbers in int8 range, as levels4 gives) stored as bytes.
template <class T>
inline void store_levels4(F4 q, T* out) {
  const I4 k = __builtin_convertvector(q, I4);
  for (int j = 0; j < 4; ++j) out[j] = static_cast<T>(k[j]);
}

// round(v) clamped to [lo, hi], lane by lane, for any v (NaN gives lo): the clamp first, then
// round to nearest even by adding and subtracting 1.5 · 2^23.
inline F4 levels4(F4 v, float lo, float hi) {
  const F4 vlo = {lo, lo, lo, lo}, vhi = {hi, hi, hi, hi};
  v = v > vlo ? v : vlo;
  v = v < vhi ? v : vhi;
  return (v + 12582912.0f) - 12582912.0f;
}

// The value of largest magnitude (the first one on ties), with its sign.
template <int N>
float signed_absmax(const float* x) {
  float vmax = 0.0f, amax = 0.0f;
  for (int i = 0; i < N; ++i) {
    const float a = std::fabs(x[i]);
    if (a > amax) {
      amax = a;
      vmax = x[i];
    }
  }
  return vmax;
}

// Sums of L, L² and x·L over N values, L = level(x[i..i+4)) four at a time, in four lanes
// (fixed order of additions).
template <int N, class Level>
inline void level_sums(const float* x, Level level, float* sl, float* sl2, float* sxl) {
  static_assert(N % 4 == 0);
  F4 a = {}, b = {}, c = {};
  for (int i = 0; i < N; i += 4) {
    const F4 xv = load4(x + i);
    const F4 l = level(xv);
    a += l;
    b += l * l;
    c += xv * l;
  }
  *sl = sum4(a);
  *sl2 = sum4(b);
  *sxl = sum4(c);
}

struct ScaleMin {
  float scale;  // ≥ 0
  float min;    // the value of level 0
};

// x ≈ scale · L + min, L integers in [0, nmax]. With min_at_most_zero (the K-quants, which
// subtract a non-negative dmin · m) the fitted min is ≤ 0. Candidates: inverse scales
// (nmax + δ) / (hi − lo) for nstep + 1 values of δ spread evenly over [−range, range] (δ = 0
// among them when nstep is even), lo = min(x) (and ≤ 0 when min_at_most_zero), hi = max(x); then
// `refine` rounds to the best fit so far, (x − min) / scale, and refits again.
template <int N>
ScaleMin search_scale_min(const float* x, int nmax, bool min_at_most_zero, int nstep, float range,
                          int refine) {
  float lo = x[0], hi = x[0], sx = 0.0f;
  for (int i = 0; i < N; ++i) {
    lo = std::min(lo, x[i]);
    hi = std::max(hi, x[i]);
    sx += x[i];
  }
  if (min_at_most_zero) lo = std::min(lo, 0.0f);
  if (!(hi > lo)) return {0.0f, lo};  // constant (or all zero) block

  const float fmax = static_cast<float>(nmax);
  ScaleMin best{(hi - lo) / fmax, lo};
  float best_err = INFINITY;
  // Levels round((x − offset) · iscale), least-squares (s, m) for them, kept if better.
  const auto consider = [&](float offset, float iscale) {
    float sl, sl2, sxl;
    level_sums<N>(
        x, [&](F4 xv) { return levels4((xv - offset) * iscale, 0.0f, fmax); }, &sl, &sl2, &sxl);
    // [sl2 sl; sl N] [s; m] = [sxl; sx]
    const float det = static_cast<float>(N) * sl2 - sl * sl;
    if (!(det > 0.0f)) return;  // every value on one level
    const float inv_det = 1.0f / det;
    float s = (static_cast<float>(N) * sxl - sl * sx) * inv_det;
    float m = (sl2 * sx - sl * sxl) * inv_det;
    if (min_at_most_zero && m > 0.0f) {
      m = 0.0f;
      s = sxl / sl2;
    }
    if (!(s > 0.0f)) return;
    // Σ (s·L + m − x)² less the constant Σ x².
    const float err = s * (s * sl2 - 2.0f * sxl) + m * (static_cast<float>(N) * m - 2.0f * sx) +
                      2.0f * s * m * sl;
    if (err < best_err) {
      best_err = err;
      best = {s, m};
    }
  };
  const float inv_range = 1.0f / (hi - lo);
  for (int step = 0; step <= nstep; ++step) {
    const float delta =
        nstep > 0 ? range * (-1.0f + 2.0f * static_cast<float>(step) / nstep) : 0.0f;
    consider(lo, (fmax + delta) * inv_range);
  }
  for (int r = 0; r < refine && best_err < INFINITY; ++r) consider(best.min, 1.0f / best.scale);
  return best;
}

// x ≈ s · L, L integers in [−nneg, npos]; s may be negative. Candidates: inverse scales that put
// the value of largest magnitude near −nneg (the end with more levels), −(nneg + δ) / vmax, δ
// spread evenly over [−range, range] in nstep + 1 values; then `refine` rounds to the best fit
// so far, x / s, and refits again. Returns 0 for an all-zero run.
template <int N>
float search_scale_symmetric(const float* x, int nneg, int npos, int nstep, float range,
                             int refine) {
  const float vmax = signed_absmax<N>(x);
  if (vmax == 0.0f) return 0.0f;
  const float fneg = static_cast<float>(nneg), fpos = static_cast<float>(npos);
  float best_sxl = 0.0f, best_sl2 = 0.0f;
  // The error at the least-squares s = sxl / sl2 is Σx² − sxl² / sl2: maximise sxl² / sl2.
  const auto consider = [&](float iscale) {
    float sl, sl2, sxl;
    level_sums<N>(
        x, [&](F4 xv) { return levels4(iscale * xv, -fneg, fpos); }, &sl, &sl2, &sxl);
    if (sl2 > 0.0f && (best_sl2 == 0.0f || sxl * sxl * best_sl2 > best_sxl * best_sxl * sl2)) {
      best_sxl = sxl;
      best_sl2 = sl2;
    }
  };
  const float inv_vmax = 1.0f / vmax;
  for (int step = 0; step <= nstep; ++step) {
    const float delta =
        nstep > 0 ? range * (-1.0f + 2.0f * static_cast<float>(step) / nstep) : 0.0f;
    consider(-(fneg + delta) * inv_vmax);
  }
  for (int r = 0; r < refine && best_sxl != 0.0f; ++r) consider(best_sl2 / best_sxl);
  return best_sl2 > 0.0f ? best_sxl / best_sl2 : 0.0f;
}

// IQ4 (non-linear levels): the kIQ4Values entry nearest to v (the upper one on an exact tie).
// The midpoints between neighbours are multiples of ½, so the entry depends only on floor(2v):
// tables over floor(2v) in [−256, 255] of the entry's index and of its value.
struct IQ4Nearest {
  int8_t index[512] = {};
  float value[512] = {};
  constexpr IQ4Nearest() {
    for (int k = -256; k < 256; ++k) {
      const float v = static_cast<float>(k) * 0.5f;
      int idx = 0;
      for (int j = 1; j < 16; ++j) {
        const float mid = 0.5f * static_cast<float>(kIQ4Values[j - 1] + kIQ4Values[j]);
        if (v >= mid) idx = j;
      }
      index[k + 256] = static_cast<int8_t>(idx);
      value[k + 256] = static_cast<float>(kIQ4Values[idx]);
    }
  }
  // Table slot of v, for any v (NaN gives slot 0).
  static int slot(float v) {
    float u = 2.0f * v + 256.0f;
    u = u > 0.0f ? u : 0.0f;
    u = u < 511.0f ? u : 511.0f;
    return static_cast<int>(u);  // truncation: floor, u ≥ 0
  }
  static I4 slots(F4 v) {
    F4 u = 2.0f * v + 256.0f;
    const F4 lo = {0.0f, 0.0f, 0.0f, 0.0f}, hi = {511.0f, 511.0f, 511.0f, 511.0f};
    u = u > lo ? u : lo;
    u = u < hi ? u : hi;
    return __builtin_convertvector(u, I4);
  }
  int operator()(float v) const { return index[slot(v)]; }
  F4 values(F4 v) const {
    const I4 k = slots(v);
    const F4 r = {value[k[0]], value[k[1]], value[k[2]], value[k[3]]};
    return r;
  }
};
inline constexpr IQ4Nearest kIQ4Nearest{};

// x ≈ d · kIQ4Values[q] with the best d (signed) among candidates that put the value of largest
// magnitude on −127 + t, t in −ntry_low..ntry_low, or on 113 + t, t in −ntry_high..ntry_high
// (none when ntry_high < 0), each refitted by least squares; then `refine` rounds to the best fit
// so far, x / d, and refits again.
template <int N>
float search_scale_iq4(const float* x, int ntry_low, int ntry_high, int refine) {
  const float vmax = signed_absmax<N>(x);
  if (vmax == 0.0f) return 0.0f;
  float best_sxv = 0.0f, best_sv2 = 0.0f;
  const auto consider = [&](float id) {
    float sv, sv2, sxv;
    level_sums<N>(
        x, [&](F4 xv) { return kIQ4Nearest.values(id * xv); }, &sv, &sv2, &sxv);
    if (sv2 > 0.0f && (best_sv2 == 0.0f || sxv * sxv * best_sv2 > best_sxv * best_sxv * sv2)) {
      best_sxv = sxv;
      best_sv2 = sv2;
    }
  };
  const float inv_vmax = 1.0f / vmax;
  for (int t = -ntry_low; t <= ntry_low; ++t) {
    consider((static_cast<float>(kIQ4Values[0]) + static_cast<float>(t)) * inv_vmax);
  }
  for (int t = -ntry_high; t <= ntry_high; ++t) {
    consider((static_cast<float>(kIQ4Values[15]) + static_cast<float>(t)) * inv_vmax);
  }
  for (int r = 0; r < refine && best_sxv != 0.0f; ++r) consider(best_sv2 / best_sxv);
  return best_sv2 > 0.0f ? best_sxv / best_sv2 : 0.0f;
}

// fp16 round trip: the value a stored fp16 scale will decode to.
inline float to_fp16_and_back(float f) {
  return fp16_to_fp32(fp32_to_fp16(f));
}

}  // namespace tokenfab::kernels::quant
