// Worker, speculative decoding: after a step, keeps the hidden row each speculating request's
// next drafts start from, asks the proposer (core/speculative/proposer.h) for every decoding
// request's drafts and hands them to the scheduler, and records what proposing cost and chose
// in the request's figures; after a verification, applies the proposer's head switches.

#include "core/common/log.h"
#include "core/serving/engine_record.h"
#include "core/serving/worker.h"

namespace tokenfab {

void Worker::consider_head_switch(Engine::Record& record, int32_t tokens) {
  std::optional<HeadSwitchEvent> event = Proposer::on_verified(record.draft, tokens);
  if (!event) return;
  SpeculationStats::HeadSwitch change;
  change.from = std::move(event->from);
  change.to = std::move(event->to);
  change.from_record = event->from_record;
  change.to_record = event->to_record;
  change.live_accept_per_step = event->live_accept_per_step;
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
    if (it == requests_.end() || !it->second->draft.head) continue;
    const float* h = hidden_.data() + (chunk_row + last_row) * hidden_width_;
    it->second->draft.hidden.assign(h, h + hidden_width_);
  }
  if (prefill_role()) return;  // the decode worker proposes, from the hidden state handed over
  // Every running request that drafts and has one token to decode next.
  std::vector<Engine::Record*> records;
  std::vector<Proposer::Candidate> candidates;
  std::vector<std::vector<int64_t>> proposed(scheduler_.running().size()),
      accepted(scheduler_.running().size());
  for (const SequenceId seq : scheduler_.running()) {
    Engine::Record& record = *requests_.at(seq);
    const SequenceState& s = scheduler_.sequence(seq);
    if (!record.draft.drafts() || s.n_pending() != 1) continue;
    const size_t i = records.size();
    {
      std::lock_guard lock(record.mutex);
      proposed[i] = record.info.speculation.proposed_at;
      accepted[i] = record.info.speculation.accepted_at;
    }
    records.push_back(&record);
    candidates.push_back({&record.draft, s.tokens, proposed[i], accepted[i]});
  }
  if (records.empty()) return;
  const auto others = static_cast<int32_t>(scheduler_.running().size()) - 1;
  std::vector<Proposer::Proposal> proposals = proposer_.propose(candidates, others);
  for (size_t i = 0; i < records.size(); ++i) {
    Engine::Record& record = *records[i];
    Proposer::Proposal& p = proposals[i];
    if (!p.draft.empty()) scheduler_.set_draft(record.id, std::move(p.draft), std::move(p.parent));
    std::lock_guard lock(record.mutex);
    SpeculationStats& st = record.info.speculation;
    st.draft_s += p.seconds;
    if (p.chosen_length) {  // an adaptive chain's length, counted by length
      const auto chosen = static_cast<size_t>(*p.chosen_length);
      if (st.length_steps.size() <= static_cast<size_t>(p.max_length))
        st.length_steps.resize(static_cast<size_t>(p.max_length) + 1, 0);
      ++st.length_steps[chosen];
      if (p.drafted_length && st.length_steps[chosen] > 0) {  // stopped by confidence earlier
        --st.length_steps[chosen];
        ++st.length_steps[static_cast<size_t>(*p.drafted_length)];
      }
    }
  }
}

}  // namespace tokenfab
