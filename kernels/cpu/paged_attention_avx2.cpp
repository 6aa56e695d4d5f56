#include <immintrin.h>

#include <algorithm>

#include "kernels/cpu/paged_attention.h"
#include "kernels/cpu/attention_avx2_parts.h"

namespace tokenfab::kernels {

bool paged_attention_avx2_supports(int head_dim) {
  return head_dim == 32 || head_dim == 64 || head_dim == 96 || head_dim == 128 || head_dim == 256;
}

void paged_gather_rows_avx2(const PagedKv& kv, const int32_t* blocks, int kv_head, int64_t first,
                            int64_t n_rows, float* k32, float* v32) {
  const int64_t head_rows = int64_t{kv.block_size} * kv.head_dim;  // one (block, kv head)
  for (int64_t p0 = first; p0 < n_rows; p0 += kv.block_size) {
    const int64_t n = std::min<int64_t>(kv.block_size, n_rows - p0);
    const int64_t off = (int64_t{blocks[p0 / kv.block_size]} * kv.n_kv_head + kv_head) * head_rows;
    const int64_t dst = (p0 - first) * kv.head_dim;
    avx2::convert_head_rows(kv.k + off, kv.head_dim, n, kv.head_dim, k32 + dst);
    avx2::convert_head_rows(kv.v + off, kv.head_dim, n, kv.head_dim, v32 + dst);
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

// Softmax of each head's scores s (G, n_pos), then out_g = Σ_p s_g[p] · v_p over the V rows (f32
// or fp16) that run(p0) gives (RowRun).
template <int NV, int G, typename E, typename Run>
void softmax_weighted_sum(float* s, int64_t n_pos, Run run, float* out) {
  float* outs[G];
  for (int g = 0; g < G; ++g) {
    softmax_avx2(s + g * n_pos, n_pos);
    outs[g] = out + g * 8 * NV;
  }
  grouped_weighted_sum_runs<NV, G, E>(s, n_pos, run, 8 * NV, n_pos, outs);
}

template <int NV, int G>
void attend_rows_grouped(const float* q, const float* k32, const float* v32, int64_t n_pos,
                         float scale, float* s, float* out) {
  grouped_scores<NV, G>(q, 8 * NV, k32, 8 * NV, n_pos, scale, s, n_pos);
  softmax_weighted_sum<NV, G, float>(
      s, n_pos, [&](int64_t p0) { return RowRun<float>{v32 + p0 * 8 * NV, n_pos - p0}; }, out);
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

// attend_rows_grouped over positions [0, n_pos) read in place from the blocks, one run of rows
// per block: the scores of each block's rows in groups of four (a block holds a multiple of four
// rows, so the groups and the tail are those of the gathered rows), the same softmax, the same
// sums in the same position order.
template <int NV, int G>
void attend_paged_grouped(const PagedKv& kv, const int32_t* blocks, int kv_head, int64_t n_pos,
                          const float* q, float scale, float* s, float* out) {
  const int64_t head_rows = int64_t{kv.block_size} * kv.head_dim;
  // Position p0 (a block's first) of K or V: that block's rows of kv head `kv_head`.
  const auto block_rows = [&](const uint16_t* pool, int64_t p0) {
    return RowRun<uint16_t>{
        pool + (int64_t{blocks[p0 / kv.block_size]} * kv.n_kv_head + kv_head) * head_rows,
        std::min<int64_t>(kv.block_size, n_pos - p0)};
  };
  for (int64_t p0 = 0; p0 < n_pos; p0 += kv.block_size) {
    const RowRun<uint16_t> k = block_rows(kv.k, p0);
    grouped_scores<NV, G>(q, 8 * NV, k.rows, 8 * NV, k.count, scale, s + p0, n_pos);
  }
  softmax_weighted_sum<NV, G, uint16_t>(
      s, n_pos, [&](int64_t p0) { return block_rows(kv.v, p0); }, out);
}

template <int NV>
bool attend_paged_nv(const PagedKv& kv, const int32_t* blocks, int kv_head, int64_t n_pos,
                     int group, const float* q, float scale, float* s, float* out) {
  switch (group) {
    case 1: attend_paged_grouped<NV, 1>(kv, blocks, kv_head, n_pos, q, scale, s, out); return true;
    case 2: attend_paged_grouped<NV, 2>(kv, blocks, kv_head, n_pos, q, scale, s, out); return true;
    case 3: attend_paged_grouped<NV, 3>(kv, blocks, kv_head, n_pos, q, scale, s, out); return true;
    case 4: attend_paged_grouped<NV, 4>(kv, blocks, kv_head, n_pos, q, scale, s, out); return true;
    default: return false;
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
    case 256: return attend_rows<32>(q, k32, v32, n_pos, scale, s, out);
    default: return attend_rows<16>(q, k32, v32, n_pos, scale, s, out);
  }
}

void attend_rows_grouped_f32_avx2(const float* q, const float* k32, const float* v32, int64_t n_pos,
                                  int head_dim, int group, float scale, float* s, float* out) {
  switch (head_dim) {
    case 32: return attend_rows_grouped_nv<4>(q, k32, v32, n_pos, group, scale, s, out);
    case 64: return attend_rows_grouped_nv<8>(q, k32, v32, n_pos, group, scale, s, out);
    case 96: return attend_rows_grouped_nv<12>(q, k32, v32, n_pos, group, scale, s, out);
    case 256: return attend_rows_grouped_nv<32>(q, k32, v32, n_pos, group, scale, s, out);
    default: return attend_rows_grouped_nv<16>(q, k32, v32, n_pos, group, scale, s, out);
  }
}

bool attend_paged_in_place_avx2(const PagedKv& kv, const int32_t* blocks, int kv_head,
                                int64_t n_pos, int group, const float* q, float scale,
                                float* scores, float* out) {
  if (kv.block_size % 4 != 0) return false;
  switch (kv.head_dim) {
    case 32: return attend_paged_nv<4>(kv, blocks, kv_head, n_pos, group, q, scale, scores, out);
    case 64: return attend_paged_nv<8>(kv, blocks, kv_head, n_pos, group, q, scale, scores, out);
    case 96: return attend_paged_nv<12>(kv, blocks, kv_head, n_pos, group, q, scale, scores, out);
    case 128: return attend_paged_nv<16>(kv, blocks, kv_head, n_pos, group, q, scale, scores, out);
    case 256: return attend_paged_nv<32>(kv, blocks, kv_head, n_pos, group, q, scale, scores, out);
    default: return false;
  }
}

}  // namespace tokenfab::kernels
