#include "core/speculative/draft_head.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <queue>
#include <set>

#include <nlohmann/json.hpp>

#include "core/common/error.h"
#include "core/gguf/gguf_reader.h"
#include "core/gguf/gguf_writer.h"
#include "core/speculative/dense_math.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/quantize.h"
#include "kernels/cpu/repack.h"

namespace tokenfab {

namespace {

constexpr const char* kArchitecture = "tokenfab-draft";
constexpr const char* kPrefix = "tokenfab.draft.";
constexpr int32_t kMaxHeads = 64;
constexpr int32_t kMaxEmbd = 1 << 16;
constexpr int32_t kMaxVocab = 1 << 24;

std::string weight_name(int k) {
  return "medusa." + std::to_string(k) + ".weight";
}
std::string bias_name(int k) {
  return "medusa." + std::to_string(k) + ".bias";
}
constexpr const char* kMtpWeight = "mtp.weight";
constexpr const char* kMtpBias = "mtp.bias";
constexpr const char* kMtpVocab = "mtp.vocab";
constexpr const char* kMtpTaps = "mtp.taps";
constexpr const char* kMtpFuseWeight = "mtp.fuse.weight";
constexpr const char* kMtpFuseBias = "mtp.fuse.bias";
constexpr size_t kMaxTaps = 16;

bool is_sha256_hex(std::string_view s) {
  if (s.size() != 64) return false;
  for (char c : s)
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
  return true;
}

std::string sha_prefix(std::string_view sha) {
  return std::string(sha.substr(0, 12)) + "…";
}

void check_info(const DraftHeadInfo& info, const std::string& where) {
  if (info.type != "medusa" && info.type != "mtp")
    throw Error(where + ": draft head type '" + info.type +
                "' is not supported (expected medusa or mtp)");
  if (info.n_heads < 1 || info.n_heads > kMaxHeads)
    throw Error(where + ": n_heads " + std::to_string(info.n_heads) + " is outside [1, " +
                std::to_string(kMaxHeads) + "]");
  if (info.n_embd < 1 || info.n_embd > kMaxEmbd)
    throw Error(where + ": n_embd " + std::to_string(info.n_embd) + " is outside [1, " +
                std::to_string(kMaxEmbd) + "]");
  if (info.n_vocab < 1 || info.n_vocab > kMaxVocab)
    throw Error(where + ": n_vocab " + std::to_string(info.n_vocab) + " is outside [1, " +
                std::to_string(kMaxVocab) + "]");
  if (!info.taps.empty() && info.type != "mtp")
    throw Error(where + ": only an mtp head reads layer taps");
  if (info.taps.size() > kMaxTaps)
    throw Error(where + ": " + std::to_string(info.taps.size()) + " layer taps (at most " +
                std::to_string(kMaxTaps) + ")");
  for (size_t i = 0; i < info.taps.size(); ++i)
    if (info.taps[i] < 0 || (i > 0 && info.taps[i] <= info.taps[i - 1]))
      throw Error(where + ": the layer taps must be ascending layer indices");
}

void check_json_object(const std::string& text, const std::string& where) {
  const auto json = nlohmann::json::parse(text, nullptr, false);
  if (json.is_discarded() || !json.is_object()) throw Error(where + " is not a JSON object");
}

// Sorts and deduplicates an mtp vocabulary; throws Error (prefixed by `where`) when it is empty or
// holds an id outside [0, n_vocab).
std::vector<TokenId> checked_vocab(std::vector<TokenId> vocab, int32_t n_vocab,
                                   const std::string& where) {
  std::sort(vocab.begin(), vocab.end());
  vocab.erase(std::unique(vocab.begin(), vocab.end()), vocab.end());
  if (vocab.empty()) throw Error(where + ": the mtp draft vocabulary is empty");
  if (vocab.front() < 0 || vocab.back() >= n_vocab)
    throw Error(where + ": the mtp draft vocabulary holds token id " +
                std::to_string(vocab.front() < 0 ? vocab.front() : vocab.back()) +
                ", outside [0, " + std::to_string(n_vocab) + ")");
  return vocab;
}

// Metadata readers that name the file and the key in every error.
class DraftReader {
 public:
  explicit DraftReader(const gguf::GgufFile& file) : file_(file), where_(file.name()) {}

  const std::string& where() const { return where_; }

  std::string string(const std::string& key) const {
    return value(key).as_string(where_ + ": " + key);
  }
  int32_t int32(const std::string& key) const {
    const int64_t v = value(key).as_int(where_ + ": " + key);
    if (v < INT32_MIN || v > INT32_MAX) throw Error(where_ + ": " + key + " is out of range");
    return static_cast<int32_t>(v);
  }

  // The 1-D I32 tensor `name` of any length, copied out.
  std::vector<int32_t> int32_tensor(const std::string& name) const {
    const gguf::TensorInfo* t = checked(name, gguf::TensorType::I32, nullptr);
    if (t->dims.size() != 1) throw Error(where_ + ": tensor " + name + " is not 1-D");
    std::vector<int32_t> out(t->n_elements);
    std::memcpy(out.data(), t->data, out.size() * sizeof(int32_t));
    return out;
  }

  // The F32 tensor `name` with dims `dims`, copied out; its values must be finite.
  std::vector<float> tensor(const std::string& name, std::vector<uint64_t> dims) const {
    const gguf::TensorInfo* t = checked(name, gguf::TensorType::F32, &dims);
    std::vector<float> out(t->n_elements);
    std::memcpy(out.data(), t->data, out.size() * sizeof(float));
    for (float x : out)
      if (!std::isfinite(x)) throw Error(where_ + ": tensor " + name + " holds a non-finite value");
    return out;
  }

 private:
  // The tensor `name`, which must exist with `type` (and `dims`, when given).
  const gguf::TensorInfo* checked(const std::string& name, gguf::TensorType type,
                                  const std::vector<uint64_t>* dims) const {
    const gguf::TensorInfo* t = file_.find_tensor(name);
    if (!t) throw Error(where_ + ": missing tensor " + name);
    if (t->type != type)
      throw Error(where_ + ": tensor " + name + " has type " + gguf::tensor_type_name(t->type) +
                  ", expected " + gguf::tensor_type_name(type));
    if (dims && t->dims != *dims) {
      std::string want, got;
      for (uint64_t d : *dims) want += (want.empty() ? "" : " × ") + std::to_string(d);
      for (uint64_t d : t->dims) got += (got.empty() ? "" : " × ") + std::to_string(d);
      throw Error(where_ + ": tensor " + name + " has shape " + got + ", expected " + want);
    }
    return t;
  }

  const gguf::Value& value(const std::string& key) const {
    const gguf::Value* v = file_.find(key);
    if (!v) throw Error(where_ + ": missing metadata key " + key);
    return *v;
  }

  const gguf::GgufFile& file_;
  std::string where_;
};

// z (n, d) ← h + SiLU(z + b) in columns [j0, j1): the residual block's output from its
// pre-activation W x in z.
void add_silu_residual(const float* h, const float* b, int64_t n, int64_t d, float* z, int64_t j0,
                       int64_t j1) {
  for (int64_t r = 0; r < n; ++r) {
    float* zr = z + r * d;
    const float* hr = h + r * d;
    for (int64_t j = j0; j < j1; ++j) {
      const float u = zr[j] + b[j];
      zr[j] = hr[j] + u / (1.0f + std::exp(-u));
    }
  }
}

}  // namespace

void DraftHead::residual(int head, const float* h, int64_t n, float* z) const {
  const int64_t d = info.n_embd;
  const float* wk = w[static_cast<size_t>(head)].data();
  const float* bk = b[static_cast<size_t>(head)].data();
  dense::gemm_nt(n, d, d, h, d, wk, d, z, d, false);  // z ← W h (rows)
  add_silu_residual(h, bk, n, d, z, 0, d);
}

namespace {

// fn(begin, end) over `parts` parts of [0, n) (multiples of `grain`), through `split` when there
// is one and more than one part.
void for_parts(const DraftSplit* split, int64_t parts, int64_t n, int64_t grain,
               const std::function<void(int64_t, int64_t)>& fn) {
  if (split == nullptr || parts <= 1) return fn(0, n);
  (*split)(parts, [&](int64_t p) {
    int64_t begin, end;
    kernels::ThreadPool::split(n, grain, static_cast<int>(p), static_cast<int>(parts), begin, end);
    if (begin < end) fn(begin, end);
  });
}

// A row of logits' largest value and the sum of exp(logit − largest): the softmax of the largest
// is 1 / sum, and log(sum of exp(logit)) is top + log(sum).
struct SoftmaxNorm {
  float top = 0.0f;
  double sum = 0.0;
  explicit SoftmaxNorm(std::span<const float> logits)
      : top(*std::max_element(logits.begin(), logits.end())) {
    for (const float l : logits) sum += std::exp(static_cast<double>(l - top));
  }
  double log_norm() const { return static_cast<double>(top) + std::log(sum); }
};

}  // namespace

void DraftHead::mtp_step(const float* h, const float* e, int64_t n, float* z,
                         const DraftSplit* split, int64_t parts) const {
  const int64_t d = info.n_embd;
  const float* wk = w.front().data();
  const float* bk = b.front().data();
  // Output columns in multiples of the dense kernel's 3-column tile, so that each column is
  // computed by the tile it would be in without the split.
  for_parts(split, parts, d, 3, [&](int64_t j0, int64_t j1) {
    const float* wj = wk + j0 * 2 * d;
    dense::gemm_nt(n, j1 - j0, d, h, d, wj, 2 * d, z + j0, d, false);     // z ← W_h h
    dense::gemm_nt(n, j1 - j0, d, e, d, wj + d, 2 * d, z + j0, d, true);  // z += W_e e
    add_silu_residual(h, bk, n, d, z, j0, j1);
  });
}

void DraftHead::vocab_logits(const LlamaModel& model, const float* z, int64_t n, float* logits,
                             const DraftSplit* split, int64_t parts) const {
  const int64_t d = info.n_embd;
  const WeightMatrix& out = model.output();
  const auto v = static_cast<int64_t>(vocab.size());
  VocabRows& cache = *vocab_rows_;
  std::call_once(cache.once, [&] {
    if (out.cols != d || out.rows != info.n_vocab)
      throw Error("draft head '" + info.name + "' does not fit the model's LM head");
    // Where the target's LM head is packed (x8 or x16), so are these rows, in the same groups:
    // padded to whole groups with copies of the last row, so that every row takes the kernel the
    // target's takes.
    const int64_t group = std::max(out.group_rows, 1);
    cache.padded_rows = (v + group - 1) / group * group;
    std::vector<uint8_t> rows(static_cast<size_t>(cache.padded_rows) * out.row_bytes);
    for (int64_t j = 0; j < cache.padded_rows; ++j)
      std::memcpy(rows.data() + j * out.row_bytes, out.row(vocab[std::min(j, v - 1)]),
                  out.row_bytes);
    if (out.packed != nullptr) {
      cache.rows.resize(rows.size());
      kernels::repack(out.type, out.group_rows, rows.data(), out.row_bytes, cache.rows.data(),
                      cache.padded_rows, d);
    } else {
      cache.rows = std::move(rows);
    }
  });
  // Padded rows go to a buffer (n, padded_rows) whose first v columns are then the logits.
  thread_local std::vector<float> padded;
  const bool exact = cache.padded_rows == v;
  if (!exact) padded.resize(static_cast<size_t>(n * cache.padded_rows));
  float* y = exact ? logits : padded.data();
  const int group = out.group_rows;  // 0: the GGUF rows
  // Each part on one thread (the calling worker's, or one of the device's through `split`), with
  // its own single-thread team and scratch: a part is whole row groups of the vocabulary (in
  // multiples of 8 rows either way).
  const auto part = [&](int64_t r0, int64_t r1) {
    thread_local kernels::ThreadPool pool(1);
    thread_local kernels::ActivationScratch scratch;
    const size_t offset = group != 0 ? static_cast<size_t>(r0 / group) *
                                           kernels::packed_group_stride(out.type, group, d)
                                     : static_cast<size_t>(r0) * out.row_bytes;
    const kernels::MatmulJob job{out.type, cache.rows.data() + offset, r1 - r0,
                                 y + r0,   cache.padded_rows,          group};
    kernels::matmul(pool, {&job, 1}, z, d, d, n, scratch);
  };
  for_parts(split, parts, cache.padded_rows, std::max(kernels::kX8Rows, group), part);
  if (!exact)
    for (int64_t r = 0; r < n; ++r)
      std::copy_n(padded.data() + r * cache.padded_rows, v, logits + r * v);
}

void DraftHead::mtp_root(const float* f, int64_t n, float* g, const DraftSplit* split,
                         int64_t parts) const {
  const int64_t d = info.n_embd, width = feature_width(), t = width - d;
  if (t == 0) {
    for (int64_t r = 0; r < n; ++r) std::copy_n(f + r * width, d, g + r * d);
    return;
  }
  // Output columns in whole tiles of the dense kernel, as in mtp_step.
  for_parts(split, parts, d, 3, [&](int64_t j0, int64_t j1) {
    for (int64_t r = 0; r < n; ++r) std::copy_n(f + r * width + j0, j1 - j0, g + r * d + j0);
    dense::gemm_nt(n, j1 - j0, t, f + d, width, fuse_w.data() + j0 * t, t, g + j0, d,
                   true);  // g += W_f taps
    for (int64_t r = 0; r < n; ++r)
      for (int64_t j = j0; j < j1; ++j) g[r * d + j] += fuse_b[static_cast<size_t>(j)];
  });
}

void DraftHead::mtp_propose(const LlamaModel& model, const float* h, TokenId last,
                            std::span<const int32_t> widths, int32_t max_nodes,
                            std::vector<TokenId>& draft, std::vector<int32_t>& parent,
                            const DraftSplit* split, int64_t parts, const ChainStop* stop) const {
  const int64_t d = info.n_embd, v = static_cast<int64_t>(vocab.size());
  draft.clear();
  parent.clear();
  if (stop && std::any_of(widths.begin(), widths.end(), [](int32_t w) { return w != 1; }))
    stop = nullptr;   // trees are not stopped
  double path = 1.0;  // the chain's path probability so far (with `stop`)
  // The frontier: per node its hidden state, token and index in `draft` (−1: the root).
  std::vector<float> z(static_cast<size_t>(d)), e, next, logits;
  mtp_root(h, 1, z.data(), split, parts);
  std::vector<TokenId> tokens = {last};
  std::vector<int32_t> index = {-1};
  std::vector<int64_t> order(static_cast<size_t>(v));
  for (const int32_t width : widths) {
    const auto n = static_cast<int64_t>(tokens.size());
    if (n == 0) break;
    e.resize(static_cast<size_t>(n * d));
    next.resize(e.size());
    logits.resize(static_cast<size_t>(n * v));
    embed_tokens(model, tokens, e.data());
    mtp_step(z.data(), e.data(), n, next.data(), split, parts);
    vocab_logits(model, next.data(), n, logits.data(), split, parts);
    std::vector<float> level_z;
    std::vector<TokenId> level_tokens;
    std::vector<int32_t> level_index;
    DraftVerdict verdict = DraftVerdict::kKeep;
    for (int64_t j = 0; j < n; ++j) {
      const float* l = logits.data() + j * v;
      if (stop) {  // a chain: one row, whose top token is the draft
        path /= SoftmaxNorm(std::span(l, static_cast<size_t>(v))).sum;
        verdict = (*stop)(path);
        if (verdict == DraftVerdict::kDrop) return;
      }
      const int64_t take = std::min<int64_t>(width, v);
      std::iota(order.begin(), order.end(), int64_t{0});
      std::partial_sort(
          order.begin(), order.begin() + take, order.end(),
          [l](int64_t a, int64_t b) { return l[a] > l[b] || (l[a] == l[b] && a < b); });
      for (int64_t c = 0; c < take; ++c) {
        if (static_cast<int32_t>(draft.size()) == max_nodes) return;
        const TokenId token = vocab[static_cast<size_t>(order[static_cast<size_t>(c)])];
        level_index.push_back(static_cast<int32_t>(draft.size()));
        draft.push_back(token);
        parent.push_back(index[static_cast<size_t>(j)]);
        level_tokens.push_back(token);
        level_z.insert(level_z.end(), next.begin() + j * d, next.begin() + (j + 1) * d);
      }
    }
    if (verdict == DraftVerdict::kKeepLast) return;
    z = std::move(level_z);
    tokens = std::move(level_tokens);
    index = std::move(level_index);
  }
}

void DraftHead::mtp_propose_best_first(const LlamaModel& model, const float* h, TokenId last,
                                       std::span<const int32_t> widths, int32_t nodes,
                                       std::vector<TokenId>& draft, std::vector<int32_t>& parent,
                                       const DraftSplit* split, int64_t parts) const {
  const int64_t d = info.n_embd, v = static_cast<int64_t>(vocab.size());
  draft.clear();
  parent.clear();
  // Nodes in the order they enter the tree; node −1 is `last`, whose state is h.
  struct Node {
    TokenId token;
    int32_t parent, depth;  // depth 1: a child of `last`
  };
  std::vector<Node> tree;
  std::vector<float> states;  // (tree.size(), d): ĥ of each node that has children, else unused
  struct Candidate {
    double log_p;
    int64_t order;  // ties: the candidate found first
    TokenId token;
    int32_t parent, depth;
    bool operator<(const Candidate& o) const {
      return log_p < o.log_p || (log_p == o.log_p && order > o.order);
    }
  };
  std::priority_queue<Candidate> frontier;
  int64_t found = 0;
  std::vector<float> e(static_cast<size_t>(d)), z(static_cast<size_t>(d)),
      logits(static_cast<size_t>(v));
  std::vector<int64_t> order(static_cast<size_t>(v));
  // The children of node `at` (−1: `last`): one mtp step from its parent's state with its token,
  // then its best widths[depth] tokens as candidates.
  const auto expand = [&](int32_t at, const float* from, TokenId token, int32_t depth,
                          double log_p) {
    if (depth >= static_cast<int32_t>(widths.size())) return;
    embed_tokens(model, std::span(&token, 1), e.data());
    float* next = at < 0 ? z.data() : states.data() + static_cast<size_t>(at) * d;
    mtp_step(from, e.data(), 1, next, split, parts);
    vocab_logits(model, next, 1, logits.data(), split, parts);
    const double log_norm = SoftmaxNorm(logits).log_norm();
    const int64_t take = std::min<int64_t>(widths[static_cast<size_t>(depth)], v);
    std::iota(order.begin(), order.end(), int64_t{0});
    const float* l = logits.data();
    std::partial_sort(order.begin(), order.begin() + take, order.end(),
                      [l](int64_t a, int64_t b) { return l[a] > l[b] || (l[a] == l[b] && a < b); });
    for (int64_t c = 0; c < take; ++c) {
      const auto j = static_cast<size_t>(order[static_cast<size_t>(c)]);
      frontier.push(
          {log_p + static_cast<double>(logits[j]) - log_norm, found++, vocab[j], at, depth + 1});
    }
  };
  states.resize(static_cast<size_t>(std::max(nodes, 0)) * d);
  std::vector<float> root(static_cast<size_t>(d));
  mtp_root(h, 1, root.data(), split, parts);
  expand(-1, root.data(), last, 0, 0.0);
  while (static_cast<int32_t>(tree.size()) < nodes && !frontier.empty()) {
    const Candidate c = frontier.top();
    frontier.pop();
    const auto at = static_cast<int32_t>(tree.size());
    tree.push_back({c.token, c.parent, c.depth});
    const float* from = c.parent < 0 ? z.data() : states.data() + static_cast<size_t>(c.parent) * d;
    expand(at, from, c.token, c.depth, c.log_p);
  }
  // Level order: by depth, then by the parent's new index, then most probable first.
  std::vector<int32_t> sorted(tree.size()), renamed(tree.size());
  std::iota(sorted.begin(), sorted.end(), 0);
  for (int32_t depth = 1, placed = 0; placed < static_cast<int32_t>(tree.size()); ++depth) {
    const auto level_begin = sorted.begin() + placed;
    const auto level_end = std::stable_partition(level_begin, sorted.end(), [&](int32_t i) {
      return tree[static_cast<size_t>(i)].depth == depth;
    });
    const auto parent_rank = [&](int32_t i) {
      const int32_t p = tree[static_cast<size_t>(i)].parent;
      return p < 0 ? -1 : renamed[static_cast<size_t>(p)];
    };
    std::stable_sort(level_begin, level_end,
                     [&](int32_t a, int32_t b) { return parent_rank(a) < parent_rank(b); });
    for (auto it = level_begin; it != level_end; ++it)
      renamed[static_cast<size_t>(*it)] = static_cast<int32_t>(it - sorted.begin());
    placed = static_cast<int32_t>(level_end - sorted.begin());
  }
  for (const int32_t i : sorted) {
    const Node& n = tree[static_cast<size_t>(i)];
    draft.push_back(n.token);
    parent.push_back(n.parent < 0 ? -1 : renamed[static_cast<size_t>(n.parent)]);
  }
}

void embed_tokens(const LlamaModel& model, std::span<const TokenId> tokens, float* out) {
  const WeightMatrix& emb = model.token_embedding();
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (tokens[i] < 0 || tokens[i] >= emb.rows)
      throw Error("token id " + std::to_string(tokens[i]) + " is outside the vocabulary");
    model.embed(tokens[i], out + i * emb.cols);  // the model's own input (scaled in Gemma)
  }
}

DraftHead make_mtp_head(DraftHeadInfo info, std::vector<TokenId> vocab) {
  const std::string where = "draft head '" + info.name + "'";
  check_info(info, where);
  if (info.type != "mtp") throw Error(where + ": make_mtp_head needs type mtp");
  DraftHead head;
  const auto d = static_cast<size_t>(info.n_embd);
  head.w.assign(1, std::vector<float>(2 * d * d, 0.0f));
  head.b.assign(1, std::vector<float>(d, 0.0f));
  head.vocab = checked_vocab(std::move(vocab), info.n_vocab, where);
  head.fuse_w.assign(info.taps.size() * d * d, 0.0f);
  head.fuse_b.assign(info.taps.empty() ? 0 : d, 0.0f);
  head.info = std::move(info);
  return head;
}

DraftHead make_medusa_head(DraftHeadInfo info) {
  check_info(info, "draft head '" + info.name + "'");
  if (info.type != "medusa")
    throw Error("draft head '" + info.name + "': make_medusa_head needs type medusa");
  DraftHead head;
  const auto d = static_cast<size_t>(info.n_embd);
  head.w.assign(static_cast<size_t>(info.n_heads), std::vector<float>(d * d, 0.0f));
  head.b.assign(static_cast<size_t>(info.n_heads), std::vector<float>(d, 0.0f));
  head.info = std::move(info);
  return head;
}

void save_draft_head(const DraftHead& head, const std::filesystem::path& path) {
  const DraftHeadInfo& info = head.info;
  const std::string where = path.string();
  check_info(info, where);
  const auto d = static_cast<uint64_t>(info.n_embd);
  check_json_object(info.training_config_json, where + ": training_config");
  check_json_object(info.summary_json, where + ": summary");
  const size_t blocks = head.is_mtp() ? 1 : static_cast<size_t>(info.n_heads);
  if (head.w.size() != blocks || head.b.size() != blocks)
    throw Error(where + ": the head holds " + std::to_string(head.w.size()) +
                " weight matrices, expected " + std::to_string(blocks));

  gguf::GgufWriter writer;
  writer.add("general.architecture", gguf::Value::string(kArchitecture));
  writer.add("general.name", gguf::Value::string(info.name));
  const std::string p = kPrefix;
  writer.add(p + "type", gguf::Value::string(info.type));
  writer.add(p + "name", gguf::Value::string(info.name));
  writer.add(p + "domain", gguf::Value::string(info.domain));
  writer.add(p + "base_model_sha256", gguf::Value::string(info.base_model_sha256));
  writer.add(p + "n_heads", gguf::Value::i32(info.n_heads));
  writer.add(p + "n_embd", gguf::Value::i32(info.n_embd));
  writer.add(p + "n_vocab", gguf::Value::i32(info.n_vocab));
  writer.add(p + "training_config", gguf::Value::string(info.training_config_json));
  writer.add(p + "summary", gguf::Value::string(info.summary_json));
  const auto bytes = [](const auto& v) {
    return std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(v.data()),
                                    v.size() * sizeof(v[0]));
  };
  if (head.is_mtp()) {
    if (head.w[0].size() != 2 * d * d || head.b[0].size() != d)
      throw Error(where + ": the mtp block has the wrong number of weights");
    const std::vector<TokenId> vocab = checked_vocab(head.vocab, info.n_vocab, where);
    if (vocab != head.vocab) throw Error(where + ": the mtp vocabulary is not sorted and unique");
    writer.add_tensor(kMtpWeight, gguf::TensorType::F32, {2 * d, d}, bytes(head.w[0]));
    writer.add_tensor(kMtpBias, gguf::TensorType::F32, {d}, bytes(head.b[0]));
    writer.add_tensor(kMtpVocab, gguf::TensorType::I32, {vocab.size()}, bytes(vocab));
    if (!info.taps.empty()) {
      const uint64_t t = info.taps.size() * d;
      if (head.fuse_w.size() != t * d || head.fuse_b.size() != d)
        throw Error(where + ": the mtp taps' fusion has the wrong number of weights");
      writer.add_tensor(kMtpTaps, gguf::TensorType::I32, {info.taps.size()}, bytes(info.taps));
      writer.add_tensor(kMtpFuseWeight, gguf::TensorType::F32, {t, d}, bytes(head.fuse_w));
      writer.add_tensor(kMtpFuseBias, gguf::TensorType::F32, {d}, bytes(head.fuse_b));
    }
  }
  for (size_t i = 0; i < (head.is_mtp() ? 0 : blocks); ++i) {
    const auto& w = head.w[i];
    const auto& b = head.b[i];
    if (w.size() != d * d || b.size() != d)
      throw Error(where + ": head " + std::to_string(i + 1) + " has the wrong number of weights");
    writer.add_tensor(weight_name(static_cast<int>(i) + 1), gguf::TensorType::F32, {d, d},
                      bytes(w));
    writer.add_tensor(bias_name(static_cast<int>(i) + 1), gguf::TensorType::F32, {d}, bytes(b));
  }
  writer.write(path);
}

DraftHead load_draft_head(const std::filesystem::path& path) {
  const gguf::GgufFile file = gguf::GgufFile::open(path);
  const DraftReader r(file);
  const std::string& where = r.where();
  const std::string arch = r.string("general.architecture");
  if (arch != kArchitecture)
    throw Error(where + ": general.architecture is '" + arch + "', expected '" + kArchitecture +
                "' (not a draft-head file)");
  const std::string p = kPrefix;
  DraftHeadInfo info;
  info.type = r.string(p + "type");
  if (info.type != "medusa" && info.type != "mtp")
    throw Error(where + ": draft head type '" + info.type +
                "' is not supported (expected medusa or mtp)");
  info.name = r.string(p + "name");
  info.domain = r.string(p + "domain");
  info.base_model_sha256 = r.string(p + "base_model_sha256");
  if (!is_sha256_hex(info.base_model_sha256))
    throw Error(where + ": " + p + "base_model_sha256 '" + info.base_model_sha256 +
                "' is not a sha256 (64 lowercase hex digits)");
  info.n_heads = r.int32(p + "n_heads");
  info.n_embd = r.int32(p + "n_embd");
  info.n_vocab = r.int32(p + "n_vocab");
  check_info(info, where + ": " + p + "*");
  info.training_config_json = r.string(p + "training_config");
  check_json_object(info.training_config_json, where + ": " + p + "training_config");
  info.summary_json = r.string(p + "summary");
  check_json_object(info.summary_json, where + ": " + p + "summary");

  DraftHead head;
  const auto d = static_cast<uint64_t>(info.n_embd);
  std::set<std::string> expected;
  if (info.type == "mtp") {
    head.w.push_back(r.tensor(kMtpWeight, {2 * d, d}));
    head.b.push_back(r.tensor(kMtpBias, {d}));
    const std::vector<int32_t> ids = r.int32_tensor(kMtpVocab);
    head.vocab = checked_vocab(std::vector<TokenId>(ids.begin(), ids.end()), info.n_vocab, where);
    if (head.vocab.size() != ids.size())
      throw Error(where + ": " + kMtpVocab + " is not sorted and unique");
    expected = {kMtpWeight, kMtpBias, kMtpVocab};
    if (file.find_tensor(kMtpTaps) != nullptr) {
      info.taps = r.int32_tensor(kMtpTaps);
      check_info(info, where + ": " + kMtpTaps);
      if (info.taps.empty()) throw Error(where + ": " + kMtpTaps + " is empty");
      const uint64_t t = info.taps.size() * d;
      head.fuse_w = r.tensor(kMtpFuseWeight, {t, d});
      head.fuse_b = r.tensor(kMtpFuseBias, {d});
      expected.insert({kMtpTaps, kMtpFuseWeight, kMtpFuseBias});
    }
  }
  for (int32_t k = 1; k <= (info.type == "mtp" ? 0 : info.n_heads); ++k) {
    head.w.push_back(r.tensor(weight_name(k), {d, d}));
    head.b.push_back(r.tensor(bias_name(k), {d}));
    expected.insert(weight_name(k));
    expected.insert(bias_name(k));
  }
  for (const gguf::TensorInfo& t : file.tensors())
    if (!expected.count(t.name))
      throw Error(where + ": unexpected tensor " + t.name + " (n_heads is " +
                  std::to_string(info.n_heads) + ")");
  head.info = std::move(info);
  return head;
}

void check_head_matches(const DraftHeadInfo& info, std::string_view model_sha256, int64_t n_embd,
                        int64_t n_vocab, std::string_view model_name) {
  const std::string head = "head '" + info.name + "'";
  if (info.base_model_sha256 != model_sha256)
    throw Error(head + " was trained for model " + sha_prefix(info.base_model_sha256) +
                ", not for " + std::string(model_name) + " (" + sha_prefix(model_sha256) + ")");
  if (info.n_embd != n_embd || info.n_vocab != n_vocab)
    throw Error(head + " has n_embd " + std::to_string(info.n_embd) + " and n_vocab " +
                std::to_string(info.n_vocab) + ", but " + std::string(model_name) + " has " +
                std::to_string(n_embd) + " and " + std::to_string(n_vocab));
}

}  // namespace tokenfab
