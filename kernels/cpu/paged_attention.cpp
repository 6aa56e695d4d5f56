#include "kernels/cpu/paged_attention.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <limits>

#include "kernels/cpu/attention.h"
#include "kernels/cpu/cpu_features.h"
#include "kernels/cpu/ops.h"
#include "kernels/cpu/quant_types.h"

namespace tokenfab::kernels {

namespace {

// Items are cut to about 1/kItemsPerThread of a thread's share of the batch's cost; handed out
// largest first from a shared counter, the small last ones even out the threads' totals. The cut
// decides only who computes a row, never how: results do not depend on it.
constexpr int64_t kItemsPerThread = 4;
// An item gathers its kv head's rows once for all its tokens: at least this many tokens keep the
// gather (n_rows · head_dim) small against the attention (tokens · group · n_rows · head_dim).
constexpr int64_t kMinItemTokens = 8;

// One unit of the parallel region: query tokens [begin, end) of sequence `seq`, for the query
// heads of kv head `kv_head`.
struct WorkItem {
  int64_t cost;  // ≈ query heads × positions attended
  int32_t seq;
  int32_t kv_head;
  int64_t begin, end;
};

struct Plan {
  std::vector<WorkItem> items;  // largest cost first
  int64_t thread_floats = 0;    // per-thread scratch the largest item needs
};

int64_t causal_cost(int64_t pos0, int64_t t0, int64_t t1) {  // Σ_{t0 ≤ t < t1} (pos0 + t + 1)
  return (t1 - t0) * pos0 + (t1 * (t1 + 1) - t0 * (t0 + 1)) / 2;
}

// kv head × token ranges cut greedily to about `target` cost, each of at least kMinItemTokens
// tokens (or the whole chunk; a decode row is one item per kv head).
void plan_sequence(const PagedKv& kv, const PagedSequence& s, int32_t seq, int n_head,
                   int64_t target, Plan& plan) {
  const int group = n_head / kv.n_kv_head;
  if (s.parent) {  // a draft tree: one item per kv head (its rows share the context gather)
    const int64_t n_rows = s.pos0 + s.n_tokens;  // bounds pos0 + depth + 1
    for (int g = 0; g < kv.n_kv_head; ++g)
      plan.items.push_back({group * s.n_tokens * n_rows + n_rows, seq, g, 0, s.n_tokens});
    plan.thread_floats = std::max(plan.thread_floats, n_rows * (group + 2 * int64_t{kv.head_dim}));
    return;
  }
  for (int64_t t0 = 0; t0 < s.n_tokens;) {
    int64_t t1 = std::min(s.n_tokens, t0 + kMinItemTokens);
    while (t1 < s.n_tokens && group * causal_cost(s.pos0, t0, t1) < target) ++t1;
    if (s.n_tokens - t1 < kMinItemTokens) t1 = s.n_tokens;  // no short range at the end
    const int64_t n_rows = s.pos0 + t1;
    for (int g = 0; g < kv.n_kv_head; ++g)
      plan.items.push_back({group * causal_cost(s.pos0, t0, t1) + n_rows, seq, g, t0, t1});
    plan.thread_floats = std::max(plan.thread_floats, n_rows * (group + 2 * int64_t{kv.head_dim}));
    t0 = t1;
  }
}

Plan plan_work(const PagedKv& kv, std::span<const PagedSequence> seqs, int n_head, int n_threads) {
  int64_t total = 0;
  for (const PagedSequence& s : seqs) total += int64_t{n_head} * causal_cost(s.pos0, 0, s.n_tokens);
  const int64_t target =
      n_threads == 1 ? total : std::max<int64_t>(1, total / (kItemsPerThread * n_threads));
  Plan plan;
  for (size_t i = 0; i < seqs.size(); ++i)
    if (seqs[i].n_tokens > 0)
      plan_sequence(kv, seqs[i], static_cast<int32_t>(i), n_head, target, plan);
  std::stable_sort(plan.items.begin(), plan.items.end(),
                   [](const WorkItem& a, const WorkItem& b) { return a.cost > b.cost; });
  return plan;
}

struct Call {
  const PagedKv& kv;
  std::span<const PagedSequence> seqs;
  const float* q;
  int64_t q_stride;
  float* out;
  int64_t out_stride;
  int n_head;
  float scale;
  bool avx2;  // the AVX2 kernels (not with a soft-cap: the scalar ones apply it)
};

// The first position row `pos` attends in this layer.
int64_t first_position(const PagedKv& kv, int64_t pos) {
  return kv.window > 0 && pos >= kv.window ? pos - kv.window + 1 : 0;
}

// Position p's K/V row of kv head `kv_head` → f32 (exact, as the gathers).
void gather_position(const PagedKv& kv, const int32_t* blocks, int kv_head, int64_t p, float* k32,
                     float* v32) {
  const int64_t off =
      ((int64_t{blocks[p / kv.block_size]} * kv.n_kv_head + kv_head) * kv.block_size +
       p % kv.block_size) *
      kv.head_dim;
  for (int d = 0; d < kv.head_dim; ++d) {
    k32[d] = fp16_to_fp32(kv.k[off + d]);
    v32[d] = fp16_to_fp32(kv.v[off + d]);
  }
}

// The query heads h0 .. h0 + group − 1 (one kv head's) of one row.
void attend_heads(const Call& c, const float* q, const float* k32, const float* v32, int64_t n_pos,
                  int group, float* scores, float* out) {
  if (c.avx2) {
    attend_rows_grouped_f32_avx2(q, k32, v32, n_pos, c.kv.head_dim, group, c.scale, scores, out);
    return;
  }
  for (int g = 0; g < group; ++g)
    attend_rows_f32_scalar(q + g * c.kv.head_dim, k32, v32, n_pos, c.kv.head_dim, c.scale, scores,
                           out + g * c.kv.head_dim, c.kv.softcap);
}

// An item's scratch for rows [base, n_rows) of its kv head (row p at index p − base), rows
// [base, n_gather) of them gathered; base is a multiple of the block size.
struct RowBuffers {
  int64_t base;
  float* k32;     // (n_rows − base, head_dim)
  float* v32;     // (n_rows − base, head_dim)
  float* scores;  // (group, n_rows − base)
  const float* k_at(int64_t p, int head_dim) const { return k32 + (p - base) * head_dim; }
  const float* v_at(int64_t p, int head_dim) const { return v32 + (p - base) * head_dim; }
};
RowBuffers gather_rows(const Call& c, const PagedSequence& s, int kv_head, int64_t first,
                       int64_t n_rows, int64_t n_gather, float* scratch) {
  const PagedKv& kv = c.kv;
  const int64_t base = first / kv.block_size * kv.block_size, n = n_rows - base;
  RowBuffers b{base, scratch, scratch + n * kv.head_dim, scratch + 2 * n * kv.head_dim};
  if (c.avx2) {
    paged_gather_rows_avx2(kv, s.blocks, kv_head, base, n_gather, b.k32, b.v32);
  } else {
    paged_gather_rows_scalar(kv, s.blocks, kv_head, base, n_gather, b.k32, b.v32);
  }
  return b;
}

// A draft tree: the context [0, pos0) is gathered once (what the window lets the shallowest row
// see of it); for each row, its ancestors' rows and its own are placed after it in depth order
// (overwriting the previous row's path) and attended. A row at depth d sits at position pos0 + d.
void run_tree_item(const Call& c, const WorkItem& w, float* scratch) {
  const PagedKv& kv = c.kv;
  const PagedSequence& s = c.seqs[w.seq];
  const int group = c.n_head / kv.n_kv_head;
  const RowBuffers b = gather_rows(c, s, w.kv_head, first_position(kv, s.pos0),
                                   s.pos0 + s.n_tokens, s.pos0, scratch);
  for (int64_t t = w.begin; t < w.end; ++t) {
    const int64_t depth = paged_row_depth(s, t);
    for (int64_t r = t, d = depth; r >= 0; r = s.parent[r], --d)
      gather_position(kv, s.blocks, w.kv_head, s.pos0 + r,
                      b.k32 + (s.pos0 + d - b.base) * kv.head_dim,
                      b.v32 + (s.pos0 + d - b.base) * kv.head_dim);
    const int64_t h0 = int64_t{w.kv_head} * group;
    const int64_t first = first_position(kv, s.pos0 + depth);
    attend_heads(c, c.q + (s.q_row + t) * c.q_stride + h0 * kv.head_dim,
                 b.k_at(first, kv.head_dim), b.v_at(first, kv.head_dim),
                 s.pos0 + depth + 1 - first, group, b.scores,
                 c.out + (s.q_row + t) * c.out_stride + h0 * kv.head_dim);
  }
}

// Gathers kv head w.kv_head's rows [0, pos0 + end) once, then attends each (query head, token).
void run_item(const Call& c, const WorkItem& w, float* scratch) {
  const PagedKv& kv = c.kv;
  const PagedSequence& s = c.seqs[w.seq];
  if (s.parent) return run_tree_item(c, w, scratch);
  const int group = c.n_head / kv.n_kv_head;
  const int64_t n_rows = s.pos0 + w.end;
  const int64_t h0 = int64_t{w.kv_head} * group;
  const int64_t first_of_item = first_position(kv, s.pos0 + w.begin);
  // A single row reads the blocks in place: its gather would be used once.
  if (c.avx2 && w.end - w.begin == 1 && first_of_item == 0 &&
      attend_paged_in_place_avx2(kv, s.blocks, w.kv_head, n_rows, group,
                                 c.q + (s.q_row + w.begin) * c.q_stride + h0 * kv.head_dim,
                                 c.scale, scratch,
                                 c.out + (s.q_row + w.begin) * c.out_stride + h0 * kv.head_dim))
    return;
  const RowBuffers b = gather_rows(c, s, w.kv_head, first_of_item, n_rows, n_rows, scratch);
  for (int64_t t = w.begin; t < w.end; ++t) {
    const int64_t first = first_position(kv, s.pos0 + t);
    attend_heads(c, c.q + (s.q_row + t) * c.q_stride + h0 * kv.head_dim,
                 b.k_at(first, kv.head_dim), b.v_at(first, kv.head_dim), s.pos0 + t + 1 - first,
                 group, b.scores, c.out + (s.q_row + t) * c.out_stride + h0 * kv.head_dim);
  }
}

}  // namespace

int64_t paged_row_depth(const PagedSequence& s, int64_t t) {
  if (!s.parent) return t;
  int64_t depth = 0;
  for (int64_t r = s.parent[t]; r >= 0; r = s.parent[r]) ++depth;
  return depth;
}

void paged_gather_rows_scalar(const PagedKv& kv, const int32_t* blocks, int kv_head, int64_t first,
                              int64_t n_rows, float* k32, float* v32) {
  const int64_t head_rows = int64_t{kv.block_size} * kv.head_dim;  // one (block, kv head)
  for (int64_t p0 = first; p0 < n_rows; p0 += kv.block_size) {
    const int64_t count = std::min<int64_t>(kv.block_size, n_rows - p0) * kv.head_dim;
    const int64_t off = (int64_t{blocks[p0 / kv.block_size]} * kv.n_kv_head + kv_head) * head_rows;
    const int64_t dst = (p0 - first) * kv.head_dim;
    for (int64_t i = 0; i < count; ++i) {
      k32[dst + i] = fp16_to_fp32(kv.k[off + i]);
      v32[dst + i] = fp16_to_fp32(kv.v[off + i]);
    }
  }
}

void attend_rows_f32_scalar(const float* q, const float* k32, const float* v32, int64_t n_pos,
                            int head_dim, float scale, float* scores, float* out, float cap) {
  for (int64_t p = 0; p < n_pos; ++p) {
    float dot = 0.0f;
    for (int d = 0; d < head_dim; ++d) dot += q[d] * k32[p * head_dim + d];
    scores[p] = dot * scale;
  }
  if (cap > 0) softcap(scores, n_pos, cap);
  softmax_scalar(scores, n_pos);
  for (int d = 0; d < head_dim; ++d) out[d] = 0.0f;
  for (int64_t p = 0; p < n_pos; ++p)
    for (int d = 0; d < head_dim; ++d) out[d] += scores[p] * v32[p * head_dim + d];
}

void paged_attention(const PagedKv& kv, std::span<const PagedSequence> seqs, const float* q,
                     int64_t q_stride, float* out, int64_t out_stride, int n_head, float scale,
                     ThreadPool& pool, PagedAttentionScratch& scratch) {
  const int n_threads = pool.size();
  const Plan plan = plan_work(kv, seqs, n_head, n_threads);
  if (scratch.per_thread.size() < static_cast<size_t>(n_threads))
    scratch.per_thread.resize(n_threads);
  for (std::vector<float>& t : scratch.per_thread)
    if (t.size() < static_cast<size_t>(plan.thread_floats)) t.resize(plan.thread_floats);

  const Call c{kv,       seqs,  q,
               q_stride, out,   out_stride,
               n_head,   scale,
               use_avx2() && paged_attention_avx2_supports(kv.head_dim) && kv.softcap == 0};
  std::atomic<int64_t> next{0};
  pool.run([&](int thread, int) {
    float* ts = scratch.per_thread[thread].data();
    for (int64_t i = next.fetch_add(1, std::memory_order_relaxed);
         i < static_cast<int64_t>(plan.items.size());
         i = next.fetch_add(1, std::memory_order_relaxed)) {
      run_item(c, plan.items[i], ts);
    }
  });
}

void paged_attention_reference(const PagedKv& kv, std::span<const PagedSequence> seqs,
                               const float* q, int64_t q_stride, float* out, int64_t out_stride,
                               int n_head, float scale) {
  const int64_t head_rows = int64_t{kv.block_size} * kv.head_dim;
  for (const PagedSequence& s : seqs) {
    if (s.n_tokens <= 0) continue;
    const int64_t n_rows = s.pos0 + s.n_tokens;
    // Contiguous copies in attention.h's layout: (n_kv_head, n_rows, head_dim).
    std::vector<uint16_t> k(kv.n_kv_head * n_rows * kv.head_dim), v(k.size());
    for (int g = 0; g < kv.n_kv_head; ++g) {
      for (int64_t p = 0; p < n_rows; ++p) {
        const int64_t src = (int64_t{s.blocks[p / kv.block_size]} * kv.n_kv_head + g) * head_rows +
                            (p % kv.block_size) * kv.head_dim;
        const int64_t dst = (g * n_rows + p) * kv.head_dim;
        std::copy_n(kv.k + src, kv.head_dim, k.begin() + dst);
        std::copy_n(kv.v + src, kv.head_dim, v.begin() + dst);
      }
    }
    const AttentionArgs a{q + s.q_row * q_stride,
                          q_stride,
                          k.data(),
                          v.data(),
                          kv.head_dim,
                          n_rows * kv.head_dim,
                          out + s.q_row * out_stride,
                          out_stride,
                          s.n_tokens,
                          s.pos0,
                          n_head,
                          kv.n_kv_head,
                          kv.head_dim,
                          scale,
                          kv.window,
                          kv.softcap};
    std::vector<float> scores(attention_scratch_floats(a));
    attention_scalar(a, 0, int64_t{n_head} * s.n_tokens, scores.data());
  }
}

}  // namespace tokenfab::kernels
