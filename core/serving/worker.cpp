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
      scheduler_(kv_, config.token_budget, config.max_running, std::move(is_end_of_generation)),
      proposer_(*device_) {
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
  engine_.publish(*record, last);
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

}  // namespace tokenfab
