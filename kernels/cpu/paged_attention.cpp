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
// largest first from a shared counter, the small last ones even out the threads' totals.
constexpr int64_t kItemsPerThread = 4;
// A prefill item gathers its kv head's rows once for all its tokens: at least this many tokens
// keep the gather (n_rows · head_dim) small against the attention (tokens · group · n_rows ·
// head_dim).
constexpr int64_t kMinPrefillTokens = 8;

// One unit of the parallel region. Decode (partials >= 0): kv heads [kv_head, kv_head_end) of
// sequence `seq` over blocks [begin, end), writing split `split` of its n_splits partial records
// per query head at scratch.partials + partials. Prefill (partials < 0): query tokens
// [begin, end) of kv head `kv_head`'s query heads.
struct WorkItem {
  int64_t cost;  // ≈ query heads × positions attended
  int32_t seq;
  int32_t kv_head, kv_head_end;
  int64_t begin, end;
  int64_t partials;
  int32_t split, n_splits;
};

// A decode sequence's records: (n_head, n_splits, 2 + head_dim) floats at partials.
struct DecodeMerge {
  int32_t seq;
  int64_t partials;
  int n_splits;
};

struct Plan {
  std::vector<WorkItem> items;  // largest cost first
  std::vector<DecodeMerge> merges;
  int64_t partial_floats = 0;
  int64_t thread_floats = 0;  // per-thread scratch the largest item needs
};

int64_t causal_cost(int64_t pos0, int64_t t0, int64_t t1) {  // Σ_{t0 ≤ t < t1} (pos0 + t + 1)
  return (t1 - t0) * pos0 + (t1 * (t1 + 1) - t0 * (t0 + 1)) / 2;
}

// Decode: items of about `target` cost, each a range of the sequence's blocks × a range of kv
// heads, writing one split's partial records; the records are merged after the parallel region.
// Ranges of blocks come first and take all kv heads (fewer splits, fewer records to merge);
// kv heads are split too only where single blocks are still larger than `target`.
void plan_decode(const PagedKv& kv, const PagedSequence& s, int32_t seq, int n_head, int64_t target,
                 Plan& plan) {
  const int group = n_head / kv.n_kv_head;
  const int64_t n_blocks = (s.pos0 + kv.block_size) / kv.block_size;  // covers pos0 + 1 rows
  const int64_t units = std::max<int64_t>(1, target / (int64_t{group} * kv.block_size));
  const int64_t per_split = std::clamp<int64_t>(units / kv.n_kv_head, 1, n_blocks);
  const int heads_per_item = static_cast<int>(std::min<int64_t>(units, kv.n_kv_head));
  const int n_splits = static_cast<int>((n_blocks + per_split - 1) / per_split);
  for (int sp = 0; sp < n_splits; ++sp) {
    const int64_t b0 = sp * per_split, b1 = std::min(n_blocks, b0 + per_split);
    const int64_t rows = std::min(b1 * kv.block_size, s.pos0 + 1) - b0 * kv.block_size;
    for (int g0 = 0; g0 < kv.n_kv_head; g0 += heads_per_item) {
      const int g1 = std::min(kv.n_kv_head, g0 + heads_per_item);
      plan.items.push_back(
          {(g1 - g0) * group * rows, seq, g0, g1, b0, b1, plan.partial_floats, sp, n_splits});
    }
  }
  plan.merges.push_back({seq, plan.partial_floats, n_splits});
  plan.partial_floats += int64_t{n_head} * n_splits * (2 + kv.head_dim);
  // Scalar: per block, attention_decode_partial's scratch for its rows and the group's block
  // records; AVX2: scores of 4 heads over the item's rows.
  const int64_t decode_floats = std::max<int64_t>(
      (kv.block_size + 1) * std::max<int64_t>(group, 1 + 2 * int64_t{kv.head_dim}) +
          int64_t{group} * (2 + kv.head_dim),
      4 * per_split * kv.block_size);
  plan.thread_floats = std::max(plan.thread_floats, decode_floats);
}

// Prefill: kv head × token ranges cut greedily to about `target` cost, each of at least
// kMinPrefillTokens tokens (or the whole chunk).
void plan_prefill(const PagedKv& kv, const PagedSequence& s, int32_t seq, int n_head,
                  int64_t target, Plan& plan) {
  const int group = n_head / kv.n_kv_head;
  for (int64_t t0 = 0; t0 < s.n_tokens;) {
    int64_t t1 = std::min(s.n_tokens, t0 + kMinPrefillTokens);
    while (t1 < s.n_tokens && group * causal_cost(s.pos0, t0, t1) < target) ++t1;
    if (s.n_tokens - t1 < kMinPrefillTokens) t1 = s.n_tokens;  // no short range at the end
    const int64_t n_rows = s.pos0 + t1;
    for (int g = 0; g < kv.n_kv_head; ++g)
      plan.items.push_back(
          {group * causal_cost(s.pos0, t0, t1) + n_rows, seq, g, g + 1, t0, t1, -1, 0, 0});
    plan.thread_floats = std::max(plan.thread_floats, n_rows * (1 + 2 * int64_t{kv.head_dim}));
    t0 = t1;
  }
}

Plan plan_work(const PagedKv& kv, std::span<const PagedSequence> seqs, int n_head, int n_threads) {
  int64_t total = 0;
  for (const PagedSequence& s : seqs) total += int64_t{n_head} * causal_cost(s.pos0, 0, s.n_tokens);
  // One thread gains nothing from splits (they only add partial records to merge).
  const int64_t target =
      n_threads == 1 ? total : std::max<int64_t>(1, total / (kItemsPerThread * n_threads));
  Plan plan;
  for (size_t i = 0; i < seqs.size(); ++i) {
    if (seqs[i].n_tokens == 1) {
      plan_decode(kv, seqs[i], static_cast<int32_t>(i), n_head, target, plan);
    } else if (seqs[i].n_tokens > 1) {
      plan_prefill(kv, seqs[i], static_cast<int32_t>(i), n_head, target, plan);
    }
  }
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
  bool avx2;
};

// The item's record for query head h: split w.split of h's n_splits.
float* decode_record(const Call& c, const WorkItem& w, float* partials, int64_t h) {
  return partials + w.partials + (h * w.n_splits + w.split) * (2 + int64_t{c.kv.head_dim});
}

// Scalar decode: attention_decode_partial_scalar over each (block, kv head) of the item (its rows
// are contiguous, stride head_dim), folding the block's records into the item's with the
// online-softmax update m' = max(m, m_b), l' = l·e^(m−m') + l_b·e^(m_b−m'), o likewise.
void run_decode_item_scalar(const Call& c, const WorkItem& w, float* partials, float* scratch) {
  const PagedKv& kv = c.kv;
  const PagedSequence& s = c.seqs[w.seq];
  const int group = c.n_head / kv.n_kv_head;
  const int64_t rec = 2 + int64_t{kv.head_dim};
  const int64_t head_rows = int64_t{kv.block_size} * kv.head_dim;
  float* block_recs = scratch;  // (group, rec)
  float* decode_scratch = scratch + group * rec;
  auto record = [&](int64_t h) { return decode_record(c, w, partials, h); };
  for (int64_t h = int64_t{w.kv_head} * group; h < int64_t{w.kv_head_end} * group; ++h) {
    float* r = record(h);
    r[0] = -std::numeric_limits<float>::infinity();
    std::fill(r + 1, r + rec, 0.0f);
  }
  AttentionArgs a{};  // one (block, kv head): its group of query heads over the block's rows
  a.q_stride = c.q_stride;
  a.kv_stride = kv.head_dim;
  a.kv_head_stride = 0;
  a.n_tokens = 1;
  a.n_head = group;
  a.n_kv_head = 1;
  a.head_dim = kv.head_dim;
  a.scale = c.scale;
  for (int64_t b = w.begin; b < w.end; ++b) {
    a.pos0 = std::min<int64_t>(kv.block_size, s.pos0 + 1 - b * kv.block_size) - 1;
    for (int kvh = w.kv_head; kvh < w.kv_head_end; ++kvh) {
      const int64_t off = (int64_t{s.blocks[b]} * kv.n_kv_head + kvh) * head_rows;
      a.q = c.q + s.q_row * c.q_stride + int64_t{kvh} * group * kv.head_dim;
      a.k = kv.k + off;
      a.v = kv.v + off;
      attention_decode_partial_scalar(a, 1, 0, block_recs, decode_scratch);
      for (int g = 0; g < group; ++g) {
        float* r = record(int64_t{kvh} * group + g);
        const float* br = block_recs + g * rec;
        // One exp per fold: the side with the larger max keeps weight 1 (e^-inf = 0 at first).
        const bool keep = r[0] >= br[0];
        const float e = std::exp(keep ? br[0] - r[0] : r[0] - br[0]);
        const float wa = keep ? 1.0f : e, wb = keep ? e : 1.0f;
        r[0] = keep ? r[0] : br[0];
        r[1] = r[1] * wa + br[1] * wb;
        for (int64_t d = 2; d < rec; ++d) r[d] = r[d] * wa + br[d] * wb;
      }
    }
  }
}

void run_decode_item(const Call& c, const WorkItem& w, float* partials, float* scratch) {
  if (!c.avx2) return run_decode_item_scalar(c, w, partials, scratch);
  const PagedSequence& s = c.seqs[w.seq];
  const int group = c.n_head / c.kv.n_kv_head;
  const int64_t p0 = w.begin * c.kv.block_size;
  const int64_t p1 = std::min(w.end * c.kv.block_size, s.pos0 + 1);
  for (int kvh = w.kv_head; kvh < w.kv_head_end; ++kvh) {
    const int64_t h0 = int64_t{kvh} * group;
    paged_decode_partial_avx2(c.kv, s.blocks, kvh, p0, p1,
                              c.q + s.q_row * c.q_stride + h0 * c.kv.head_dim, group, c.scale,
                              decode_record(c, w, partials, h0),
                              w.n_splits * (2 + int64_t{c.kv.head_dim}), scratch);
  }
}

// Gathers kv head w.kv_head's rows [0, pos0 + end) once, then attends each (query head, token).
void run_prefill_item(const Call& c, const WorkItem& w, float* scratch) {
  const PagedKv& kv = c.kv;
  const PagedSequence& s = c.seqs[w.seq];
  const int group = c.n_head / kv.n_kv_head;
  const int64_t n_rows = s.pos0 + w.end;
  float* k32 = scratch;                        // (n_rows, head_dim)
  float* v32 = k32 + n_rows * kv.head_dim;     // (n_rows, head_dim)
  float* scores = v32 + n_rows * kv.head_dim;  // n_rows
  if (c.avx2) {
    paged_gather_rows_avx2(kv, s.blocks, w.kv_head, n_rows, k32, v32);
  } else {
    paged_gather_rows_scalar(kv, s.blocks, w.kv_head, n_rows, k32, v32);
  }
  for (int g = 0; g < group; ++g) {
    const int64_t h = int64_t{w.kv_head} * group + g;
    for (int64_t t = w.begin; t < w.end; ++t) {
      const float* qt = c.q + (s.q_row + t) * c.q_stride + h * kv.head_dim;
      float* ot = c.out + (s.q_row + t) * c.out_stride + h * kv.head_dim;
      if (c.avx2) {
        attend_rows_f32_avx2(qt, k32, v32, s.pos0 + t + 1, kv.head_dim, c.scale, scores, ot);
      } else {
        attend_rows_f32_scalar(qt, k32, v32, s.pos0 + t + 1, kv.head_dim, c.scale, scores, ot);
      }
    }
  }
}

}  // namespace

void paged_gather_rows_scalar(const PagedKv& kv, const int32_t* blocks, int kv_head, int64_t n_rows,
                              float* k32, float* v32) {
  const int64_t head_rows = int64_t{kv.block_size} * kv.head_dim;  // one (block, kv head)
  for (int64_t p0 = 0; p0 < n_rows; p0 += kv.block_size) {
    const int64_t count = std::min<int64_t>(kv.block_size, n_rows - p0) * kv.head_dim;
    const int64_t off = (int64_t{blocks[p0 / kv.block_size]} * kv.n_kv_head + kv_head) * head_rows;
    for (int64_t i = 0; i < count; ++i) {
      k32[p0 * kv.head_dim + i] = fp16_to_fp32(kv.k[off + i]);
      v32[p0 * kv.head_dim + i] = fp16_to_fp32(kv.v[off + i]);
    }
  }
}

void attend_rows_f32_scalar(const float* q, const float* k32, const float* v32, int64_t n_pos,
                            int head_dim, float scale, float* scores, float* out) {
  for (int64_t p = 0; p < n_pos; ++p) {
    float dot = 0.0f;
    for (int d = 0; d < head_dim; ++d) dot += q[d] * k32[p * head_dim + d];
    scores[p] = dot * scale;
  }
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
  if (scratch.partials.size() < static_cast<size_t>(plan.partial_floats))
    scratch.partials.resize(plan.partial_floats);

  const Call c{kv,       seqs,  q,
               q_stride, out,   out_stride,
               n_head,   scale, use_avx2() && paged_attention_avx2_supports(kv.head_dim)};
  std::atomic<int64_t> next{0};
  float* partials = scratch.partials.data();
  pool.run([&](int thread, int) {
    float* ts = scratch.per_thread[thread].data();
    for (int64_t i = next.fetch_add(1, std::memory_order_relaxed);
         i < static_cast<int64_t>(plan.items.size());
         i = next.fetch_add(1, std::memory_order_relaxed)) {
      const WorkItem& w = plan.items[i];
      if (w.partials >= 0) {
        run_decode_item(c, w, partials, ts);
      } else {
        run_prefill_item(c, w, ts);
      }
    }
  });

  for (const DecodeMerge& m : plan.merges) {
    AttentionArgs a{};
    a.out = out + seqs[m.seq].q_row * out_stride;
    a.n_head = n_head;
    a.head_dim = kv.head_dim;
    attention_decode_merge(a, m.n_splits, partials + m.partials);
  }
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
                          scale};
    std::vector<float> scores(attention_scratch_floats(a));
    attention_scalar(a, 0, int64_t{n_head} * s.n_tokens, scores.data());
  }
}

}  // namespace tokenfab::kernels
