#include "core/serving/worker.h"

#include <algorithm>
#include <chrono>

#include "core/common/error.h"
#include "core/common/log.h"
#include "core/serving/engine_record.h"
#include "core/speculative/context_lookup.h"
#include "kernels/cpu/ops.h"

namespace tokenfab {

namespace {

constexpr auto kPublishEvery = std::chrono::milliseconds(20);
// While transfers are in flight the loop polls the connector this often when it has no step to
// run (a decode step in progress polls once per step).
constexpr auto kTransferPoll = std::chrono::microseconds(200);

SequenceId hold_id(RequestId id) {
  return -id;
}

}  // namespace

const char* worker_role_name(WorkerRole role) {
  switch (role) {
    case WorkerRole::kColocated:
      return "colocated";
    case WorkerRole::kPrefill:
      return "prefill";
    case WorkerRole::kLongPrefill:
      return "long-prefill";
    case WorkerRole::kDecode:
      return "decode";
  }
  return "unknown";
}

Worker::Worker(Engine& engine, std::unique_ptr<Device> device, WorkerRole role,
               const EngineConfig& config, KvConnector& connector,
               Scheduler::EndOfGeneration is_end_of_generation, int32_t kv_blocks,
               std::shared_ptr<KvSlots> shared_slots)
    : engine_(engine),
      device_(std::move(device)),
      streamed_transfer_(config.streamed_transfer),
      role_(role),
      name_(device_->name()),
      n_embd_(device_->model().hparams().n_embd),
      n_vocab_(device_->model().hparams().n_vocab),
      connector_(connector),
      kv_(kv_blocks, device_->kv_storage().block_size(), std::move(shared_slots)),
      scheduler_(kv_, config.token_budget, config.max_running, std::move(is_end_of_generation)) {
  scheduler_.set_chunked_prefill(config.chunked_prefill);
  // Draft heads that read the target's layer taps need them where their hidden rows come from.
  draft_taps_ = device_->set_draft_taps(true);
  hidden_width_ = device_->hidden_width();
  if (role_ == WorkerRole::kColocated && config.chunked_prefill && config.step_target_ms > 0.0)
    chunk_sizer_.emplace(config.step_target_ms / 1000.0, config.token_budget);
  free_blocks_ = kv_.n_available_blocks();
  publish(true);
}

Worker::~Worker() {
  stop();
}

void Worker::start() {
  thread_ = std::thread([this] { loop(); });
}

void Worker::stop() {
  {
    std::lock_guard lock(inbox_mutex_);
    stopping_ = true;
  }
  inbox_cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void Worker::post_request(std::shared_ptr<Engine::Record> record) {
  record->prefill_tokens_left = static_cast<int64_t>(record->request.prompt.size());
  queued_prefill_tokens_ += record->prefill_tokens_left;
  {
    std::lock_guard lock(inbox_mutex_);
    new_requests_.push_back(std::move(record));
  }
  inbox_cv_.notify_all();
}

void Worker::post_incoming(std::shared_ptr<Engine::Record> record, bool streamed) {
  {
    std::lock_guard lock(inbox_mutex_);
    new_incoming_.push_back(std::move(record));
    new_incoming_streamed_.push_back(streamed);
  }
  inbox_cv_.notify_all();
}

void Worker::post_first_token(std::shared_ptr<Engine::Record> record) {
  {
    std::lock_guard lock(inbox_mutex_);
    first_tokens_.push_back(std::move(record));
  }
  inbox_cv_.notify_all();
}

void Worker::post_release(SequenceId hold) {
  {
    std::lock_guard lock(inbox_mutex_);
    releases_.push_back(hold);
  }
  inbox_cv_.notify_all();
}

void Worker::wake() {
  {
    std::lock_guard lock(inbox_mutex_);
    woken_ = true;
  }
  inbox_cv_.notify_all();
}

int32_t Worker::cached_prefix_tokens(std::span<const TokenId> prompt) const {
  const int32_t bs = device_->kv_storage().block_size();
  const int32_t n_full = static_cast<int32_t>(prompt.size()) / bs;
  std::lock_guard lock(published_mutex_);
  uint64_t hash = PrefixCache::kRootHash;
  int32_t n = 0;
  while (n < n_full) {
    hash = PrefixCache::hash_block(hash, prompt.subspan(static_cast<size_t>(n) * bs, bs));
    if (!published_hashes_.count(hash)) break;
    ++n;
  }
  return n * bs;
}

DeviceSnapshot Worker::snapshot() const {
  std::lock_guard lock(published_mutex_);
  return published_;
}

void Worker::loop() {
  for (;;) {
    drain_inbox();
    {
      std::lock_guard lock(inbox_mutex_);
      if (stopping_) break;
    }
    handle_cancellations();
    bool ran = false;
    try {
      handle_incoming();
      ran = step();
    } catch (const std::exception& e) {
      fail_all(e.what());
    }
    free_blocks_ = kv_.n_available_blocks();
    publish(!ran);
    if (ran) continue;
    std::unique_lock lock(inbox_mutex_);
    auto has_work = [&] {
      return stopping_ || woken_ || !new_requests_.empty() || !new_incoming_.empty() ||
             !first_tokens_.empty() || !releases_.empty();
    };
    // A streamed request not yet owned cannot be adopted before its first token is posted, which
    // wakes this worker: only owned transfers need polling.
    const bool transfers_in_flight =
        std::any_of(incoming_.begin(), incoming_.end(),
                    [](const Incoming& in) { return in.reserved && in.owned; });
    if (transfers_in_flight) {
      inbox_cv_.wait_for(lock, kTransferPoll, has_work);
    } else {
      inbox_cv_.wait(lock, has_work);
    }
    woken_ = false;
  }
  // Stopping: everything still here ends cancelled and gives its blocks back. (A streamed
  // request not yet owned is its prefill worker's to end; the engine stops those workers first.)
  const MetricsTime t = MetricsClock::now();
  for (Incoming& in : incoming_) {
    if (in.transfer >= 0) {
      connector_.cancel(in.transfer);
      connector_.wait(in.transfer);
      connector_.release(in.transfer);
    }
    if (scheduler_.contains(in.record->id)) scheduler_.cancel(in.record->id);
    if (in.owned && !request_ended(in.record->state()))
      end(in.record, in.error ? RequestState::kFailed : RequestState::kCancelled,
          in.error.value_or(""), {}, steps_, t);
  }
  incoming_.clear();
  for (auto& [id, record] : requests_) {
    scheduler_.cancel(id);
    end(record, RequestState::kCancelled, "", {}, steps_, t);
  }
  requests_.clear();
  for (const SequenceId seq : kv_.sequences()) kv_.free_sequence(seq);  // holds
  publish(true);
}

void Worker::drain_inbox() {
  std::vector<std::shared_ptr<Engine::Record>> requests, incoming, first_tokens;
  std::vector<bool> streamed;
  std::vector<SequenceId> releases;
  {
    std::lock_guard lock(inbox_mutex_);
    requests.swap(new_requests_);
    incoming.swap(new_incoming_);
    streamed.swap(new_incoming_streamed_);
    first_tokens.swap(first_tokens_);
    releases.swap(releases_);
  }
  for (const SequenceId hold : releases) release_hold(hold);
  for (auto& record : requests) admit(record);
  for (size_t i = 0; i < incoming.size(); ++i) {
    Incoming& in = incoming_.emplace_back();
    in.record = std::move(incoming[i]);
    in.owned = !streamed[i];
  }
  // Posted after the request itself, so it is here (a request its prefill worker ended gets no
  // first token).
  for (const auto& record : first_tokens)
    for (Incoming& in : incoming_)
      if (in.record == record) in.owned = true;
}

void Worker::admit(const std::shared_ptr<Engine::Record>& record) {
  const GenerationRequest& r = record->request;
  // A prefill worker computes the prompt and samples the first token; the rest is decoded
  // where the router sends it.
  const int32_t max_tokens = prefill_role() ? 1 : r.max_tokens;
  try {
    scheduler_.add({record->id, r.prompt, max_tokens, r.stop_at_end_of_generation});
  } catch (const Error& e) {
    end(record, RequestState::kFailed, e.what(), {}, steps_, MetricsClock::now());
    return;
  }
  requests_.emplace(record->id, record);
}

void Worker::release_hold(SequenceId hold) {
  if (kv_.has_sequence(hold)) kv_.free_sequence(hold);
}

void Worker::fail_all(const std::string& error) {
  const std::string message = "a step on " + name_ + " failed: " + error;
  logger("serving")->error("{}; its {} request(s) end as failed", message,
                           requests_.size() + incoming_.size());
  device_->set_layer_progress(nullptr);
  const MetricsTime t = MetricsClock::now();
  for (auto& [id, record] : requests_) {
    scheduler_.cancel(id);
    // As a step's end does: a streamed request's decode worker gives back its side and the
    // hold once it sees the request ended; otherwise the hold is this worker's to release.
    const bool streamed = prefill_role() && record->streamed;
    if (streamed) {
      std::lock_guard lock(record->mutex);
      record->info.decode_device.clear();
    } else {
      release_hold(hold_id(id));
    }
    end(record, RequestState::kFailed, message, {}, steps_, t);
    if (streamed) record->decode_worker->wake();
  }
  requests_.clear();
  for (auto it = incoming_.begin(); it != incoming_.end();)
    it = fail_incoming(*it, message) ? incoming_.erase(it) : std::next(it);
}

void Worker::handle_cancellations() {
  const MetricsTime t = MetricsClock::now();
  for (auto it = requests_.begin(); it != requests_.end();) {
    if (!it->second->cancelled.load()) {
      ++it;
      continue;
    }
    scheduler_.cancel(it->first);
    end(it->second, RequestState::kCancelled, "", {}, steps_, t);
    it = requests_.erase(it);
  }
  for (auto it = incoming_.begin(); it != incoming_.end();) {
    // Not owned yet: its prefill worker handles the cancel. Failed already: it ends as failed.
    if (!it->record->cancelled.load() || !it->owned || it->error) {
      ++it;
      continue;
    }
    give_back(*it);
    end(it->record, RequestState::kCancelled, "", {}, steps_, t);
    it = incoming_.erase(it);
  }
}

void Worker::handle_incoming() {
  bool reserving = true;  // first come, first served: stop reserving at the first that waits
  // A reserved block may be one a finished request freed while this device's stream still had a
  // copy into it queued (a verified tree's accepted rows); the connector writes on a stream of its
  // own, so this device's queued writes land before the first transfer of the pass starts.
  bool fenced = false;
  for (auto it = incoming_.begin(); it != incoming_.end();) {
    Incoming& in = *it;
    const auto& record = in.record;
    if (!in.owned && request_ended(record->state())) {  // its prefill worker ended it
      give_back(in);
      it = incoming_.erase(it);
      continue;
    }
    if (in.error) {  // failed while its prefill worker owned it
      if (!in.owned) {
        ++it;
        continue;
      }
      end(record, RequestState::kFailed, *in.error, {}, steps_, MetricsClock::now());
      it = incoming_.erase(it);
      continue;
    }
    if (!in.reserved) {
      // First come, first served: a preempted sequence waiting for blocks comes before arrivals
      // that have not reserved yet.
      if (!reserving || !scheduler_.waiting().empty()) {
        ++it;
        continue;
      }
      const GenerationRequest& r = record->request;
      std::optional<int32_t> n_ready;
      try {
        n_ready =
            scheduler_.receive({record->id, r.prompt, r.max_tokens, r.stop_at_end_of_generation});
      } catch (const Error& e) {
        it = fail_incoming(in, e.what()) ? incoming_.erase(it) : std::next(it);
        continue;
      }
      if (!n_ready) {
        reserving = false;
        const bool alone = scheduler_.running().empty() &&
                           std::none_of(incoming_.begin(), incoming_.end(),
                                        [](const Incoming& i) { return i.reserved; });
        if (alone) {  // nothing will ever free blocks for it
          const int32_t bs = kv_.block_size();
          const int64_t n = static_cast<int64_t>(r.prompt.size());
          it = fail_incoming(in, "request " + std::to_string(record->id) + ": its " +
                                     std::to_string(n) + "-token prompt needs " +
                                     std::to_string((n + bs - 1) / bs) + " KV blocks on " + name_ +
                                     ", whose pool has " + std::to_string(kv_.pool().n_blocks()))
                   ? incoming_.erase(it)
                   : std::next(it);
          continue;
        }
        ++it;
        continue;
      }
      in.reserved = true;
      const size_t from = static_cast<size_t>(*n_ready / kv_.block_size());
      std::vector<int32_t> dst;
      kv_.storage_slots(record->id, dst);
      KvTransferSpec spec;
      spec.request = record->id;
      spec.src = &record->prefill_worker->device().kv_storage();
      spec.dst = &device_->kv_storage();
      spec.src_blocks.assign(record->source_blocks.begin() + static_cast<ptrdiff_t>(from),
                             record->source_blocks.end());
      spec.dst_blocks.assign(dst.begin() + static_cast<ptrdiff_t>(from), dst.end());
      // One storage for both partitions: the prompt's full blocks change hands instead of being
      // copied. Its partial last block, which this side writes next, is copied (a slot that two
      // blocks map is never written: kv_slots.h).
      in.hand_over = same_storage(*spec.src, *spec.dst);
      if (in.hand_over) {
        const size_t n_full = r.prompt.size() / static_cast<size_t>(kv_.block_size());
        in.first_block = static_cast<int32_t>(from);
        in.adopted.clear();
        for (size_t b = from; b < n_full; ++b) {
          in.adopted.push_back(spec.src_blocks[b - from]);
          spec.dst_blocks[b - from] = spec.src_blocks[b - from];
        }
      }
      spec.n_tokens = static_cast<int32_t>(r.prompt.size()) - *n_ready;
      spec.layers_ready = record->layers_ready.get();  // streamed: copy each layer once written
      try {
        if (!fenced) {
          device_->kv_storage().fence();
          fenced = true;
        }
        in.transfer = connector_.send(std::move(spec));
      } catch (const Error& e) {
        it = fail_incoming(in, e.what()) ? incoming_.erase(it) : std::next(it);
        continue;
      }
    }
    const TransferState state = connector_.poll(in.transfer);
    // Not owned yet: the first token is still being computed; the ended transfer waits for it.
    if ((state != TransferState::kDone && state != TransferState::kFailed) || !in.owned) {
      ++it;
      continue;
    }
    finish_transfer(in, MetricsClock::now());
    it = incoming_.erase(it);
  }
}

bool Worker::fail_incoming(Incoming& in, std::string error) {
  give_back(in);
  if (in.owned) {
    end(in.record, RequestState::kFailed, std::move(error), {}, steps_, MetricsClock::now());
    return true;
  }
  in.error = std::move(error);
  return false;
}

void Worker::give_back(Incoming& in) {
  if (in.transfer >= 0) {
    connector_.cancel(in.transfer);
    connector_.wait(in.transfer);  // the destination blocks are written no more
    engine_.on_transfer_ended(connector_.release(in.transfer));
    in.transfer = -1;
  }
  if (in.reserved || scheduler_.contains(in.record->id)) scheduler_.cancel(in.record->id);
  in.reserved = false;
  if (!in.error) in.record->prefill_worker->post_release(hold_id(in.record->id));  // else done
}

void Worker::finish_transfer(Incoming& in, MetricsTime t) {
  const auto& record = in.record;
  const KvTransferStats stats = connector_.release(in.transfer);
  engine_.on_transfer_ended(stats);
  // Adopted while the prefill side's hold still references the slots; the slots this pool's
  // blocks give up go to the other partition, so this stream's copies must have landed first.
  bool done = stats.state == TransferState::kDone;
  std::string error = stats.error;
  if (done && in.hand_over) {
    try {
      device_->kv_storage().fence();
      kv_.adopt_slots(record->id, in.first_block, in.adopted);
    } catch (const Error& e) {
      done = false;
      error = std::string("request ") + std::to_string(record->id) +
              ": handing its KV over failed: " + e.what();
    }
  }
  record->prefill_worker->post_release(hold_id(record->id));
  if (!done) {
    scheduler_.cancel(record->id);
    end(record, RequestState::kFailed, error, {}, steps_, t);
    return;
  }
  scheduler_.adopt(record->id, record->generated);
  requests_.emplace(record->id, record);
  record->enter(RequestState::kDecoding, t);
}

bool Worker::step() {
  if (!scheduler_.has_unfinished()) {
    handle_finished();  // failures found while admitting
    return false;
  }
  const MetricsTime step_start = MetricsClock::now();
  if (chunk_sizer_) scheduler_.set_prefill_limit_with_decodes(chunk_sizer_->limit());
  const StepPlan plan = scheduler_.schedule();
  const int64_t step_id = plan.step;
  if (plan.empty()) {
    handle_finished();
    return false;
  }
  KvPool& storage = device_->kv_storage();
  for (const BlockCopy& copy : plan.copies) storage.copy_block(copy.src_slot, copy.dst_slot);
  batch_.clear();
  tables_.resize(plan.chunks.size());
  int32_t prompt_tokens = 0;  // of the step's rows, prompt tokens (the rest decode and verify)
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
      prompt_tokens += static_cast<int32_t>(n);
      const int64_t counted = std::min(n, record.prefill_tokens_left);
      record.prefill_tokens_left -= counted;
      queued_prefill_tokens_ -= counted;
    }
  }
  // Hidden states are needed where a draft head will propose from this step's rows.
  const bool need_hidden = std::any_of(plan.chunks.begin(), plan.chunks.end(), [&](const auto& c) {
    return c.wants_logits && requests_.at(c.seq)->head != nullptr;
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
  // Prefill role: a prompt whose last chunk this step computes keeps its blocks for the transfer
  // under a hold (released by the decode worker), and is handed to its decode worker now —
  // streamed — so that its KV transfer copies each layer as soon as this pass has written it.
  std::shared_ptr<std::atomic<int32_t>> layers_ready;
  if (prefill_role()) {
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
  }
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
  if (std::string fault = engine_.step_fault(name_, step_id); !fault.empty()) throw Error(fault);
  if (greedy_step_)
    device_->run_greedy(batch_, argmax_, need_hidden ? &hidden_ : nullptr);
  else if (filtered_step_)
    device_->run_filtered(batch_, filters_, filtered_, need_hidden ? &hidden_ : nullptr);
  else
    device_->run(batch_, logits_, need_hidden ? &hidden_ : nullptr);
  const double compute_s = seconds_between(run_start, MetricsClock::now());
  if (layers_ready) {
    device_->set_layer_progress(nullptr);
    layers_ready->store(static_cast<int32_t>(device_->model().hparams().n_layer),
                        std::memory_order_release);
  }
  const std::vector<ChunkResult> results = sample(plan);
  move_accepted_tree_rows(plan, results);
  const std::vector<EmittedToken> emitted = scheduler_.complete(plan, results);
  ++steps_;
  const MetricsTime t = MetricsClock::now();
  // Tokens per request, in order (a verification step emits several).
  std::unordered_map<RequestId, TokenEvent> events;
  std::unordered_map<RequestId, const ChunkResult*> result_of;  // requests with log-probabilities
  for (size_t i = 0, next = 0; i < plan.chunks.size(); ++i) {
    if (!plan.chunks[i].wants_logits) continue;
    const ChunkResult& r = results[next++];
    if (!r.logprobs.empty()) result_of[plan.chunks[i].seq] = &r;
  }
  for (const EmittedToken& e : emitted) {
    TokenEvent& ev = events[e.id];
    if (const auto it = result_of.find(e.id); it != result_of.end())
      ev.logprobs.push_back(it->second->logprobs[ev.tokens.size()]);  // emitted: a prefix
    ev.tokens.push_back(e.token);
    ev.drafted.push_back(e.drafted);
  }
  // A verifying step's timing goes with its request's tokens.
  const double verify_s = seconds_between(step_start, t);
  for (const ScheduledChunk& chunk : plan.chunks) {
    if (chunk.n_draft == 0) continue;
    const auto ev = events.find(chunk.seq);
    if (ev == events.end()) continue;
    Engine::Record& record = *requests_.at(chunk.seq);
    ev->second.verify_s = verify_s;
    ev->second.draft_s = record.proposal_s;
    std::lock_guard lock(record.mutex);
    record.info.speculation.verify_s += verify_s;
  }
  for (auto& [id, ev] : events) {
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
  std::vector<SequenceState> finished = scheduler_.take_finished();
  std::unordered_set<RequestId> ending;
  for (const SequenceState& s : finished) ending.insert(s.id);
  for (auto& [id, ev] : events) {
    if (ending.count(id)) continue;
    ev.id = id;
    ev.time = t;
    ev.step = step_id;
    ev.device = name_;
    ev.state = requests_.at(id)->state();
    engine_.publish(ev);
  }
  const MetricsTime propose_start = MetricsClock::now();
  propose_drafts(plan, results);
  const double propose_s = seconds_between(propose_start, MetricsClock::now());
  for (SequenceState& s : finished) {
    auto it = requests_.find(s.id);
    if (it == requests_.end()) continue;
    const std::shared_ptr<Engine::Record> record = it->second;
    requests_.erase(it);
    {
      std::lock_guard lock(record->mutex);
      record->info.preemptions += s.n_preemptions;
    }
    TokenEvent last;
    if (const auto ev = events.find(s.id); ev != events.end()) last = ev->second;
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
    engine_.publish(last);
    if (streamed)
      record->decode_worker->post_first_token(record);  // the decode worker owns it from here
    else
      engine_.hand_off(record, *this, false);
  }
  const int64_t preemptions = scheduler_.n_preemptions();
  for (; seen_preemptions_ < preemptions; ++seen_preemptions_) engine_.metrics().on_preemption();
  const PrefixCacheStats& ps = kv_.prefix_cache().stats();
  const int64_t lookups =
      (ps.hit_tokens + ps.miss_tokens) - (seen_prefix_.hit_tokens + seen_prefix_.miss_tokens);
  if (lookups > 0)
    engine_.metrics().on_prefix_lookup(lookups, ps.hit_tokens - seen_prefix_.hit_tokens);
  seen_prefix_ = ps;
  const MetricsTime step_end = MetricsClock::now();
  const double busy_s = seconds_between(step_start, step_end);
  busy_s_ += busy_s;
  compute_s_ += compute_s;
  StepSample sample;
  sample.end = step_end;
  sample.rows = plan.n_tokens();
  sample.sequences = static_cast<int32_t>(plan.chunks.size());
  sample.seconds = busy_s;
  sample.compute_s = compute_s;
  for (const ScheduledChunk& c : plan.chunks) {
    sample.logit_rows += c.wants_logits ? 1 + c.n_draft : 0;
    // Row t of the chunk attends positions [0, first_token + t].
    sample.attended_positions +=
        int64_t{c.n_tokens} * c.first_token + int64_t{c.n_tokens} * (c.n_tokens + 1) / 2;
    sample.kv_positions += c.first_token + c.n_tokens;
  }
  if (chunk_sizer_)
    chunk_sizer_->observe(static_cast<int32_t>(plan.n_tokens()) - prompt_tokens, prompt_tokens,
                          busy_s);
  recent_steps_.push_back(sample);
  if (recent_steps_.size() > DeviceSnapshot::kRecentSteps) recent_steps_.pop_front();
  // What a step of this many rows costs, for choosing draft lengths: decode and verification
  // rows only (a prefill chunk in the step would make it look dearer than drafting is).
  if (!plan.chunks.empty() &&
      std::all_of(plan.chunks.begin(), plan.chunks.end(), [](const ScheduledChunk& c) {
        return c.wants_logits && c.n_tokens == 1 + c.n_draft;
      }))
    step_costs_.record(static_cast<int32_t>(plan.n_tokens()), busy_s - propose_s);
  if (std::all_of(plan.chunks.begin(), plan.chunks.end(),
                  [](const ScheduledChunk& c) { return c.n_tokens == 1; })) {
    ++decode_steps_;
    decode_rows_ += static_cast<int64_t>(plan.chunks.size());
    decode_busy_s_ += busy_s;
    decode_compute_s_ += compute_s;
  }
  return true;
}

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
    auto logits = [&](int64_t r) -> LogitRow {
      if (filtered_step_) return filtered_.row(job.row + r);
      return std::span<const float>(logits_.data() + (job.row + r) * n_vocab,
                                    static_cast<size_t>(n_vocab));
    };
    Sampler& sampler = job.record->sampler;
    // Greedy steps on a device that took the argmax: the sampler's greedy choice is that argmax
    // (kernels::argmax), and greedy sampling draws no random numbers, so nothing else changes.
    auto choose = [&](int64_t r) {
      return greedy_step_ ? argmax_[static_cast<size_t>(job.row + r)] : sampler.sample(logits(r));
    };
    auto accept = [&](int64_t r, TokenId draft) {
      return greedy_step_ ? argmax_[static_cast<size_t>(job.row + r)] == draft
                          : sampler.accept_draft(logits(r), draft);
    };
    auto rejected = [&](int64_t r, TokenId draft) {
      return greedy_step_ ? argmax_[static_cast<size_t>(job.row + r)]
                          : sampler.sample_rejected(logits(r), draft);
    };
    ChunkResult& result = results[static_cast<size_t>(i)];
    const ScheduledChunk& chunk = *job.chunk;
    auto draft_at = [&](int32_t row) {
      return job.state->tokens[static_cast<size_t>(chunk.first_token + row)];
    };
    if (!chunk.tree_parent.empty()) {
      // A tree (greedy): from the last token's row, follow the child whose draft is the target's
      // choice while there is one; then the target's own token.
      int32_t at = 0;
      for (bool found = true; found;) {
        found = false;
        for (int32_t c = at + 1; c < chunk.n_tokens && !found; ++c) {
          if (chunk.tree_parent[static_cast<size_t>(c)] != at) continue;
          if (accept(at, draft_at(c))) {
            result.tokens.push_back(draft_at(c));
            result.path.push_back(c);
            at = c;
            found = true;
          }
        }
      }
      result.tokens.push_back(choose(at));
      return;
    }
    // A chain: accept drafts in order while the target agrees (speculative sampling keeps the
    // target's distribution), then one token of the target's own.
    int32_t j = 0;
    for (; j < chunk.n_draft; ++j) {
      const TokenId draft = draft_at(1 + j);
      if (!accept(j, draft)) {
        result.tokens.push_back(rejected(j, draft));
        break;
      }
      result.tokens.push_back(draft);
      result.path.push_back(1 + j);
    }
    if (j == chunk.n_draft) result.tokens.push_back(choose(j));
  };
  // Token k of a chunk's result was chosen from logits row 0 (k = 0) or path[k − 1].
  auto add_logprobs = [&](int64_t i) {
    const Job& job = jobs[static_cast<size_t>(i)];
    const int32_t top_n = job.record->request.logprobs;
    if (top_n < 0) return;
    ChunkResult& result = results[static_cast<size_t>(i)];
    for (size_t k = 0; k < result.tokens.size(); ++k) {
      const int64_t r = k == 0 ? 0 : result.path[k - 1];
      const std::span<const float> row(logits_.data() + (job.row + r) * n_vocab,
                                       static_cast<size_t>(n_vocab));
      result.logprobs.push_back(token_logprob(row, result.tokens[k], top_n));
    }
  };
  // One sampler per request, so the chunks are sampled in parallel. A greedy step on a device
  // that took the argmax only looks its rows' choices up: waking the device's threads for that
  // would cost more than the lookups.
  if (greedy_step_) {
    for (int64_t i = 0; i < static_cast<int64_t>(jobs.size()); ++i) sample_job(i);
  } else {
    device_->parallel_for(static_cast<int64_t>(jobs.size()), sample_job);
  }
  for (int64_t i = 0; i < static_cast<int64_t>(jobs.size()); ++i) add_logprobs(i);
  // Per-depth acceptance statistics: proposed at depth d when the drafts reached it, accepted
  // when the accepted path did.
  for (size_t i = 0; i < jobs.size(); ++i) {
    const ScheduledChunk& chunk = *jobs[i].chunk;
    if (chunk.n_draft == 0) continue;
    int32_t depth = chunk.n_draft;
    if (!chunk.tree_parent.empty()) {
      std::vector<int32_t> d(chunk.tree_parent.size(), 0);
      depth = 0;
      for (size_t r = 1; r < d.size(); ++r)
        depth = std::max(depth, d[r] = d[static_cast<size_t>(chunk.tree_parent[r])] + 1);
    }
    const auto accepted = static_cast<int32_t>(results[i].path.size());
    Engine::Record& record = *jobs[i].record;
    if (!record.chain_probabilities.empty()) {
      // The head's chain is the draft's first nodes (rows 1, 2, …), whatever a context lookup
      // branch added after them.
      const std::vector<int32_t>& path = results[i].path;
      int64_t hits = 0;
      while (hits < static_cast<int64_t>(record.chain_probabilities.size()) &&
             hits < static_cast<int64_t>(path.size()) &&
             path[static_cast<size_t>(hits)] == hits + 1)
        ++hits;
      record.confident_accepted += hits;
      for (const double p : record.chain_probabilities) record.confident_predicted += p;
      record.chain_probabilities.clear();
    }
    std::lock_guard lock(record.mutex);
    SpeculationStats& st = record.info.speculation;
    st.proposed_at.resize(std::max(st.proposed_at.size(), static_cast<size_t>(depth)));
    st.accepted_at.resize(st.proposed_at.size());
    for (int32_t p = 0; p < depth; ++p) {
      ++st.proposed_at[static_cast<size_t>(p)];
      if (p < accepted) ++st.accepted_at[static_cast<size_t>(p)];
    }
    ++st.verify_steps;
  }
  for (size_t i = 0; i < jobs.size(); ++i)
    if (jobs[i].chunk->n_draft > 0)
      consider_head_switch(*jobs[i].record, static_cast<int32_t>(results[i].tokens.size()));
  return results;
}

void Worker::consider_head_switch(Engine::Record& record, int32_t tokens) {
  if (!record.head_policy) return;
  const std::vector<HeadCandidate>& candidates = record.request.head_candidates;
  const size_t from = record.head_policy->current();
  const std::optional<size_t> to = record.head_policy->on_step(candidates, tokens);
  if (!to) return;
  SpeculationStats::HeadSwitch change;
  change.from = candidates[from].head->info.name;
  change.to = candidates[*to].head->info.name;
  change.from_record = candidates[from].recorded_accept_per_step;
  change.to_record = candidates[*to].recorded_accept_per_step;
  change.live_accept_per_step = record.head_policy->live_at_last_switch();
  record.head = candidates[*to].head;
  record.confident_accepted = 0;  // the new head's calibration starts afresh
  record.confident_predicted = 0.0;
  std::lock_guard lock(record.mutex);
  change.at_token = static_cast<int32_t>(record.info.output.size());
  logger("heads")->info(
      "request {}: switched draft head '{}' → '{}' after {} tokens (live ACCEPT/STEP {:.2f} < "
      "{:.0f}% of its record {:.2f}; '{}' recorded {:.2f})",
      record.id, change.from, change.to, change.at_token, change.live_accept_per_step,
      HeadSwitchPolicy::kRatio * 100, change.from_record, change.to, change.to_record);
  record.info.head = change.to;
  record.info.speculation.switches.push_back(std::move(change));
}

bool Worker::choose_draft_length(Engine::Record& record, int32_t other_rows) {
  if (!record.request.adaptive_draft || !record.request.tree_shape.empty())
    return record.draft_levels() > 0;
  const int32_t max = record.max_draft_len();
  if (max < 1) return false;
  if (!record.length_policy || record.length_policy->max_length() != max)
    record.length_policy.emplace(max);
  std::lock_guard lock(record.mutex);
  SpeculationStats& st = record.info.speculation;
  int32_t k = record.length_policy->choose(st.proposed_at, st.accepted_at, step_costs_,
                                           proposal_costs_, other_rows);
  // A chain that stops by confidence drafts up to the longest; the rule cuts it per step
  // (propose_sequential corrects length_steps to the length drafted).
  if (k > 0 && stops_by_confidence(record)) k = max;
  record.chosen_draft_len = k;
  if (st.length_steps.size() <= static_cast<size_t>(max))
    st.length_steps.resize(static_cast<size_t>(max) + 1, 0);
  ++st.length_steps[static_cast<size_t>(k)];
  return k > 0;
}

bool Worker::stops_by_confidence(const Engine::Record& record) const {
  return record.request.adaptive_draft && record.request.tree_shape.empty() && record.head &&
         record.head->is_mtp() && !device_->mtp_on_device();
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

void build_draft_tree(std::span<const std::vector<TokenId>> level_tokens,
                      std::vector<TokenId>& draft, std::vector<int32_t>& parent,
                      int32_t max_nodes) {
  std::vector<int32_t> previous = {-1};  // nodes of the level above (−1: the last token)
  for (const std::vector<TokenId>& tokens : level_tokens) {
    std::vector<int32_t> level;
    for (const int32_t p : previous) {
      for (const TokenId token : tokens) {
        if (static_cast<int32_t>(draft.size()) == max_nodes) return;
        level.push_back(static_cast<int32_t>(draft.size()));
        draft.push_back(token);
        parent.push_back(p);
      }
    }
    previous = std::move(level);
  }
}

void Worker::propose_drafts(const StepPlan& plan, const std::vector<ChunkResult>& results) {
  // The hidden state of the row whose logits gave each request's newest token.
  size_t row = 0, result = 0;
  for (const ScheduledChunk& chunk : plan.chunks) {
    if (!chunk.wants_logits) continue;
    const std::vector<int32_t>& path = results[result++].path;
    const size_t last_row = path.empty() ? 0 : static_cast<size_t>(path.back());
    const size_t chunk_row = row;
    row += static_cast<size_t>(1 + chunk.n_draft);
    const auto it = requests_.find(chunk.seq);
    if (it == requests_.end() || !it->second->head) continue;
    const float* h = hidden_.data() + (chunk_row + last_row) * hidden_width_;
    it->second->draft_hidden.assign(h, h + hidden_width_);
  }
  if (prefill_role()) return;  // the decode worker proposes, from the hidden state handed over
  // Every running request with a head and a fresh hidden state. Medusa heads: K residual rows
  // each, then one LM-head pass over all of them. mtp heads: their own sequential steps, one
  // request per host thread.
  std::vector<Engine::Record*> proposing, sequential, on_device;
  medusa_.clear();
  const auto others = static_cast<int32_t>(scheduler_.running().size()) - 1;
  for (const SequenceId seq : scheduler_.running()) {
    Engine::Record& record = *requests_.at(seq);
    if (!record.head) {  // context lookup alone, when the request asks for it
      if (record.request.lookup > 0 && scheduler_.sequence(seq).n_pending() == 1 &&
          choose_draft_length(record, others)) {
        record.proposal_s = 0.0;  // copied from the context: no model work
        set_draft(record, record.draft_levels(), {}, {});
      }
      continue;
    }
    if (record.draft_hidden.empty()) continue;
    if (scheduler_.sequence(seq).n_pending() != 1) continue;
    if (!choose_draft_length(record, others)) {
      record.draft_hidden.clear();
      continue;
    }
    if (record.head->is_mtp()) {
      // A device that drafts mtp heads itself (a GPU) takes them all.
      (device_->mtp_on_device() ? on_device : sequential).push_back(&record);
      continue;
    }
    proposing.push_back(&record);
    medusa_.push_back({record.head, record.draft_hidden.data(), record.draft_levels()});
  }
  if (!on_device.empty()) propose_on_device(on_device);
  if (!sequential.empty()) propose_sequential(sequential);
  if (proposing.empty()) return;
  const MetricsTime start = MetricsClock::now();
  int64_t rows = 0;
  for (const MedusaProposal& p : medusa_) rows += p.levels;
  // Each head row's top tokens: one for a chain, tree_shape[level] for a tree.
  std::vector<int32_t> wanted(static_cast<size_t>(rows), 1);
  {
    size_t at = 0;
    for (Engine::Record* record : proposing) {
      const std::vector<int32_t>& shape = record->request.tree_shape;
      for (int32_t level = 0; level < record->draft_levels(); ++level, ++at)
        if (!shape.empty()) wanted[at] = shape[static_cast<size_t>(level)];
    }
  }
  std::vector<std::vector<TokenId>> best;
  device_->medusa_top(medusa_, wanted, best);
  medusa_.clear();
  for (Engine::Record* record : proposing) record->draft_hidden.clear();
  const double seconds = seconds_between(start, MetricsClock::now());
  size_t next = 0;
  for (Engine::Record* record : proposing) {
    const int32_t k = record->draft_levels();
    std::vector<TokenId> draft;
    std::vector<int32_t> parent;
    if (record->request.tree_shape.empty()) {
      for (int32_t level = 0; level < k; ++level) draft.push_back(best[next + level].front());
    } else {
      build_draft_tree(std::span(best).subspan(next, static_cast<size_t>(k)), draft, parent,
                       record->head_tree_nodes());
    }
    set_draft(*record, k, std::move(draft), std::move(parent));
    next += static_cast<size_t>(k);
    record->proposal_s = seconds * k / static_cast<double>(rows);
    proposal_costs_.record(k, record->proposal_s);
    std::lock_guard lock(record->mutex);
    record->info.speculation.draft_s += record->proposal_s;
  }
}

void Worker::propose_on_device(const std::vector<Engine::Record*>& records) {
  const MetricsTime start = MetricsClock::now();
  std::vector<MtpProposal> proposals;
  for (Engine::Record* record : records) {
    const std::vector<int32_t>& shape = record->request.tree_shape;
    const auto levels = static_cast<size_t>(record->draft_levels());
    MtpProposal& p = proposals.emplace_back();
    p.head = record->head;
    p.hidden = record->draft_hidden.data();
    p.last = scheduler_.sequence(record->id).tokens.back();
    if (shape.empty())
      p.widths.assign(levels, 1);
    else
      p.widths.assign(shape.begin(), shape.begin() + static_cast<ptrdiff_t>(levels));
    p.max_nodes = record->head_tree_nodes();
    if (!shape.empty() && record->request.tree_nodes > 0) {
      p.best_first = true;
      p.max_nodes = std::min(record->request.tree_nodes, p.max_nodes);
    }
  }
  std::vector<std::vector<TokenId>> drafts, parents;
  device_->mtp_propose(proposals, drafts, parents);
  // One pass drafted them all: each request's share of its time is by its levels.
  const double seconds = seconds_between(start, MetricsClock::now());
  int64_t total = 0;
  for (Engine::Record* record : records) total += record->draft_levels();
  for (size_t i = 0; i < records.size(); ++i) {
    Engine::Record& record = *records[i];
    const double share = seconds * record.draft_levels() / static_cast<double>(total);
    record.draft_hidden.clear();
    record.proposal_s = share;
    proposal_costs_.record(record.draft_levels(), share);
    if (record.request.tree_shape.empty()) parents[i].clear();  // a chain
    set_draft(record, record.draft_levels(), std::move(drafts[i]), std::move(parents[i]));
    std::lock_guard lock(record.mutex);
    record.info.speculation.draft_s += share;
  }
}

void Worker::propose_sequential(const std::vector<Engine::Record*>& records) {
  struct Proposal {
    std::vector<TokenId> draft;
    std::vector<int32_t> parent;
    double seconds = 0.0;
    int32_t steps = 0;                       // draft steps computed
    std::optional<ChainStopRule> stop_rule;  // adaptive mtp chains: stopping by confidence
  };
  std::vector<Proposal> out(records.size());
  const auto others = static_cast<int32_t>(scheduler_.running().size()) - 1;
  for (size_t i = 0; i < records.size(); ++i) {
    const Engine::Record& record = *records[i];
    if (stops_by_confidence(record))
      out[i].stop_rule.emplace(
          step_costs_, proposal_costs_, others, record.draft_levels(),
          ChainStopRule::calibration(record.confident_accepted, record.confident_predicted));
  }
  std::vector<TokenId> last(records.size());
  for (size_t i = 0; i < records.size(); ++i)
    last[i] = scheduler_.sequence(records[i]->id).tokens.back();
  // One request per host thread when there are enough of them; fewer requests than threads
  // propose one after another, each draft step's products split over all the device's threads
  // (the drafts are the same either way).
  const int64_t threads = device_->threads();
  const bool one_by_one = static_cast<int64_t>(records.size()) < threads;
  const DraftSplit split = [this](int64_t parts, const std::function<void(int64_t)>& fn) {
    device_->parallel_for(parts, fn);
  };
  const DraftSplit* step_split = one_by_one ? &split : nullptr;
  const int64_t parts = one_by_one ? threads : 1;
  const auto propose = [&](int64_t i) {
    const Engine::Record& record = *records[static_cast<size_t>(i)];
    const MetricsTime start = MetricsClock::now();
    const std::vector<int32_t> chain(static_cast<size_t>(record.draft_levels()), 1);
    const std::vector<int32_t>& shape =
        record.request.tree_shape.empty() ? chain : record.request.tree_shape;
    Proposal& p = out[static_cast<size_t>(i)];
    const auto levels = std::span(shape).first(static_cast<size_t>(record.draft_levels()));
    if (!record.request.tree_shape.empty() && record.request.tree_nodes > 0)
      record.head->mtp_propose_best_first(
          device_->model(), record.draft_hidden.data(), last[static_cast<size_t>(i)], levels,
          std::min(record.request.tree_nodes, record.head_tree_nodes()), p.draft, p.parent,
          step_split, parts);
    else if (p.stop_rule) {
      ChainStopRule& rule = *p.stop_rule;
      const ChainStop stop = [&rule](double path_probability) {
        return rule.judge(path_probability);
      };
      record.head->mtp_propose(device_->model(), record.draft_hidden.data(),
                               last[static_cast<size_t>(i)], levels, record.head_tree_nodes(),
                               p.draft, p.parent, step_split, parts, &stop);
    } else {
      record.head->mtp_propose(device_->model(), record.draft_hidden.data(),
                               last[static_cast<size_t>(i)], levels, record.head_tree_nodes(),
                               p.draft, p.parent, step_split, parts);
    }
    if (record.request.tree_shape.empty()) p.parent.clear();  // a chain
    p.steps = p.stop_rule ? p.stop_rule->steps() : record.draft_levels();
    p.seconds = seconds_between(start, MetricsClock::now());
  };
  if (one_by_one) {
    for (int64_t i = 0; i < static_cast<int64_t>(records.size()); ++i) propose(i);
  } else {
    device_->parallel_for(static_cast<int64_t>(records.size()), propose);
  }
  for (size_t i = 0; i < records.size(); ++i) {
    Engine::Record& record = *records[i];
    Proposal& p = out[i];
    record.draft_hidden.clear();
    record.proposal_s = p.seconds;
    proposal_costs_.record(p.steps, p.seconds);
    const int32_t chosen = record.draft_levels();
    const auto drafted = static_cast<int32_t>(p.draft.size());
    if (p.stop_rule) {
      const std::vector<double>& kept = p.stop_rule->kept_probabilities();
      record.chain_probabilities.assign(
          kept.begin(), kept.begin() + std::min<ptrdiff_t>(drafted, std::ssize(kept)));
    }
    set_draft(record, chosen, std::move(p.draft), std::move(p.parent));
    std::lock_guard lock(record.mutex);
    record.info.speculation.draft_s += p.seconds;
    if (p.stop_rule && drafted != chosen) {  // count the step at the length it drafted
      std::vector<int64_t>& steps = record.info.speculation.length_steps;
      if (static_cast<size_t>(chosen) < steps.size() && steps[static_cast<size_t>(chosen)] > 0) {
        --steps[static_cast<size_t>(chosen)];
        ++steps[static_cast<size_t>(drafted)];
      }
    }
  }
}

void Worker::handle_finished() {
  for (SequenceState& s : scheduler_.take_finished()) {
    auto it = requests_.find(s.id);
    if (it == requests_.end()) continue;
    const std::shared_ptr<Engine::Record> record = it->second;
    requests_.erase(it);
    end(record,
        s.status == SequenceStatus::kFailed ? RequestState::kFailed : RequestState::kFinished,
        s.error, {}, steps_, MetricsClock::now());
  }
}

namespace {

// The live counters' finish reason of a request ending in `state`.
const char* finish_reason(const Engine::Record& record, RequestState state) {
  switch (state) {
    case RequestState::kFinished:
      return static_cast<int32_t>(record.generated.size()) >= record.request.max_tokens
                 ? kFinishLength
                 : kFinishStop;
    case RequestState::kCancelled:
      return record.stopped_by_caller.load() ? kFinishStop : kFinishAbort;
    default:
      return kFinishError;
  }
}

}  // namespace

void Worker::end(const std::shared_ptr<Engine::Record>& record, RequestState state,
                 std::string error, TokenEvent last, int64_t step, MetricsTime t) {
  queued_prefill_tokens_ -= record->prefill_tokens_left;
  record->prefill_tokens_left = 0;
  std::optional<RequestMetrics> metrics;
  if (record->timeline.output_tokens() > 0) metrics = record->timeline.compute();
  SpeculationStats speculation;
  std::string head;
  {
    std::lock_guard lock(record->mutex);
    record->info.state = state;
    record->info.entered[static_cast<size_t>(state)] = t;
    record->info.error = error;
    record->info.metrics = metrics;
    speculation = record->info.speculation;
    head = record->info.head;
  }
  if (state == RequestState::kFinished && metrics) {
    engine_.metrics().on_completed(
        *metrics, speculation.proposed_at, speculation.accepted_at,
        {speculation.verify_steps, speculation.draft_s, speculation.verify_s});
  }
  if (state == RequestState::kFailed) engine_.metrics().on_failed();
  EndedRequest ended;
  ended.finish_reason = finish_reason(*record, state);
  if (metrics) {
    ended.ttft_s = metrics->ttft_s;
    ended.e2e_s = metrics->e2e_s;
    ended.itl_s = metrics->itl_s;
  }
  ended.head = head;
  ended.verify_steps = speculation.verify_steps;
  ended.proposed_at = speculation.proposed_at;
  ended.accepted_at = speculation.accepted_at;
  engine_.metrics().on_request_ended(ended);
  last.id = record->id;
  last.time = t;
  last.step = step;
  last.device = name_;
  last.state = state;
  last.error = std::move(error);
  engine_.publish(last);
  engine_.on_ended(*record);
}

void Worker::publish(bool force) {
  const MetricsTime now = MetricsClock::now();
  if (!force && now - last_publish_ < kPublishEvery) return;
  last_publish_ = now;
  DeviceSnapshot snap;
  snap.name = name_;
  snap.role = worker_role_name(role_);
  snap.threads = device_->threads();
  snap.kv = kv_.snapshot();
  snap.running = static_cast<int32_t>(scheduler_.running().size());
  snap.waiting = static_cast<int32_t>(scheduler_.waiting().size());
  snap.receiving = static_cast<int32_t>(std::count_if(
      incoming_.begin(), incoming_.end(), [](const Incoming& i) { return i.reserved; }));
  snap.steps = steps_;
  snap.queued_prefill_tokens = queued_prefill_tokens_.load();
  snap.busy_s = busy_s_;
  snap.compute_s = compute_s_;
  snap.decode_steps = decode_steps_;
  snap.decode_rows = decode_rows_;
  snap.decode_busy_s = decode_busy_s_;
  snap.decode_compute_s = decode_compute_s_;
  if (chunk_sizer_) snap.prefill_limit = chunk_sizer_->limit();
  snap.recent_steps.assign(recent_steps_.begin(), recent_steps_.end());
  std::unordered_set<uint64_t> hashes;
  if (role_ == WorkerRole::kDecode)
    for (const BlockRecord& b : snap.kv.blocks)
      if (b.has_hash) hashes.insert(b.hash);
  std::lock_guard lock(published_mutex_);
  published_ = std::move(snap);
  published_hashes_ = std::move(hashes);
}

void Worker::set_draft(const Engine::Record& record, int32_t length, std::vector<TokenId> draft,
                       std::vector<int32_t> parent) {
  if (record.request.lookup > 0) {
    const std::vector<TokenId> branch =
        lookup_continuation(scheduler_.sequence(record.id).tokens, record.request.lookup, length);
    merge_draft_branch(draft, parent, branch, GenerationRequest::kMaxTreeNodes);
  }
  if (!draft.empty()) scheduler_.set_draft(record.id, std::move(draft), std::move(parent));
}

}  // namespace tokenfab
