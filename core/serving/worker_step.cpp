// Worker::step, one scheduler step of a device as a sentence:
//   plan (the scheduler's) → lay out the batch → run it on the device → verify and accept each
//   request's tokens → publish them → propose the next drafts → end or hand off the finished
//   requests → record what the step cost.
// Each stage is a function of its own below; the speculative parts they call are in
// worker_drafts.cpp and core/speculative (verifier.h).

#include <algorithm>
#include <unordered_map>
#include <unordered_set>

#include "core/common/error.h"
#include "core/serving/engine_record.h"
#include "core/serving/worker.h"
#include "core/speculative/verifier.h"

namespace tokenfab {

bool Worker::step() {
  if (!scheduler_.has_unfinished()) {
    handle_finished();  // failures found while admitting
    return false;
  }
  StepRun run;
  run.start = MetricsClock::now();
  if (chunk_sizer_) scheduler_.set_prefill_limit_with_decodes(chunk_sizer_->limit());
  run.plan = scheduler_.schedule();
  if (run.plan.empty()) {
    handle_finished();
    return false;
  }
  lay_out_batch(run);
  run_batch(run);
  verify_and_accept(run);
  publish_tokens(run);
  const MetricsTime propose_start = MetricsClock::now();
  propose_drafts(run.plan, run.results);
  run.propose_s = seconds_between(propose_start, MetricsClock::now());
  end_or_hand_off(run);
  record_step(run);
  return true;
}

void Worker::lay_out_batch(StepRun& run) {
  const StepPlan& plan = run.plan;
  KvPool& storage = device_->kv_storage();
  for (const BlockCopy& copy : plan.copies) storage.copy_block(copy.src_slot, copy.dst_slot);
  batch_.clear();
  tables_.resize(plan.chunks.size());
  const MetricsTime planned = MetricsClock::now();
  for (size_t i = 0; i < plan.chunks.size(); ++i) {
    const ScheduledChunk& chunk = plan.chunks[i];
    kv_.storage_slots(chunk.seq, tables_[i]);
    const SequenceState& s = scheduler_.sequence(chunk.seq);
    BatchSequence& row = batch_.emplace_back();
    row.tokens = std::span<const int32_t>(s.tokens).subspan(static_cast<size_t>(chunk.first_token),
                                                            static_cast<size_t>(chunk.n_tokens));
    row.pos0 = chunk.first_token;
    row.blocks = tables_[i];
    row.want_logits = chunk.wants_logits;
    row.all_logits = chunk.n_draft > 0;  // verification: every row's logits
    row.tree_parent = chunk.tree_parent;
    Engine::Record& record = *requests_.at(chunk.seq);
    if (record.state() == RequestState::kQueued) {
      record.enter(RequestState::kPrefilling, planned);
      std::lock_guard lock(record.mutex);
      record.info.prefill_device = name_;
      record.info.cached_prompt_tokens = chunk.first_token;  // the prefix cache supplied these
    }
    if (chunk.first_token < s.n_prompt) {
      const int64_t n =
          std::min(chunk.first_token + chunk.n_tokens, s.n_prompt) - chunk.first_token;
      run.prompt_tokens += static_cast<int32_t>(n);
      const int64_t counted = std::min(n, record.prefill_tokens_left);
      record.prefill_tokens_left -= counted;
      queued_prefill_tokens_ -= counted;
    }
  }
}

void Worker::run_batch(StepRun& run) {
  const StepPlan& plan = run.plan;
  // Hidden states are needed where a draft head will propose from this step's rows.
  const bool need_hidden = std::any_of(plan.chunks.begin(), plan.chunks.end(), [&](const auto& c) {
    return c.wants_logits && requests_.at(c.seq)->draft.head != nullptr;
  });
  // A device that takes the argmax itself (a GPU) sends back one id per row instead of the
  // row's logits when every sampled request of the step is greedy.
  greedy_step_ =
      device_->greedy_on_device() &&
      std::all_of(plan.chunks.begin(), plan.chunks.end(), [&](const auto& c) {
        return !c.wants_logits || requests_.at(c.seq)->sampler.params().temperature == 0.0f;
      });
  // Log-probabilities are read from whole logits rows on the host.
  const bool wants_logprobs = std::any_of(
      plan.chunks.begin(), plan.chunks.end(),
      [&](const auto& c) { return c.wants_logits && requests_.at(c.seq)->request.logprobs >= 0; });
  if (wants_logprobs) greedy_step_ = false;
  const std::shared_ptr<std::atomic<int32_t>> layers_ready = hand_off_streamed(plan);
  // Otherwise such a device reduces each logit row to the tokens its request's filters can keep.
  filtered_step_ = !greedy_step_ && !wants_logprobs && device_->filters_on_device();
  if (filtered_step_) {
    filters_.clear();
    for (const ScheduledChunk& chunk : plan.chunks) {
      // The chunk's logit rows, as BatchRows lists them: every row of a verification chunk,
      // else the last one when it wants logits.
      const int32_t rows = chunk.n_draft > 0 ? chunk.n_tokens : chunk.wants_logits ? 1 : 0;
      if (rows == 0) continue;
      const kernels::CandidateFilter f =
          candidate_filter(requests_.at(chunk.seq)->sampler.params());
      filters_.insert(filters_.end(), static_cast<size_t>(rows), f);
    }
  }
  const MetricsTime run_start = MetricsClock::now();
  if (std::string fault = engine_.step_fault(name_, plan.step); !fault.empty()) throw Error(fault);
  if (greedy_step_)
    device_->run_greedy(batch_, argmax_, need_hidden ? &hidden_ : nullptr);
  else if (filtered_step_)
    device_->run_filtered(batch_, filters_, filtered_, need_hidden ? &hidden_ : nullptr);
  else
    device_->run(batch_, logits_, need_hidden ? &hidden_ : nullptr);
  run.compute_s = seconds_between(run_start, MetricsClock::now());
  if (layers_ready) {
    device_->set_layer_progress(nullptr);
    layers_ready->store(static_cast<int32_t>(device_->model().hparams().n_layer),
                        std::memory_order_release);
  }
}

std::shared_ptr<std::atomic<int32_t>> Worker::hand_off_streamed(const StepPlan& plan) {
  // Prefill role: a prompt whose last chunk this step computes keeps its blocks for the transfer
  // under a hold (released by the decode worker), and is handed to its decode worker now —
  // streamed — so that its KV transfer copies each layer as soon as this pass has written it.
  std::shared_ptr<std::atomic<int32_t>> layers_ready;
  if (!prefill_role()) return layers_ready;
  for (const ScheduledChunk& chunk : plan.chunks) {
    if (!chunk.wants_logits) continue;
    const std::shared_ptr<Engine::Record>& record = requests_.at(chunk.seq);
    kv_.fork(chunk.seq, hold_id(chunk.seq));
    kv_.storage_slots(hold_id(chunk.seq), record->source_blocks);
    if (!streamed_transfer_ || record->request.max_tokens <= 1 || record->cancelled.load())
      continue;  // handed over after the step, if there is anything to decode
    if (!layers_ready) layers_ready = std::make_shared<std::atomic<int32_t>>(0);
    record->layers_ready = layers_ready;
    record->streamed = true;
    engine_.hand_off(record, *this, true);
  }
  device_->set_layer_progress(layers_ready.get());
  return layers_ready;
}

void Worker::verify_and_accept(StepRun& run) {
  run.results = sample(run.plan);
  move_accepted_tree_rows(run.plan, run.results);
  run.emitted = scheduler_.complete(run.plan, run.results);
  ++steps_;
  run.end = MetricsClock::now();
}

void Worker::publish_tokens(StepRun& run) {
  const StepPlan& plan = run.plan;
  const MetricsTime t = run.end;
  // Tokens per request, in order (a verification step emits several).
  std::unordered_map<RequestId, const ChunkResult*> result_of;  // requests with log-probabilities
  for (size_t i = 0, next = 0; i < plan.chunks.size(); ++i) {
    if (!plan.chunks[i].wants_logits) continue;
    const ChunkResult& r = run.results[next++];
    if (!r.logprobs.empty()) result_of[plan.chunks[i].seq] = &r;
  }
  for (const EmittedToken& e : run.emitted) {
    TokenEvent& ev = run.events[e.id];
    if (const auto it = result_of.find(e.id); it != result_of.end())
      ev.logprobs.push_back(it->second->logprobs[ev.tokens.size()]);  // emitted: a prefix
    ev.tokens.push_back(e.token);
    ev.drafted.push_back(e.drafted);
  }
  // A verifying step's timing goes with its request's tokens.
  const double verify_s = seconds_between(run.start, t);
  for (const ScheduledChunk& chunk : plan.chunks) {
    if (chunk.n_draft == 0) continue;
    const auto ev = run.events.find(chunk.seq);
    if (ev == run.events.end()) continue;
    Engine::Record& record = *requests_.at(chunk.seq);
    ev->second.verify_s = verify_s;
    ev->second.draft_s = record.draft.proposal_s;
    std::lock_guard lock(record.mutex);
    record.info.speculation.verify_s += verify_s;
  }
  for (auto& [id, ev] : run.events) {
    Engine::Record& record = *requests_.at(id);
    record.generated.insert(record.generated.end(), ev.tokens.begin(), ev.tokens.end());
    record.timeline.on_emission(t, static_cast<int32_t>(ev.tokens.size()));
    engine_.metrics().on_emission(t, static_cast<int32_t>(ev.tokens.size()));
    std::lock_guard lock(record.mutex);
    record.info.output.insert(record.info.output.end(), ev.tokens.begin(), ev.tokens.end());
    if (record.info.state == RequestState::kPrefilling && !prefill_role()) {
      record.info.state = RequestState::kDecoding;
      record.info.entered[static_cast<size_t>(RequestState::kDecoding)] = t;
    }
    if (!prefill_role() && record.info.decode_device.empty()) record.info.decode_device = name_;
  }
  // Events for tokens of requests that go on; the ended ones get theirs from end().
  run.finished = scheduler_.take_finished();
  std::unordered_set<RequestId> ending;
  for (const SequenceState& s : run.finished) ending.insert(s.id);
  for (auto& [id, ev] : run.events) {
    if (ending.count(id)) continue;
    ev.id = id;
    ev.time = t;
    ev.step = plan.step;
    ev.device = name_;
    const Engine::Record& record = *requests_.at(id);
    ev.state = record.state();
    engine_.publish(record, ev);
  }
}

void Worker::end_or_hand_off(StepRun& run) {
  const int64_t step_id = run.plan.step;
  const MetricsTime t = run.end;
  for (SequenceState& s : run.finished) {
    auto it = requests_.find(s.id);
    if (it == requests_.end()) continue;
    const std::shared_ptr<Engine::Record> record = it->second;
    requests_.erase(it);
    {
      std::lock_guard lock(record->mutex);
      record->info.preemptions += s.n_preemptions;
    }
    TokenEvent last;
    if (const auto ev = run.events.find(s.id); ev != run.events.end()) last = ev->second;
    // Ends the request here. A streamed one's decode worker gives back its side (and the hold,
    // which it releases after stopping the transfer) once it sees the request ended.
    const bool streamed = prefill_role() && record->streamed;
    auto end_here = [&](RequestState state, std::string error) {
      if (streamed) {
        std::lock_guard lock(record->mutex);
        record->info.decode_device.clear();  // handed over, but never decoded there
      } else {
        release_hold(hold_id(s.id));
      }
      end(record, state, std::move(error), last, step_id, t);
      if (streamed) record->decode_worker->wake();
    };
    if (s.status == SequenceStatus::kFailed) {
      end_here(RequestState::kFailed, s.error);
      continue;
    }
    const GenerationRequest& r = record->request;
    const bool more = prefill_role() && r.max_tokens > 1 &&
                      !(r.stop_at_end_of_generation && !last.tokens.empty() &&
                        scheduler_.is_end_of_generation(last.tokens.back()));
    if (!more) {
      end_here(RequestState::kFinished, "");
      continue;
    }
    if (record->cancelled.load()) {
      end_here(RequestState::kCancelled, "");
      continue;
    }
    queued_prefill_tokens_ -= record->prefill_tokens_left;
    record->prefill_tokens_left = 0;
    record->enter(RequestState::kTransferring, t);
    last.id = s.id;
    last.time = t;
    last.step = step_id;
    last.device = name_;
    last.state = RequestState::kTransferring;
    engine_.publish(*record, last);
    if (streamed)
      record->decode_worker->post_first_token(record);  // the decode worker owns it from here
    else
      engine_.hand_off(record, *this, false);
  }
}

void Worker::record_step(const StepRun& run) {
  const StepPlan& plan = run.plan;
  const int64_t preemptions = scheduler_.n_preemptions();
  for (; seen_preemptions_ < preemptions; ++seen_preemptions_) engine_.metrics().on_preemption();
  const PrefixCacheStats& ps = kv_.prefix_cache().stats();
  const int64_t lookups =
      (ps.hit_tokens + ps.miss_tokens) - (seen_prefix_.hit_tokens + seen_prefix_.miss_tokens);
  if (lookups > 0)
    engine_.metrics().on_prefix_lookup(lookups, ps.hit_tokens - seen_prefix_.hit_tokens);
  seen_prefix_ = ps;
  const MetricsTime step_end = MetricsClock::now();
  const double busy_s = seconds_between(run.start, step_end);
  busy_s_ += busy_s;
  compute_s_ += run.compute_s;
  StepSample sample;
  sample.end = step_end;
  sample.rows = plan.n_tokens();
  sample.sequences = static_cast<int32_t>(plan.chunks.size());
  sample.seconds = busy_s;
  sample.compute_s = run.compute_s;
  for (const ScheduledChunk& c : plan.chunks) {
    sample.logit_rows += c.wants_logits ? 1 + c.n_draft : 0;
    // Row t of the chunk attends positions [0, first_token + t].
    sample.attended_positions +=
        int64_t{c.n_tokens} * c.first_token + int64_t{c.n_tokens} * (c.n_tokens + 1) / 2;
    sample.kv_positions += c.first_token + c.n_tokens;
  }
  if (chunk_sizer_)
    chunk_sizer_->observe(static_cast<int32_t>(plan.n_tokens()) - run.prompt_tokens,
                          run.prompt_tokens, busy_s);
  recent_steps_.push_back(sample);
  if (recent_steps_.size() > DeviceSnapshot::kRecentSteps) recent_steps_.pop_front();
  // What a step of this many rows costs, for choosing draft lengths: decode and verification
  // rows only (a prefill chunk in the step would make it look dearer than drafting is).
  if (!plan.chunks.empty() &&
      std::all_of(plan.chunks.begin(), plan.chunks.end(), [](const ScheduledChunk& c) {
        return c.wants_logits && c.n_tokens == 1 + c.n_draft;
      }))
    proposer_.step_costs().record(static_cast<int32_t>(plan.n_tokens()), busy_s - run.propose_s);
  if (std::all_of(plan.chunks.begin(), plan.chunks.end(),
                  [](const ScheduledChunk& c) { return c.n_tokens == 1; })) {
    ++decode_steps_;
    decode_rows_ += static_cast<int64_t>(plan.chunks.size());
    decode_busy_s_ += busy_s;
    decode_compute_s_ += run.compute_s;
  }
}

namespace {

// The target's judgement of one request's logits rows (verifier.h's Judge): from the device's
// argmax on a greedy step, else the request's own sampler over the row (or its candidates).
template <typename Rows>
struct RowJudge {
  Sampler& sampler;
  const Rows& logits;     // logits(row) → LogitRow
  const int32_t* argmax;  // greedy step: this request's rows' argmax; else null
  bool accept(int64_t r, TokenId draft) {
    return argmax ? argmax[r] == draft : sampler.accept_draft(logits(r), draft);
  }
  TokenId rejected(int64_t r, TokenId draft) {
    return argmax ? argmax[r] : sampler.sample_rejected(logits(r), draft);
  }
  TokenId choose(int64_t r) { return argmax ? argmax[r] : sampler.sample(logits(r)); }
};

}  // namespace

std::vector<ChunkResult> Worker::sample(const StepPlan& plan) {
  const int64_t n_vocab = n_vocab_;
  // Logit rows of each chunk with logits: 1, or 1 + n_draft for a verification chunk.
  struct Job {
    Engine::Record* record;
    const ScheduledChunk* chunk;
    const SequenceState* state;
    int64_t row;
  };
  std::vector<Job> jobs;
  int64_t row = 0;
  for (const ScheduledChunk& chunk : plan.chunks) {
    if (!chunk.wants_logits) continue;
    jobs.push_back({requests_.at(chunk.seq).get(), &chunk, &scheduler_.sequence(chunk.seq), row});
    row += 1 + chunk.n_draft;
  }
  std::vector<ChunkResult> results(jobs.size());
  auto sample_job = [&](int64_t i) {
    const Job& job = jobs[static_cast<size_t>(i)];
    const auto logits = [&](int64_t r) -> LogitRow {
      if (filtered_step_) return filtered_.row(job.row + r);
      return std::span<const float>(logits_.data() + (job.row + r) * n_vocab,
                                    static_cast<size_t>(n_vocab));
    };
    // Greedy steps on a device that took the argmax: the sampler's greedy choice is that argmax
    // (kernels::argmax), and greedy sampling draws no random numbers, so nothing else changes.
    RowJudge<decltype(logits)> judge{job.record->sampler, logits,
                                     greedy_step_ ? argmax_.data() + job.row : nullptr};
    const ScheduledChunk& chunk = *job.chunk;
    const auto rows =
        std::span<const TokenId>(job.state->tokens)
            .subspan(static_cast<size_t>(chunk.first_token), static_cast<size_t>(chunk.n_tokens));
    Verdict v = chunk.tree_parent.empty()
                    ? verify_chain(rows.subspan(1, static_cast<size_t>(chunk.n_draft)), judge)
                    : verify_tree(chunk.tree_parent, rows, judge);
    ChunkResult& result = results[static_cast<size_t>(i)];
    result.tokens = std::move(v.tokens);
    result.path = std::move(v.path);
  };
  // One sampler per request, so the chunks are sampled in parallel. A greedy step on a device
  // that took the argmax only looks its rows' choices up: waking the device's threads for that
  // would cost more than the lookups.
  if (greedy_step_) {
    for (int64_t i = 0; i < static_cast<int64_t>(jobs.size()); ++i) sample_job(i);
  } else {
    device_->parallel_for(static_cast<int64_t>(jobs.size()), sample_job);
  }
  // Log-probabilities of the emitted tokens, each from the row that chose it.
  for (size_t i = 0; i < jobs.size(); ++i) {
    const Job& job = jobs[i];
    const int32_t top_n = job.record->request.logprobs;
    if (top_n < 0) continue;
    ChunkResult& result = results[i];
    for (size_t k = 0; k < result.tokens.size(); ++k) {
      const int64_t r = logits_row(k, result.path);
      const std::span<const float> logits(logits_.data() + (job.row + r) * n_vocab,
                                          static_cast<size_t>(n_vocab));
      result.logprobs.push_back(token_logprob(logits, result.tokens[k], top_n));
    }
  }
  for (size_t i = 0; i < jobs.size(); ++i) {
    const ScheduledChunk& chunk = *jobs[i].chunk;
    if (chunk.n_draft > 0) record_verification(*jobs[i].record, chunk, results[i]);
  }
  for (size_t i = 0; i < jobs.size(); ++i)
    if (jobs[i].chunk->n_draft > 0)
      consider_head_switch(*jobs[i].record, static_cast<int32_t>(results[i].tokens.size()));
  return results;
}

void Worker::record_verification(Engine::Record& record, const ScheduledChunk& chunk,
                                 const ChunkResult& result) {
  const auto accepted = static_cast<int32_t>(result.path.size());
  record.draft.on_verified_path(result.path);
  // Per-depth acceptance: proposed at depth d when the drafts reached it, accepted when the
  // accepted path did.
  std::lock_guard lock(record.mutex);
  SpeculationStats& st = record.info.speculation;
  count_acceptance(draft_depth(chunk.n_draft, chunk.tree_parent), accepted, st.proposed_at,
                   st.accepted_at);
  ++st.verify_steps;
}

void Worker::move_accepted_tree_rows(const StepPlan& plan,
                                     const std::vector<ChunkResult>& results) {
  KvPool& storage = device_->kv_storage();
  size_t result = 0;
  for (size_t i = 0; i < plan.chunks.size(); ++i) {
    const ScheduledChunk& chunk = plan.chunks[i];
    if (!chunk.wants_logits) continue;
    const ChunkResult& r = results[result++];
    if (chunk.tree_parent.empty()) continue;
    // Path rows only grow (a child comes after its parent), so row path[j] ≥ j + 1 and no move
    // overwrites a row a later move reads.
    for (size_t j = 0; j < r.path.size(); ++j) {
      const int64_t from = chunk.first_token + r.path[j];
      const int64_t to = chunk.first_token + 1 + static_cast<int64_t>(j);
      if (from != to) storage.copy_position(tables_[i], from, to);
    }
  }
}

}  // namespace tokenfab
