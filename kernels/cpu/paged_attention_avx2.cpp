#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <utility>

#include "kernels/cpu/paged_attention.h"
#include "kernels/cpu/attention_avx2_parts.h"

namespace tokenfab::kernels {

namespace {

using namespace avx2;

// Decode reads V in tiles of this many rows (see decode_group).
constexpr int64_t kTileRows = 128;

void prefetch_block(const uint16_t* rows, int64_t halves) {
  const char* p = reinterpret_cast<const char*>(rows);
  for (int64_t i = 0; i < halves * 2; i += 64) __builtin_prefetch(p + i);  // 64-byte lines
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
    grouped_scores<NV, G>(q, kDim, block_rows(kv.k, p), kDim, rows, scale, s + (p - p0), n);
  }
  for (int g = 0; g < G; ++g) {
    const ExpSum es = exp_and_sum_avx2(s + g * n, n);
    rec[g * rec_stride] = es.max;
    rec[g * rec_stride + 1] = es.sum;
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
  return head_dim == 32 || head_dim == 64 || head_dim == 96 || head_dim == 128;
}

void paged_gather_rows_avx2(const PagedKv& kv, const int32_t* blocks, int kv_head, int64_t n_rows,
                            float* k32, float* v32) {
  const int64_t head_rows = int64_t{kv.block_size} * kv.head_dim;  // one (block, kv head)
  for (int64_t p0 = 0; p0 < n_rows; p0 += kv.block_size) {
    const int64_t n = std::min<int64_t>(kv.block_size, n_rows - p0);
    const int64_t off = (int64_t{blocks[p0 / kv.block_size]} * kv.n_kv_head + kv_head) * head_rows;
    convert_head_rows(kv.k + off, kv.head_dim, n, kv.head_dim, k32 + p0 * kv.head_dim);
    convert_head_rows(kv.v + off, kv.head_dim, n, kv.head_dim, v32 + p0 * kv.head_dim);
  }
}

namespace {

template <int NV>
void attend_rows(const float* q, const float* k32, const float* v32, int64_t n_pos, float scale,
                 float* s, float* out) {
  scores_row<NV>(q, k32, 8 * NV, n_pos, scale, s);
  softmax_avx2(s, n_pos);
  weighted_sum<NV>(s, v32, 8 * NV, n_pos, out);
}

}  // namespace

// The same row kernels as the contiguous attention, over rows gathered into f32.
void attend_rows_f32_avx2(const float* q, const float* k32, const float* v32, int64_t n_pos,
                          int head_dim, float scale, float* s, float* out) {
  switch (head_dim) {
    case 32: return attend_rows<4>(q, k32, v32, n_pos, scale, s, out);
    case 64: return attend_rows<8>(q, k32, v32, n_pos, scale, s, out);
    case 96: return attend_rows<12>(q, k32, v32, n_pos, scale, s, out);
    default: return attend_rows<16>(q, k32, v32, n_pos, scale, s, out);
  }
}

}  // namespace tokenfab::kernels
