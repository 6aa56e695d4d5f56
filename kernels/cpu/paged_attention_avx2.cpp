#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <utility>

#include "kernels/cpu/paged_attention.h"
#include "kernels/cpu/simd_math_avx2.h"

namespace tokenfab::kernels {

namespace {

void convert_rows(const uint16_t* src, int64_t n, int head_dim, float* dst) {
  const int64_t count = n * head_dim;  // rows are contiguous in a block: one run of count halves
  for (int64_t i = 0; i < count; i += 8)
    _mm256_storeu_ps(dst + i,
                     _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i))));
}

// Decode reads V in tiles of this many rows (see decode_group).
constexpr int64_t kTileRows = 128;

inline __m256 load_h8(const uint16_t* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}

void prefetch_block(const uint16_t* rows, int64_t halves) {
  const char* p = reinterpret_cast<const char*>(rows);
  for (int64_t i = 0; i < halves * 2; i += 64) __builtin_prefetch(p + i);  // 64-byte lines
}

// Scores of G query heads (q_head_stride apart) against n fp16 rows (contiguous, stride 8·NV):
// s[g · s_stride + p]. Four rows × G heads in flight; each K row converted once for all G heads.
template <int NV, int G>
void grouped_scores(const float* q, int64_t q_head_stride, const uint16_t* k, int64_t n,
                    float scale, float* s, int64_t s_stride) {
  constexpr int kDim = 8 * NV;
  int64_t p = 0;
  for (; p + 4 <= n; p += 4) {
    __m256 acc[G][4];
    for (int g = 0; g < G; ++g)
      for (int i = 0; i < 4; ++i) acc[g][i] = _mm256_setzero_ps();
    const uint16_t* kp = k + p * kDim;
    for (int j = 0; j < NV; ++j) {
      __m256 kv[4];
      for (int i = 0; i < 4; ++i) kv[i] = load_h8(kp + i * kDim + 8 * j);
      for (int g = 0; g < G; ++g) {
        const __m256 qj = _mm256_loadu_ps(q + g * q_head_stride + 8 * j);
        for (int i = 0; i < 4; ++i) acc[g][i] = _mm256_fmadd_ps(qj, kv[i], acc[g][i]);
      }
    }
    for (int g = 0; g < G; ++g) {
      const __m256 h = _mm256_hadd_ps(_mm256_hadd_ps(acc[g][0], acc[g][1]),
                                      _mm256_hadd_ps(acc[g][2], acc[g][3]));
      const __m128 sum = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
      _mm_storeu_ps(s + g * s_stride + p, _mm_mul_ps(sum, _mm_set1_ps(scale)));
    }
  }
  for (; p < n; ++p) {
    for (int g = 0; g < G; ++g) {
      __m256 a = _mm256_setzero_ps();
      for (int j = 0; j < NV; ++j)
        a = _mm256_fmadd_ps(_mm256_loadu_ps(q + g * q_head_stride + 8 * j),
                            load_h8(k + p * kDim + 8 * j), a);
      s[g * s_stride + p] = hsum_avx2(a) * scale;
    }
  }
}

// s[0..n) ← exp(s − max); returns {max, Σ}.
std::pair<float, float> exp_and_sum(float* s, int64_t n) {
  __m256 vmax = _mm256_set1_ps(-INFINITY);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) vmax = _mm256_max_ps(vmax, _mm256_loadu_ps(s + i));
  float max = hmax_avx2(vmax);
  for (; i < n; ++i) max = s[i] > max ? s[i] : max;
  const __m256 m = _mm256_set1_ps(max);
  __m256 vsum = _mm256_setzero_ps();
  for (i = 0; i + 8 <= n; i += 8) {
    const __m256 e = exp_avx2(_mm256_sub_ps(_mm256_loadu_ps(s + i), m));
    _mm256_storeu_ps(s + i, e);
    vsum = _mm256_add_ps(vsum, e);
  }
  float sum = hsum_avx2(vsum);
  for (; i < n; ++i) {
    s[i] = _mm256_cvtss_f32(exp_avx2(_mm256_set1_ps(s[i] - max)));
    sum += s[i];
  }
  return {max, sum};
}

// Partial records (at rec + g · rec_stride) of G query heads over rows [p0, p1) of one kv head,
// read block by block: the scores of all rows first (s: (G, p1 − p0)), then one softmax per head,
// then the weighted sum with 4 × G accumulators held across the blocks of a tile, 32 floats of
// the head at a time.
template <int NV, int G>
void decode_group(const PagedKv& kv, const int32_t* blocks, int kv_head, int64_t p0, int64_t p1,
                  const float* q, float scale, float* rec, int64_t rec_stride, float* s) {
  static_assert(NV % 4 == 0);
  constexpr int kDim = 8 * NV;
  const int64_t n = p1 - p0, head_rows = int64_t{kv.block_size} * kDim;
  // kv head kv_head's rows of the block holding position p (p0 is a block boundary, so every p
  // below is one too).
  auto block_rows = [&](const uint16_t* base, int64_t p) {
    return base + (int64_t{blocks[p / kv.block_size]} * kv.n_kv_head + kv_head) * head_rows;
  };
  for (int64_t p = p0; p < p1; p += kv.block_size) {
    if (p + kv.block_size < p1) prefetch_block(block_rows(kv.k, p + kv.block_size), head_rows);
    const int64_t rows = std::min<int64_t>(kv.block_size, p1 - p);
    grouped_scores<NV, G>(q, kDim, block_rows(kv.k, p), rows, scale, s + (p - p0), n);
  }
  for (int g = 0; g < G; ++g) {
    const auto [max, sum] = exp_and_sum(s + g * n, n);
    rec[g * rec_stride] = max;
    rec[g * rec_stride + 1] = sum;
  }
  // V in tiles of about kTileRows rows (blocks whole), small enough to stay in L2 across the
  // NV / 4 passes over it; the accumulators go through o between tiles.
  const int64_t tile = std::max<int64_t>(1, kTileRows / kv.block_size) * kv.block_size;
  for (int64_t t0 = p0; t0 < p1; t0 += tile) {
    const int64_t t1 = std::min(p1, t0 + tile);
    for (int c0 = 0; c0 < NV; c0 += 4) {
      __m256 acc[G][4];
      for (int g = 0; g < G; ++g)
        for (int j = 0; j < 4; ++j)
          acc[g][j] = t0 == p0 ? _mm256_setzero_ps()
                               : _mm256_loadu_ps(rec + g * rec_stride + 2 + 8 * (c0 + j));
      for (int64_t p = t0; p < t1; p += kv.block_size) {
        if (c0 == 0 && p + kv.block_size < p1)
          prefetch_block(block_rows(kv.v, p + kv.block_size), head_rows);
        const uint16_t* v = block_rows(kv.v, p);
        const int64_t rows = std::min<int64_t>(kv.block_size, p1 - p);
        for (int64_t r = 0; r < rows; ++r) {
          __m256 vv[4];
          for (int j = 0; j < 4; ++j) vv[j] = load_h8(v + r * kDim + 8 * (c0 + j));
          for (int g = 0; g < G; ++g) {
            const __m256 w = _mm256_broadcast_ss(s + g * n + (p - p0) + r);
            for (int j = 0; j < 4; ++j) acc[g][j] = _mm256_fmadd_ps(w, vv[j], acc[g][j]);
          }
        }
      }
      for (int g = 0; g < G; ++g)
        for (int j = 0; j < 4; ++j)
          _mm256_storeu_ps(rec + g * rec_stride + 2 + 8 * (c0 + j), acc[g][j]);
    }
  }
}

template <int NV>
void decode_heads(const PagedKv& kv, const int32_t* blocks, int kv_head, int64_t p0, int64_t p1,
                  const float* q, int n_q, float scale, float* rec, int64_t rec_stride, float* s) {
  switch (n_q) {
    case 1:
      return decode_group<NV, 1>(kv, blocks, kv_head, p0, p1, q, scale, rec, rec_stride, s);
    case 2:
      return decode_group<NV, 2>(kv, blocks, kv_head, p0, p1, q, scale, rec, rec_stride, s);
    case 3:
      return decode_group<NV, 3>(kv, blocks, kv_head, p0, p1, q, scale, rec, rec_stride, s);
    default:
      return decode_group<NV, 4>(kv, blocks, kv_head, p0, p1, q, scale, rec, rec_stride, s);
  }
}

}  // namespace

void paged_decode_partial_avx2(const PagedKv& kv, const int32_t* blocks, int kv_head, int64_t p0,
                               int64_t p1, const float* q, int group, float scale, float* rec,
                               int64_t rec_stride, float* scratch) {
  // Query heads in runs of at most 4 (the accumulators of 4 heads fill the 16 registers).
  for (int g0 = 0; g0 < group; g0 += 4) {
    const int n_q = std::min(4, group - g0);
    const float* qg = q + int64_t{g0} * kv.head_dim;
    switch (kv.head_dim) {
      case 32:
        decode_heads<4>(kv, blocks, kv_head, p0, p1, qg, n_q, scale, rec + g0 * rec_stride,
                        rec_stride, scratch);
        break;
      case 64:
        decode_heads<8>(kv, blocks, kv_head, p0, p1, qg, n_q, scale, rec + g0 * rec_stride,
                        rec_stride, scratch);
        break;
      case 96:
        decode_heads<12>(kv, blocks, kv_head, p0, p1, qg, n_q, scale, rec + g0 * rec_stride,
                         rec_stride, scratch);
        break;
      default:
        decode_heads<16>(kv, blocks, kv_head, p0, p1, qg, n_q, scale, rec + g0 * rec_stride,
                         rec_stride, scratch);
        break;
    }
  }
}

bool paged_attention_avx2_supports(int head_dim) {
  return head_dim > 0 && head_dim % 32 == 0;
}

void paged_gather_rows_avx2(const PagedKv& kv, const int32_t* blocks, int kv_head, int64_t n_rows,
                            float* k32, float* v32) {
  const int64_t head_rows = int64_t{kv.block_size} * kv.head_dim;  // one (block, kv head)
  for (int64_t p0 = 0; p0 < n_rows; p0 += kv.block_size) {
    const int64_t n = std::min<int64_t>(kv.block_size, n_rows - p0);
    const int64_t off = (int64_t{blocks[p0 / kv.block_size]} * kv.n_kv_head + kv_head) * head_rows;
    convert_rows(kv.k + off, n, kv.head_dim, k32 + p0 * kv.head_dim);
    convert_rows(kv.v + off, n, kv.head_dim, v32 + p0 * kv.head_dim);
  }
}

// Scores four positions at a time (four independent FMA chains sharing each q load, reduced by one
// hadd tree); softmax with the vector exp; the weighted sum 32 floats of the head at a time, held
// in four registers while the rows stream past.
void attend_rows_f32_avx2(const float* q, const float* k32, const float* v32, int64_t n_pos,
                          int head_dim, float scale, float* s, float* out) {
  int64_t p = 0;
  for (; p + 4 <= n_pos; p += 4) {
    const float* k0 = k32 + p * head_dim;
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    for (int d = 0; d < head_dim; d += 8) {
      const __m256 qd = _mm256_loadu_ps(q + d);
      a0 = _mm256_fmadd_ps(qd, _mm256_loadu_ps(k0 + d), a0);
      a1 = _mm256_fmadd_ps(qd, _mm256_loadu_ps(k0 + head_dim + d), a1);
      a2 = _mm256_fmadd_ps(qd, _mm256_loadu_ps(k0 + 2 * head_dim + d), a2);
      a3 = _mm256_fmadd_ps(qd, _mm256_loadu_ps(k0 + 3 * head_dim + d), a3);
    }
    // Per 128-bit lane [a0 a1 a2 a3] after two hadds; the two lanes then add.
    const __m256 h = _mm256_hadd_ps(_mm256_hadd_ps(a0, a1), _mm256_hadd_ps(a2, a3));
    const __m128 sum = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
    _mm_storeu_ps(s + p, _mm_mul_ps(sum, _mm_set1_ps(scale)));
  }
  for (; p < n_pos; ++p) {
    __m256 a = _mm256_setzero_ps();
    for (int d = 0; d < head_dim; d += 8)
      a = _mm256_fmadd_ps(_mm256_loadu_ps(q + d), _mm256_loadu_ps(k32 + p * head_dim + d), a);
    s[p] = hsum_avx2(a) * scale;
  }

  __m256 vmax = _mm256_set1_ps(-INFINITY);
  p = 0;
  for (; p + 8 <= n_pos; p += 8) vmax = _mm256_max_ps(vmax, _mm256_loadu_ps(s + p));
  float max = hmax_avx2(vmax);
  for (; p < n_pos; ++p) max = s[p] > max ? s[p] : max;
  const __m256 m = _mm256_set1_ps(max);
  __m256 vsum = _mm256_setzero_ps();
  p = 0;
  for (; p + 8 <= n_pos; p += 8) {
    const __m256 e = exp_avx2(_mm256_sub_ps(_mm256_loadu_ps(s + p), m));
    _mm256_storeu_ps(s + p, e);
    vsum = _mm256_add_ps(vsum, e);
  }
  float sum = hsum_avx2(vsum);
  for (; p < n_pos; ++p) {
    s[p] = _mm256_cvtss_f32(exp_avx2(_mm256_set1_ps(s[p] - max)));
    sum += s[p];
  }
  const __m256 inv = _mm256_set1_ps(1.0f / sum);

  for (int c = 0; c < head_dim; c += 32) {
    __m256 acc[4];
    for (int j = 0; j < 4; ++j) acc[j] = _mm256_setzero_ps();
    for (p = 0; p < n_pos; ++p) {
      const float* vp = v32 + p * head_dim + c;
      const __m256 w = _mm256_broadcast_ss(s + p);
      for (int j = 0; j < 4; ++j) acc[j] = _mm256_fmadd_ps(w, _mm256_loadu_ps(vp + 8 * j), acc[j]);
    }
    for (int j = 0; j < 4; ++j) _mm256_storeu_ps(out + c + 8 * j, _mm256_mul_ps(acc[j], inv));
  }
}

}  // namespace tokenfab::kernels
