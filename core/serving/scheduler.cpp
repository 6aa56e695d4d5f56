#include "core/serving/scheduler.h"

#include <algorithm>
#include <string>

#include "core/common/error.h"
#include "core/common/log.h"

namespace tokenfab {

namespace {

// A chunk that verifies no drafts: n tokens of seq from first_token on.
ScheduledChunk plain_chunk(SequenceId seq, int32_t first_token, int32_t n, bool wants_logits) {
  return {.seq = seq,
          .first_token = first_token,
          .n_tokens = n,
          .wants_logits = wants_logits,
          .n_draft = 0,
          .tree_parent = {}};
}

}  // namespace

const char* sequence_status_name(SequenceStatus status) {
  switch (status) {
    case SequenceStatus::kWaiting:
      return "waiting";
    case SequenceStatus::kRunning:
      return "running";
    case SequenceStatus::kPreempted:
      return "preempted";
    case SequenceStatus::kFinished:
      return "finished";
    case SequenceStatus::kFailed:
      return "failed";
    case SequenceStatus::kReceiving:
      return "receiving";
  }
  return "unknown";
}

int32_t StepPlan::n_tokens() const {
  int32_t n = 0;
  for (const ScheduledChunk& c : chunks) n += c.n_tokens;
  return n;
}

int32_t StepPlan::n_logits() const {
  return static_cast<int32_t>(
      std::count_if(chunks.begin(), chunks.end(), [](const auto& c) { return c.wants_logits; }));
}

Scheduler::Scheduler(KvManager& kv, int32_t token_budget, int32_t max_running,
                     EndOfGeneration is_end_of_generation)
    : kv_(kv),
      token_budget_(token_budget),
      max_running_(max_running),
      is_end_of_generation_(std::move(is_end_of_generation)) {
  if (max_running < 1 || token_budget < max_running) {
    throw Error("scheduler: need token_budget >= max_running >= 1 (got token_budget " +
                std::to_string(token_budget) + ", max_running " + std::to_string(max_running) +
                "), so every running decode fits each step");
  }
}

SequenceState& Scheduler::state(SequenceId seq) {
  return const_cast<SequenceState&>(static_cast<const Scheduler*>(this)->sequence(seq));
}

const SequenceState& Scheduler::sequence(RequestId id) const {
  const auto it = sequences_.find(id);
  if (it == sequences_.end()) throw Error("scheduler: unknown request " + std::to_string(id));
  return it->second;
}

SequenceState Scheduler::make_state(Request request) const {
  const std::string where = "request " + std::to_string(request.id) + ": ";
  if (request.prompt.empty()) throw Error(where + "empty prompt (expected at least one token)");
  if (request.max_tokens < 1) {
    throw Error(where + "max_tokens is " + std::to_string(request.max_tokens) +
                " (expected at least 1)");
  }
  if (contains(request.id)) throw Error(where + "id already in use");
  SequenceState s;
  s.id = request.id;
  s.n_prompt = static_cast<int32_t>(request.prompt.size());
  s.tokens = std::move(request.prompt);
  s.max_tokens = request.max_tokens;
  s.stop_at_end_of_generation = request.stop_at_end_of_generation;
  return s;
}

void Scheduler::add(Request request) {
  SequenceState s = make_state(std::move(request));
  waiting_.push_back(s.id);
  sequences_.emplace(s.id, std::move(s));
}

std::optional<int32_t> Scheduler::receive(Request request) {
  SequenceState s = make_state(std::move(request));
  s.status = SequenceStatus::kReceiving;
  const SequenceId seq = s.id;
  sequences_.emplace(seq, std::move(s));
  const int32_t n_ready = allocate(seq);
  if (n_ready < 0) {
    sequences_.erase(seq);
    return std::nullopt;
  }
  state(seq).n_computed = n_ready;
  return n_ready;
}

void Scheduler::adopt(RequestId id, std::span<const TokenId> generated) {
  SequenceState& s = state(id);
  if (s.status != SequenceStatus::kReceiving)
    throw Error("scheduler: request " + std::to_string(id) + " is " +
                sequence_status_name(s.status) + ", not receiving");
  if (generated.empty())
    throw Error("scheduler: request " + std::to_string(id) + " arrived without a sampled token");
  mark_written(id, s.n_computed, s.n_prompt);
  s.n_computed = s.n_prompt;
  s.tokens.insert(s.tokens.end(), generated.begin(), generated.end());
  s.n_generated = static_cast<int32_t>(generated.size());
  s.status = SequenceStatus::kRunning;
  running_.push_back(id);
  if (s.n_generated >= s.max_tokens || (s.stop_at_end_of_generation && is_end_of_generation_ &&
                                        is_end_of_generation_(s.tokens.back())))
    finish(id);
}

int32_t Scheduler::prefill_chunk(int32_t pending, int32_t& budget) const {
  const int32_t n = chunked_prefill_ ? std::min(pending, budget) : pending;
  budget = std::max(0, budget - n);
  return n;
}

bool Scheduler::cancel(RequestId id) {
  const auto it = sequences_.find(id);
  if (it == sequences_.end()) return false;
  if (kv_.has_sequence(id)) kv_.free_sequence(id);
  remove_running(id);
  waiting_.erase(std::remove(waiting_.begin(), waiting_.end(), id), waiting_.end());
  sequences_.erase(it);
  return true;
}

StepPlan Scheduler::schedule() {
  StepPlan plan;
  plan.step = next_step_++;
  planned_step_ = plan.step;
  preempted_this_step_ = 0;
  int32_t budget = token_budget_;
  schedule_decodes(plan, budget);
  if (chunked_prefill_ && prefill_limit_with_decodes_ > 0 && !plan.chunks.empty())
    budget = std::min(budget, prefill_limit_with_decodes_);
  schedule_prefills(plan, budget);
  admit_waiting(plan, budget);
  last_plan_copies_ = plan.copies;
  return plan;
}

void Scheduler::schedule_decodes(StepPlan& plan, int32_t& budget) {
  // Index loop: reserve_last_token() only removes sequences newer than running_[i], or
  // running_[i] itself when it is the newest.
  for (size_t i = 0; i < running_.size() && budget > 0; ++i) {
    const SequenceId seq = running_[i];
    SequenceState& s = state(seq);
    if (s.n_pending() != 1) continue;
    std::vector<int32_t> tree_parent;
    if (const int32_t k = reserve_with_draft(seq, budget, plan, tree_parent); k > 0) {
      plan.chunks.push_back({seq, s.n_computed, 1 + k, true, k, std::move(tree_parent)});
      budget -= 1 + k;
      continue;
    }
    s.draft.clear();
    s.draft_parent.clear();
    if (!reserve_last_token(seq, plan)) continue;
    plan.chunks.push_back(plain_chunk(seq, s.n_computed, 1, true));
    --budget;
  }
}

int32_t Scheduler::reserve_with_draft(SequenceId seq, int32_t budget, StepPlan& plan,
                                      std::vector<int32_t>& tree_parent) {
  SequenceState& s = state(seq);
  const int32_t n_reserved = kv_.table(seq).n_tokens();
  // Never verify more tokens than the request may still emit: a draft at depth d emits d tokens,
  // and the target adds one of its own.
  const int32_t depth_limit = s.max_tokens - s.n_generated - 1;
  int32_t k = std::min(static_cast<int32_t>(s.draft.size()), budget - 1);
  if (s.draft_parent.empty()) {
    k = std::min(k, depth_limit);
  } else {  // a tree: parents come first, so its first k nodes are a tree too
    std::vector<int32_t> depth(static_cast<size_t>(std::max(k, 0)));
    for (int32_t i = 0; i < k; ++i) {
      const int32_t p = s.draft_parent[static_cast<size_t>(i)];
      depth[static_cast<size_t>(i)] = p < 0 ? 1 : depth[static_cast<size_t>(p)] + 1;
      if (depth[static_cast<size_t>(i)] > depth_limit) k = i;
    }
  }
  if (k <= 0 || n_reserved != s.n_tokens() - 1 || !kv_.can_append(seq, 1 + k)) return 0;
  if (!s.draft_parent.empty()) {  // rows: 0 the last token, 1 + i the draft i
    tree_parent.assign(1, -1);
    for (int32_t i = 0; i < k; ++i)
      tree_parent.push_back(s.draft_parent[static_cast<size_t>(i)] + 1);
  }
  s.tokens.insert(s.tokens.end(), s.draft.begin(), s.draft.begin() + k);
  s.draft.clear();
  s.draft_parent.clear();
  s.n_draft_in_flight = k;
  // A tree's slots do not hold their tokens' KV in sequence order: nothing of it is offered to
  // the prefix cache until complete() has put the accepted path in place.
  const AppendResult appended =
      kv_.append(seq, std::span<const TokenId>(s.tokens).subspan(static_cast<size_t>(n_reserved)),
                 tree_parent.empty());
  if (appended.copy) plan.copies.push_back(*appended.copy);
  forget_written_from(seq, n_reserved / kv_.block_size());
  return k;
}

void Scheduler::set_draft(RequestId id, std::vector<TokenId> draft, std::vector<int32_t> parent) {
  const auto it = sequences_.find(id);
  if (it == sequences_.end() || it->second.status != SequenceStatus::kRunning) return;
  if (!parent.empty()) {
    bool tree = parent.size() == draft.size();
    for (size_t i = 0; tree && i < parent.size(); ++i)
      tree = parent[i] >= -1 && parent[i] < static_cast<int32_t>(i);
    if (!tree)
      throw Error("scheduler: the draft tree for request " + std::to_string(id) +
                  " needs one parent per draft, each −1 or an earlier draft");
  }
  it->second.draft = std::move(draft);
  it->second.draft_parent = std::move(parent);
}

bool Scheduler::reserve_last_token(SequenceId seq, StepPlan& plan) {
  const SequenceState& s = state(seq);
  const int32_t n_reserved = kv_.table(seq).n_tokens();
  if (n_reserved == s.n_tokens()) return true;  // last token of a prefill: reserved at admission
  while (!kv_.can_append(seq, 1)) {
    if (running_.back() != seq) {
      preempt(running_.back());
    } else if (running_.size() > 1) {
      preempt(seq);  // the newest yields to the older ones
      return false;
    } else if (kv_.n_sequences() > 1) {
      // Alone, short of blocks that others hold outside the batch for a while (a decode
      // worker's reserved arrivals): it sits this step out and keeps its blocks. Once they
      // run, the newest of them yields to it.
      return false;
    } else {
      const int32_t bs = kv_.block_size();
      fail(seq, "request " + std::to_string(seq) + ": " + std::to_string(s.n_tokens()) +
                    " tokens need " + std::to_string((s.n_tokens() + bs - 1) / bs) +
                    " KV blocks, but the pool has " + std::to_string(kv_.pool().n_blocks()) +
                    " blocks of " + std::to_string(bs) + " tokens");
      return false;
    }
  }
  const AppendResult appended = kv_.append(seq, s.tokens.back());
  if (appended.copy) plan.copies.push_back(*appended.copy);
  forget_written_from(seq, n_reserved / kv_.block_size());
  return true;
}

void Scheduler::schedule_prefills(StepPlan& plan, int32_t& budget) {
  for (const SequenceId seq : running_) {
    if (budget == 0) return;
    const SequenceState& s = state(seq);
    if (s.n_pending() <= 1 || s.n_draft_in_flight > 0) continue;  // decoding: planned above
    const int32_t n = prefill_chunk(s.n_pending(), budget);
    plan.chunks.push_back(plain_chunk(seq, s.n_computed, n, n == s.n_pending()));
  }
}

void Scheduler::admit_waiting(StepPlan& plan, int32_t& budget) {
  while (budget > 0 && !waiting_.empty() && static_cast<int32_t>(running_.size()) < max_running_) {
    const SequenceId seq = waiting_.front();
    SequenceState& s = state(seq);
    const int32_t n_ready = allocate(seq);
    if (n_ready < 0) {
      const int32_t bs = kv_.block_size();
      const bool could_fit = (s.n_tokens() + bs - 1) / bs <= kv_.pool().n_blocks();
      // First come, first served: wait for blocks to free up, from the running sequences or
      // from those held outside the batch (a prefill worker's holds, a decode worker's reserved
      // arrivals), which end soon.
      if (could_fit && (!running_.empty() || kv_.n_sequences() > 0)) return;
      fail(seq, "request " + std::to_string(seq) + ": " + std::to_string(s.n_tokens()) +
                    " tokens need " + std::to_string((s.n_tokens() + bs - 1) / bs) +
                    " KV blocks, but the pool has " + std::to_string(kv_.pool().n_blocks()) +
                    " blocks of " + std::to_string(bs) + " tokens");
      continue;
    }
    waiting_.pop_front();
    s.n_computed = n_ready;
    s.status = SequenceStatus::kRunning;
    running_.push_back(seq);
    const int32_t n = prefill_chunk(s.n_pending(), budget);
    plan.chunks.push_back(plain_chunk(seq, s.n_computed, n, n == s.n_pending()));
  }
}

int32_t Scheduler::allocate(SequenceId seq) {
  const SequenceState& s = state(seq);
  const std::optional<int32_t> cached = kv_.allocate_sequence(seq, s.tokens);
  if (!cached) return -1;
  const int32_t bs = kv_.block_size();
  const std::vector<BlockId>& blocks = kv_.table(seq).blocks();
  int32_t n_ready = 0;
  while (n_ready < *cached && written_blocks_.count(blocks[static_cast<size_t>(n_ready / bs)])) {
    n_ready += bs;
  }
  if (n_ready < *cached) {
    // Hit blocks another sequence has not written yet (it is mid-prefill, or was cancelled or
    // preempted before writing them): compute them again into blocks of our own. n_ready is
    // block-aligned, so no partial block is shared and no copy-on-write arises.
    kv_.truncate(seq, n_ready);
    const AppendResult appended =
        kv_.append(seq, std::span<const TokenId>(s.tokens).subspan(static_cast<size_t>(n_ready)));
    if (!appended.ok()) {
      kv_.free_sequence(seq);
      return -1;
    }
  }
  forget_written_from(seq, n_ready / bs);
  return n_ready;
}

bool Scheduler::accepted_drafts_are_valid(const ScheduledChunk& chunk, const SequenceState& s,
                                          const ChunkResult& result) {
  const auto n_tokens = static_cast<int32_t>(result.tokens.size());
  const int32_t n_accepted = n_tokens - 1;
  if (n_tokens < 1 || n_accepted > chunk.n_draft) return false;
  const bool tree = !chunk.tree_parent.empty();
  if (tree && static_cast<int32_t>(result.path.size()) != n_accepted) return false;
  if (!tree && !result.path.empty() && static_cast<int32_t>(result.path.size()) != n_accepted)
    return false;
  for (int32_t j = 0; j < n_accepted; ++j) {
    int32_t row = j + 1;  // a chain's drafts are accepted in order
    if (tree) {
      row = result.path[static_cast<size_t>(j)];
      if (row < 1 || row >= chunk.n_tokens) return false;
      const int32_t parent = j == 0 ? 0 : result.path[static_cast<size_t>(j - 1)];
      if (chunk.tree_parent[static_cast<size_t>(row)] != parent) return false;
    } else if (!result.path.empty() && result.path[static_cast<size_t>(j)] != row) {
      return false;
    }
    if (result.tokens[static_cast<size_t>(j)] !=
        s.tokens[static_cast<size_t>(chunk.first_token + row)])
      return false;
  }
  return true;
}

std::vector<EmittedToken> Scheduler::complete(const StepPlan& plan,
                                              std::span<const TokenId> sampled) {
  std::vector<ChunkResult> results(sampled.size());
  for (size_t i = 0; i < sampled.size(); ++i) results[i].tokens = {sampled[i]};
  return complete(plan, std::span<const ChunkResult>(results));
}

std::vector<EmittedToken> Scheduler::complete(const StepPlan& plan,
                                              std::span<const ChunkResult> results) {
  if (plan.step != planned_step_) {
    throw Error("scheduler: complete() got step " + std::to_string(plan.step) +
                ", but the step awaiting results is " + std::to_string(planned_step_));
  }
  if (static_cast<int32_t>(results.size()) != plan.n_logits()) {
    throw Error("scheduler: step " + std::to_string(plan.step) + " expects " +
                std::to_string(plan.n_logits()) + " sampled results, got " +
                std::to_string(results.size()));
  }
  planned_step_ = -1;
  StepLogEntry entry{plan.step, {}, preempted_this_step_};
  std::vector<EmittedToken> emitted;
  size_t next_result = 0;
  for (const ScheduledChunk& chunk : plan.chunks) {
    const ChunkResult* result = chunk.wants_logits ? &results[next_result++] : nullptr;
    const auto it = sequences_.find(chunk.seq);
    if (it == sequences_.end() || it->second.status != SequenceStatus::kRunning) continue;
    SequenceState& s = it->second;  // cancelled since schedule(): skipped above
    const int32_t before = s.n_computed;
    int32_t n_accepted = 0;
    const bool tree = !chunk.tree_parent.empty();
    if (result) {
      const auto n_tokens = static_cast<int32_t>(result->tokens.size());
      n_accepted = n_tokens - 1;
      if (!accepted_drafts_are_valid(chunk, s, *result))
        throw Error("scheduler: the result for request " + std::to_string(chunk.seq) +
                    " is not an accepted " + (tree ? "path" : "prefix") + " of its " +
                    std::to_string(chunk.n_draft) + " drafts plus one sampled token");
    }
    // Rows computed with a valid context: the chunk up to its last accepted draft.
    s.n_computed = chunk.first_token + chunk.n_tokens - (chunk.n_draft - n_accepted);
    if (tree) {  // the accepted path's tokens follow the last token (their KV was moved there)
      for (int32_t j = 0; j < n_accepted; ++j)
        s.tokens[static_cast<size_t>(chunk.first_token + 1 + j)] =
            result->tokens[static_cast<size_t>(j)];
    }
    if (chunk.n_draft > n_accepted) {  // roll the rejected drafts back
      kv_.truncate(chunk.seq, s.n_computed);
      s.tokens.resize(static_cast<size_t>(s.n_computed));
    }
    if (tree) {
      // The table's tokens and full-block hashes follow the accepted path; from the last token,
      // whose block the unregistered append may have filled.
      kv_.rewrite(chunk.seq, chunk.first_token,
                  std::span<const TokenId>(s.tokens).subspan(static_cast<size_t>(chunk.first_token),
                                                             static_cast<size_t>(1 + n_accepted)));
    }
    s.n_draft_in_flight = 0;
    mark_written(chunk.seq, before, s.n_computed);
    entry.advanced.push_back({chunk.seq, s.n_computed - before});
    if (!result) continue;
    auto emit = [&](TokenId token, bool drafted) {
      ++s.n_generated;
      emitted.push_back({s.id, token, drafted});
      const bool done = s.n_generated >= s.max_tokens ||
                        (s.stop_at_end_of_generation && is_end_of_generation(token));
      if (done) finish(chunk.seq);
      return done;
    };
    bool done = false;
    for (int32_t j = 0; j < n_accepted && !done; ++j)
      done = emit(result->tokens[static_cast<size_t>(j)], true);
    if (done) continue;
    s.tokens.push_back(result->tokens.back());  // its KV slot is reserved by the next schedule()
    emit(result->tokens.back(), false);
  }
  step_log_.push_back(std::move(entry));
  if (step_log_.size() > kStepLogCapacity) step_log_.pop_front();
  return emitted;
}

std::vector<SequenceState> Scheduler::take_finished() {
  std::vector<SequenceState> done;
  for (auto it = sequences_.begin(); it != sequences_.end();) {
    if (it->second.done()) {
      done.push_back(std::move(it->second));
      it = sequences_.erase(it);
    } else {
      ++it;
    }
  }
  std::sort(done.begin(), done.end(), [](const auto& a, const auto& b) { return a.id < b.id; });
  return done;
}

void Scheduler::preempt(SequenceId seq) {
  SequenceState& s = state(seq);
  kv_.free_sequence(seq);  // written full blocks stay in the prefix cache for the recompute
  s.tokens.resize(s.tokens.size() - static_cast<size_t>(s.n_draft_in_flight));  // unverified
  s.n_draft_in_flight = 0;
  s.draft.clear();
  remove_running(seq);
  s.n_computed = 0;
  s.status = SequenceStatus::kPreempted;
  ++s.n_preemptions;
  ++n_preemptions_;
  ++preempted_this_step_;
  waiting_.push_front(seq);
  logger("serving")->debug("preempted request {} ({} tokens)", seq, s.n_tokens());
}

void Scheduler::fail(SequenceId seq, std::string error) {
  SequenceState& s = state(seq);
  if (kv_.has_sequence(seq)) kv_.free_sequence(seq);
  remove_running(seq);
  waiting_.erase(std::remove(waiting_.begin(), waiting_.end(), seq), waiting_.end());
  s.status = SequenceStatus::kFailed;
  logger("serving")->warn("{}", error);
  s.error = std::move(error);
}

void Scheduler::finish(SequenceId seq) {
  kv_.free_sequence(seq);
  remove_running(seq);
  state(seq).status = SequenceStatus::kFinished;
}

void Scheduler::remove_running(SequenceId seq) {
  running_.erase(std::remove(running_.begin(), running_.end(), seq), running_.end());
}

void Scheduler::forget_written_from(SequenceId seq, int32_t first) {
  const std::vector<BlockId>& blocks = kv_.table(seq).blocks();
  for (size_t i = static_cast<size_t>(first); i < blocks.size(); ++i) {
    written_blocks_.erase(blocks[i]);
  }
}

void Scheduler::mark_written(SequenceId seq, int32_t n_computed_before, int32_t n_computed_after) {
  const int32_t bs = kv_.block_size();
  const std::vector<BlockId>& blocks = kv_.table(seq).blocks();
  for (int32_t i = n_computed_before / bs; i < n_computed_after / bs; ++i) {
    written_blocks_.insert(blocks[static_cast<size_t>(i)]);
  }
}

}  // namespace tokenfab
