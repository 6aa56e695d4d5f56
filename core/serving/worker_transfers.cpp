// Worker, decode role: prompts arriving from a prefill worker — blocks reserved for them, their KV
// transfers started, polled and adopted into the running batch, or failed and given back.

#include <algorithm>

#include "core/common/error.h"
#include "core/serving/engine_record.h"
#include "core/serving/worker.h"

namespace tokenfab {

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

}  // namespace tokenfab
