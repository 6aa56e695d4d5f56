#include <immintrin.h>

#include <algorithm>

#include "kernels/cpu/paged_attention.h"
#include "kernels/cpu/attention_avx2_parts.h"

namespace tokenfab::kernels {

bool paged_attention_avx2_supports(int head_dim) {
  return head_dim == 32 || head_dim == 64 || head_dim == 96 || head_dim == 128;
}

void paged_gather_rows_avx2(const PagedKv& kv, const int32_t* blocks, int kv_head, int64_t n_rows,
                            float* k32, float* v32) {
  const int64_t head_rows = int64_t{kv.block_size} * kv.head_dim;  // one (block, kv head)
  for (int64_t p0 = 0; p0 < n_rows; p0 += kv.block_size) {
    const int64_t n = std::min<int64_t>(kv.block_size, n_rows - p0);
    const int64_t off = (int64_t{blocks[p0 / kv.block_size]} * kv.n_kv_head + kv_head) * head_rows;
    avx2::convert_head_rows(kv.k + off, kv.head_dim, n, kv.head_dim, k32 + p0 * kv.head_dim);
    avx2::convert_head_rows(kv.v + off, kv.head_dim, n, kv.head_dim, v32 + p0 * kv.head_dim);
  }
}

namespace {

using namespace avx2;

template <int NV>
void attend_rows(const float* q, const float* k32, const float* v32, int64_t n_pos, float scale,
                 float* s, float* out) {
  scores_row<NV>(q, k32, 8 * NV, n_pos, scale, s);
  softmax_avx2(s, n_pos);
  weighted_sum<NV>(s, v32, 8 * NV, n_pos, out);
}

template <int NV, int G>
void attend_rows_grouped(const float* q, const float* k32, const float* v32, int64_t n_pos,
                         float scale, float* s, float* out) {
  grouped_scores<NV, G>(q, 8 * NV, k32, 8 * NV, n_pos, scale, s, n_pos);
  float* outs[G];
  for (int g = 0; g < G; ++g) {
    softmax_avx2(s + g * n_pos, n_pos);
    outs[g] = out + g * 8 * NV;
  }
  grouped_weighted_sum<NV, G>(s, n_pos, v32, 8 * NV, n_pos, outs);
}

template <int NV>
void attend_rows_grouped_nv(const float* q, const float* k32, const float* v32, int64_t n_pos,
                            int group, float scale, float* s, float* out) {
  switch (group) {
    case 1: return attend_rows_grouped<NV, 1>(q, k32, v32, n_pos, scale, s, out);
    case 2: return attend_rows_grouped<NV, 2>(q, k32, v32, n_pos, scale, s, out);
    case 3: return attend_rows_grouped<NV, 3>(q, k32, v32, n_pos, scale, s, out);
    case 4: return attend_rows_grouped<NV, 4>(q, k32, v32, n_pos, scale, s, out);
    default:
      for (int g = 0; g < group; ++g)
        attend_rows<NV>(q + g * 8 * NV, k32, v32, n_pos, scale, s, out + g * 8 * NV);
  }
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

namespace tokenfab::kernels {

void attend_rows_grouped_f32_avx2(const float* q, const float* k32, const float* v32, int64_t n_pos,
                                  int head_dim, int group, float scale, float* s, float* out) {
  switch (head_dim) {
    case 32: return attend_rows_grouped_nv<4>(q, k32, v32, n_pos, group, scale, s, out);
    case 64: return attend_rows_grouped_nv<8>(q, k32, v32, n_pos, group, scale, s, out);
    case 96: return attend_rows_grouped_nv<12>(q, k32, v32, n_pos, group, scale, s, out);
    default: return attend_rows_grouped_nv<16>(q, k32, v32, n_pos, group, scale, s, out);
  }
}

}  // namespace tokenfab::kernels
