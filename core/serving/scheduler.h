#pragma once
// Scheduler: the continuous-batching planner of one worker in colocated mode (prefill and decode
// share one worker and one KV pool). Pure bookkeeping: it decides which tokens of which sequences
// a step computes and keeps the KvManager's tables in step; it never touches tensors.
//
// Engine loop (one worker thread; the scheduler is not thread-safe):
//   StepPlan plan = scheduler.schedule();   // reserves KV slots, may preempt
//   run plan.copies, then the forward pass over plan.chunks;  // sample one token per wants_logits
//   scheduler.complete(plan, sampled);      // advance, append, finish, free
//
// Policy of schedule(), within token_budget tokens per step:
//   1. Decodes never stall: every running sequence with exactly one pending token (decoding, or
//      at the last token of a prefill) gets it, oldest first. Its KV slot is reserved here
//      (KvManager::append of the token sampled last step). When the pool has no block for it,
//      the newest running sequence is preempted — its blocks freed, itself put back at the front
//      of the waiting queue with its tokens so far, to be recomputed later (outputs unchanged:
//      the same tokens are recomputed; full blocks still in the prefix cache are reused) — and
//      the reservation is retried. If the sequence is the only one left running while blocks
//      are held outside the batch (received requests whose KV is still arriving, holds), it sits
//      the step out and keeps its blocks; otherwise the pool cannot hold it even alone: it fails
//      (status kFailed, error set) instead of looping.
//   2. The remaining budget goes to prefill chunks: running sequences mid-prefill first, oldest
//      first, then waiting sequences in queue order (preempted ones at the front), admitted while
//      fewer than max_running run and KvManager::allocate_sequence finds blocks for all their
//      tokens. A waiting sequence that does not fit blocks those behind it (first come, first
//      served) while anything else holds blocks; one that needs more blocks than the pool has, or
//      does not fit a pool holding nothing else, fails. Tokens found in the prefix
//      cache need no compute. A chunk is min(pending tokens, remaining budget).
//
// With a prefill limit (set_prefill_limit_with_decodes), a step that has decodes gives its prefill
// chunks at most that many tokens of the remaining budget, so the decodes' step stays short; a
// step without decodes still gives them the whole budget.
//
// Without chunked prefill (set_chunked_prefill(false), for comparison), a prefill chunk is always
// a sequence's whole pending prompt, however much of the budget it takes; a step that starts one
// runs it with the decodes, so those decodes wait for the whole prompt.
//
// Disaggregated decode side: receive() reserves blocks for a request whose prompt was prefilled
// on another device (tokens found written in this pool's prefix cache need not be sent);
// adopt() makes it a running decode once its KV has arrived.
//
// Prefix reuse and chunked prefill: KvManager registers full blocks in the prefix cache as soon
// as their tokens are known, before their KV is written. The scheduler therefore tracks which
// full blocks a completed step has written (written_blocks_); an admitted sequence starts
// computing at the first prefix-hit block not yet written — it rolls its table back to the
// written prefix and takes fresh blocks of its own for the rest — so it never attends over KV
// that another sequence, still prefilling, has not written.

#include <cstdint>
#include <deque>
#include <functional>
#include <optional>
#include <span>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "core/kvcache/kv_manager.h"
#include "core/runtime/token_logprobs.h"
#include "core/serving/request.h"

namespace tokenfab {

// Compute tokens [first_token, first_token + n_tokens) of sequence `seq`; their KV goes to the
// slots of kv.table(seq). wants_logits: the chunk ends at the sequence's last token, whose
// logits give the next token.
// n_draft > 0: a speculative verification chunk — the sequence's last accepted token followed by
// n_draft proposed tokens; the worker needs logits for every row and returns the accepted
// drafts plus one token sampled by the target (ChunkResult). A draft tree also has tree_parent
// (one per row of the chunk: −1 for row 0, the last accepted token; the parent row otherwise).
struct ScheduledChunk {
  SequenceId seq = 0;
  int32_t first_token = 0;
  int32_t n_tokens = 0;
  bool wants_logits = false;
  int32_t n_draft = 0;
  std::vector<int32_t> tree_parent;
};

// What a step produced for one chunk with wants_logits: the accepted drafts followed by exactly
// one token sampled from the target. `path`: the chunk rows of the accepted drafts, in order — a
// prefix 1, 2, … for a chain, a root-to-node path for a tree (whose rows' KV the worker has
// copied onto the positions right after the last token before complete()). May be left empty
// for a chain.
struct ChunkResult {
  std::vector<TokenId> tokens;
  std::vector<int32_t> path;
  std::vector<TokenLogprob> logprobs;  // per token, when its request asked (else empty)
};

struct StepPlan {
  int64_t step = 0;
  std::vector<ScheduledChunk> chunks;  // decodes first (oldest first), then prefill chunks
  // Copy-on-write block copies the worker carries out before running the chunks.
  std::vector<BlockCopy> copies;

  bool empty() const { return chunks.empty(); }
  int32_t n_tokens() const;
  int32_t n_logits() const;  // chunks with wants_logits: the number of tokens complete() expects
};

struct EmittedToken {
  RequestId id = 0;
  TokenId token = 0;
  bool drafted = false;  // a draft head proposed it and the target accepted it
  bool operator==(const EmittedToken&) const = default;
};

// One completed step: which sequences advanced and by how many computed tokens.
struct StepLogEntry {
  struct Advance {
    SequenceId seq = 0;
    int32_t n_tokens = 0;
  };
  int64_t step = 0;
  std::vector<Advance> advanced;
  int32_t n_preempted = 0;  // sequences preempted while planning this step
};

class Scheduler {
 public:
  // Sampled tokens for which the predicate is true end their sequence (end of generation).
  using EndOfGeneration = std::function<bool(TokenId)>;
  static constexpr size_t kStepLogCapacity = 4096;  // most recent steps kept

  // token_budget ≥ max_running ≥ 1, so every running decode fits each step; throws Error if not.
  explicit Scheduler(KvManager& kv, int32_t token_budget = 512, int32_t max_running = 64,
                     EndOfGeneration is_end_of_generation = {});

  // Queues a request. Throws Error on an empty prompt, max_tokens < 1 or an id in use.
  void add(Request request);
  // Removes the request in any state, freeing its blocks; false when the id is unknown.
  // Between schedule() and complete() it is safe too: complete() skips cancelled sequences.
  bool cancel(RequestId id);

  // Reserves KV blocks for `request` (status kReceiving): returns how many leading prompt tokens
  // are already written in this pool (block-aligned; their blocks need not be sent), or nullopt —
  // nothing changed — when the pool is short of blocks. Throws Error like add().
  std::optional<int32_t> receive(Request request);
  // The prompt's KV of a kReceiving request has arrived: it runs from now on, with `generated`
  // (≥ 1 token, sampled by the prefill device) appended. Throws Error if `id` is not receiving.
  void adopt(RequestId id, std::span<const TokenId> generated);

  // The end-of-generation predicate given at construction (false when none was).
  bool is_end_of_generation(TokenId token) const {
    return is_end_of_generation_ && is_end_of_generation_(token);
  }

  void set_chunked_prefill(bool on) { chunked_prefill_ = on; }
  bool chunked_prefill() const { return chunked_prefill_; }
  // Chunked prefill: a step that decodes reads at most `tokens` prompt tokens (> 0; the worker's
  // ChunkSizer sets it before each step); 0: only the token budget limits them. A step with no
  // decodes is never limited by it.
  void set_prefill_limit_with_decodes(int32_t tokens) { prefill_limit_with_decodes_ = tokens; }
  int32_t prefill_limit_with_decodes() const { return prefill_limit_with_decodes_; }

  // Plans the next step (policy above). Mutates: admissions, KV reservations, preemptions.
  StepPlan schedule();
  // Applies the step's results: `sampled` holds one token per chunk with wants_logits, in plan
  // order. Returns the tokens emitted, in plan order. Throws Error if `plan` is not the last one
  // scheduled or `sampled` has the wrong size.
  std::vector<EmittedToken> complete(const StepPlan& plan, std::span<const TokenId> sampled);
  // The same with one ChunkResult per chunk with wants_logits (speculative steps): rejected
  // drafts are rolled back — their tokens and KV slots dropped — and the accepted ones emitted
  // before the target's token. Throws Error if a result is not a prefix (chain) or a root path
  // (tree) of its drafts plus one.
  std::vector<EmittedToken> complete(const StepPlan& plan, std::span<const ChunkResult> results);

  // Speculative decoding: tokens proposed to follow `id`'s last token, verified in the next step
  // when the budget and the pool allow (else that step decodes one token as usual). Replaces an
  // earlier proposal; ignored for a sequence that is not decoding.
  // A tree: parent[i] is the draft that draft[i] follows (−1: the last token; parent[i] < i).
  void set_draft(RequestId id, std::vector<TokenId> draft, std::vector<int32_t> parent = {});

  bool has_unfinished() const { return !running_.empty() || !waiting_.empty(); }
  const SequenceState& sequence(RequestId id) const;  // throws Error if unknown
  bool contains(RequestId id) const { return sequences_.count(id) != 0; }
  // Finished and failed sequences, removed from the scheduler (oldest id first).
  std::vector<SequenceState> take_finished();

  const std::vector<SequenceId>& running() const { return running_; }  // oldest admitted first
  const std::deque<SequenceId>& waiting() const { return waiting_; }   // next to admit first
  const std::vector<BlockCopy>& pending_copies() const { return last_plan_copies_; }
  const std::deque<StepLogEntry>& step_log() const { return step_log_; }
  int64_t n_preemptions() const { return n_preemptions_; }
  int32_t token_budget() const { return token_budget_; }
  int32_t max_running() const { return max_running_; }

 private:
  SequenceState& state(SequenceId seq);
  void schedule_decodes(StepPlan& plan, int32_t& budget);
  // Reserves the KV slot of `seq`'s last token, preempting newer sequences; false if `seq`
  // itself was preempted or failed.
  bool reserve_last_token(SequenceId seq, StepPlan& plan);
  // Appends up to `budget` - 1 of `seq`'s drafts after its last token and reserves KV slots for
  // all of them; the number of drafts appended (0: nothing changed).
  // A tree also fills tree_parent (the chunk's rows).
  int32_t reserve_with_draft(SequenceId seq, int32_t budget, StepPlan& plan,
                             std::vector<int32_t>& tree_parent);
  static bool accepted_drafts_are_valid(const ScheduledChunk& chunk, const SequenceState& s,
                                        const ChunkResult& result);
  void schedule_prefills(StepPlan& plan, int32_t& budget);
  void admit_waiting(StepPlan& plan, int32_t& budget);
  // Allocates `seq`'s table for all its tokens; the count of leading tokens already in the pool
  // and written, or -1 when the pool is short of blocks (nothing allocated then).
  int32_t allocate(SequenceId seq);
  // Tokens of a prefill chunk for a sequence with `pending` tokens left, out of `budget` (> 0).
  int32_t prefill_chunk(int32_t pending, int32_t& budget) const;
  SequenceState make_state(Request request) const;  // validates as add() documents
  void preempt(SequenceId seq);
  void fail(SequenceId seq, std::string error);
  void finish(SequenceId seq);
  void remove_running(SequenceId seq);
  // Blocks of `seq` from block index `first` on are fresh: no written KV.
  void forget_written_from(SequenceId seq, int32_t first);
  void mark_written(SequenceId seq, int32_t n_computed_before, int32_t n_computed_after);

  KvManager& kv_;
  int32_t token_budget_;
  int32_t max_running_;
  EndOfGeneration is_end_of_generation_;
  bool chunked_prefill_ = true;
  int32_t prefill_limit_with_decodes_ = 0;

  std::unordered_map<RequestId, SequenceState> sequences_;
  std::deque<SequenceId> waiting_;   // front = next to admit
  std::vector<SequenceId> running_;  // admission order, oldest first; back = newest
  // Full blocks whose KV a completed step has written. Entries are dropped whenever the
  // scheduler hands a block out fresh (allocate, append), so membership means "written and not
  // reused since"; stale entries for evicted, unused blocks are harmless.
  std::unordered_set<BlockId> written_blocks_;

  int64_t next_step_ = 0;
  int64_t planned_step_ = -1;  // step of the plan awaiting complete(), or -1
  int32_t preempted_this_step_ = 0;
  int64_t n_preemptions_ = 0;
  std::vector<BlockCopy> last_plan_copies_;
  std::deque<StepLogEntry> step_log_;
};

}  // namespace tokenfab
