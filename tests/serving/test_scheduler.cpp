// Scheduler (core/serving/scheduler.h) driven by a fake model: the next token is a fixed function
// of the sequence's tokens so far, as greedy decoding is, so any correct schedule — chunked,
// preempted and recomputed, or served from the prefix cache — must emit the same tokens as
// generating each request alone (reference_output).

#include <QtTest>
#include <algorithm>
#include <map>
#include <random>
#include <set>
#include <vector>

#include "core/common/error.h"
#include "core/kvcache/kv_manager.h"
#include "core/serving/chunk_sizer.h"
#include "core/serving/scheduler.h"

using namespace tokenfab;

namespace {

TokenId fake_next(const std::vector<TokenId>& tokens) {
  const size_t n = tokens.size();
  const int64_t a = tokens[n - 1];
  const int64_t b = n >= 2 ? tokens[n - 2] : 7;
  return static_cast<TokenId>((a * 31 + b * 17 + static_cast<int64_t>(n)) % 1000 + 10);
}

std::vector<TokenId> reference_output(std::vector<TokenId> tokens, int32_t max_tokens) {
  std::vector<TokenId> out;
  for (int32_t i = 0; i < max_tokens; ++i) {
    out.push_back(fake_next(tokens));
    tokens.push_back(out.back());
  }
  return out;
}

std::vector<TokenId> random_tokens(std::mt19937& rng, int32_t n) {
  std::uniform_int_distribution<TokenId> dist(10, 30000);
  std::vector<TokenId> tokens(static_cast<size_t>(n));
  for (TokenId& t : tokens) t = dist(rng);
  return tokens;
}

using Outputs = std::map<RequestId, std::vector<TokenId>>;

// One engine step: schedule, check the plan against the scheduler and KV state, "run" the fake
// model, complete. Appends emitted tokens to `outputs`.
void run_step(Scheduler& scheduler, const KvManager& kv, Outputs& outputs) {
  const StepPlan plan = scheduler.schedule();
  if (scheduler.chunked_prefill())
    QVERIFY2(plan.n_tokens() <= scheduler.token_budget(), "plan exceeds the token budget");
  std::set<SequenceId> seen;
  std::vector<ChunkResult> results;
  for (const ScheduledChunk& c : plan.chunks) {
    QVERIFY2(seen.insert(c.seq).second, "a sequence is planned twice in one step");
    const SequenceState& s = scheduler.sequence(c.seq);
    QCOMPARE(s.status, SequenceStatus::kRunning);
    QCOMPARE(c.first_token, s.n_computed);
    QVERIFY(c.n_tokens >= 1);
    QVERIFY(c.first_token + c.n_tokens <= s.n_tokens());
    QCOMPARE(c.wants_logits, c.first_token + c.n_tokens == s.n_tokens());
    QCOMPARE(kv.table(c.seq).n_tokens(), s.n_tokens());  // every planned token has a KV slot
    if (!c.wants_logits) continue;
    // Greedy verification of the drafts (none for ordinary chunks) against the fake model.
    ChunkResult& r = results.emplace_back();
    std::vector<TokenId> context(s.tokens.begin(),
                                 s.tokens.begin() + c.first_token + c.n_tokens - c.n_draft);
    for (int32_t j = 0; j <= c.n_draft; ++j) {
      const TokenId want = fake_next(context);
      r.tokens.push_back(want);
      if (j == c.n_draft || s.tokens[static_cast<size_t>(c.first_token + 1 + j)] != want) break;
      context.push_back(want);
    }
  }
  for (const EmittedToken& e : scheduler.complete(plan, std::span<const ChunkResult>(results)))
    outputs[e.id].push_back(e.token);
  const std::string violation = kv.check_invariants();
  QVERIFY2(violation.empty(), violation.c_str());
}

void run_until_idle(Scheduler& scheduler, const KvManager& kv, Outputs& outputs,
                    int max_steps = 20000) {
  for (int i = 0; i < max_steps && scheduler.has_unfinished(); ++i) {
    run_step(scheduler, kv, outputs);
    if (QTest::currentTestFailed()) return;
  }
  QVERIFY2(!scheduler.has_unfinished(), "scheduler did not drain");
}

void verify_all_free(const KvManager& kv) {
  const std::string violation = kv.check_invariants();
  QVERIFY2(violation.empty(), violation.c_str());
  const KvSnapshot snap = kv.snapshot();
  QCOMPARE(snap.n_owned, 0);
  QCOMPARE(snap.n_sequences, 0);
}

// Adds `n` requests with random prompts of [min_prompt, max_prompt] tokens and
// [min_out, max_out] output tokens; returns the requests.
std::vector<Request> add_random(Scheduler& scheduler, std::mt19937& rng, int n, int min_prompt,
                                int max_prompt, int min_out, int max_out, RequestId first_id = 1) {
  std::uniform_int_distribution<int> prompt_len(min_prompt, max_prompt);
  std::uniform_int_distribution<int> out_len(min_out, max_out);
  std::vector<Request> requests;
  for (int i = 0; i < n; ++i) {
    Request r{first_id + i, random_tokens(rng, prompt_len(rng)), out_len(rng)};
    requests.push_back(r);
    scheduler.add(r);
  }
  return requests;
}

void verify_outputs(const std::vector<Request>& requests, const Outputs& outputs) {
  for (const Request& r : requests) {
    const auto it = outputs.find(r.id);
    QVERIFY2(it != outputs.end(), qPrintable(QString("request %1 emitted nothing").arg(r.id)));
    QCOMPARE(static_cast<int32_t>(it->second.size()), r.max_tokens);
    QCOMPARE(it->second, reference_output(r.prompt, r.max_tokens));
  }
}

}  // namespace

class TestScheduler : public QObject {
  Q_OBJECT

 private slots:
  void bad_requests_and_settings_throw();
  void plans_respect_budget_and_outputs_match_reference();
  void decodes_advance_every_step_while_a_long_prompt_prefills();
  void tiny_pool_preempts_and_every_request_finishes();
  void cancel_in_each_state_frees_everything();
  void prefix_reuse_computes_only_the_uncached_tail();
  void prefix_hit_on_unwritten_blocks_is_recomputed();
  void request_too_large_for_the_pool_fails_alone();
  void end_of_generation_token_stops_early();
  void without_chunking_a_prompt_is_read_in_one_step();
  void prefill_limit_applies_only_to_steps_with_decodes();
  void chunk_sizer_keeps_mixed_steps_near_the_target();
  void chunk_sizer_floor_and_budget_bound_the_limit();
  void received_requests_resume_where_the_prefill_device_stopped();
  void receive_reuses_written_blocks_and_waits_for_room();
  void lone_decode_short_of_reserved_blocks_sits_out();
  void drafts_are_verified_and_rejected_ones_rolled_back();
};

void TestScheduler::bad_requests_and_settings_throw() {
  KvManager kv(16);
  QVERIFY_THROWS_EXCEPTION(Error, Scheduler(kv, 8, 16));  // budget below max_running
  QVERIFY_THROWS_EXCEPTION(Error, Scheduler(kv, 8, 0));
  Scheduler scheduler(kv, 64, 4);
  QVERIFY_THROWS_EXCEPTION(Error, scheduler.add(Request{1, {}, 4}));
  QVERIFY_THROWS_EXCEPTION(Error, scheduler.add(Request{1, {5, 6}, 0}));
  scheduler.add(Request{1, {5, 6}, 1});
  QVERIFY_THROWS_EXCEPTION(Error, scheduler.add(Request{1, {7}, 1}));  // id in use
  QVERIFY(!scheduler.cancel(99));
  const StepPlan plan = scheduler.schedule();
  QVERIFY_THROWS_EXCEPTION(
      Error, scheduler.complete(plan, std::span<const TokenId>()));  // one sampled token expected
  const std::vector<TokenId> sampled{42};
  QCOMPARE(scheduler.complete(plan, sampled), (std::vector<EmittedToken>{{1, 42}}));
  QVERIFY_THROWS_EXCEPTION(Error, scheduler.complete(plan, sampled));  // already completed
}

void TestScheduler::plans_respect_budget_and_outputs_match_reference() {
  KvManager kv(128);
  Scheduler scheduler(kv, 64, 8);
  std::mt19937 rng(1);
  const std::vector<Request> requests = add_random(scheduler, rng, 40, 1, 300, 1, 30);
  Outputs outputs;
  run_until_idle(scheduler, kv, outputs);
  if (QTest::currentTestFailed()) return;
  verify_outputs(requests, outputs);
  for (const SequenceState& s : scheduler.take_finished()) {
    QCOMPARE(s.status, SequenceStatus::kFinished);
  }
  verify_all_free(kv);
}

void TestScheduler::decodes_advance_every_step_while_a_long_prompt_prefills() {
  KvManager kv(512);
  Scheduler scheduler(kv, 512, 64);
  std::mt19937 rng(2);
  std::vector<Request> requests = add_random(scheduler, rng, 8, 10, 40, 300, 300);
  Outputs outputs;
  for (int i = 0; i < 3; ++i) run_step(scheduler, kv, outputs);  // all 8 decoding now
  for (const Request& r : requests) QVERIFY(scheduler.sequence(r.id).n_generated >= 1);

  const Request long_request{100, random_tokens(rng, 2000), 4};
  scheduler.add(long_request);
  requests.push_back(long_request);
  int prefill_steps = 0;
  while (scheduler.sequence(100).n_generated == 0) {
    std::vector<SequenceId> decoding;
    for (const SequenceId seq : scheduler.running()) {
      if (scheduler.sequence(seq).n_generated >= 1) decoding.push_back(seq);
    }
    run_step(scheduler, kv, outputs);
    if (QTest::currentTestFailed()) return;
    ++prefill_steps;
    const StepLogEntry& entry = scheduler.step_log().back();
    for (const SequenceId seq : decoding) {
      const bool advanced =
          std::any_of(entry.advanced.begin(), entry.advanced.end(),
                      [&](const auto& a) { return a.seq == seq && a.n_tokens >= 1; });
      QVERIFY2(advanced,
               qPrintable(QString("decode %1 stalled in step %2").arg(seq).arg(entry.step)));
    }
    QVERIFY(prefill_steps < 100);
  }
  // 2,000 prompt tokens in chunks of at most 512 - 8: at least four steps.
  QVERIFY2(prefill_steps >= 4, qPrintable(QString("prefilled in %1 steps").arg(prefill_steps)));
  run_until_idle(scheduler, kv, outputs);
  if (QTest::currentTestFailed()) return;
  verify_outputs(requests, outputs);
  scheduler.take_finished();
  verify_all_free(kv);
}

void TestScheduler::tiny_pool_preempts_and_every_request_finishes() {
  // 20 blocks of 16 = 320 tokens for 64 requests of up to 64 + 24 tokens each.
  KvManager kv(20);
  Scheduler scheduler(kv, 128, 64);
  std::mt19937 rng(3);
  const std::vector<Request> requests = add_random(scheduler, rng, 64, 16, 64, 8, 24);
  Outputs outputs;
  run_until_idle(scheduler, kv, outputs);
  if (QTest::currentTestFailed()) return;
  QVERIFY2(scheduler.n_preemptions() > 0, "the pool was meant to force preemption");
  verify_outputs(requests, outputs);  // exactly max_tokens each, equal to the unconstrained run
  const std::vector<SequenceState> finished = scheduler.take_finished();
  QCOMPARE(finished.size(), size_t{64});
  for (const SequenceState& s : finished) {
    QCOMPARE(s.status, SequenceStatus::kFinished);
    QCOMPARE(s.n_generated, s.max_tokens);
  }
  verify_all_free(kv);
}

void TestScheduler::cancel_in_each_state_frees_everything() {
  KvManager kv(8);  // 128 tokens
  Scheduler scheduler(kv, 32, 2);
  Outputs outputs;
  std::mt19937 rng(4);
  scheduler.add(Request{1, random_tokens(rng, 30), 60});  // decodes, fills its blocks
  scheduler.add(Request{2, random_tokens(rng, 60), 60});  // prefills over several steps
  scheduler.add(Request{3, random_tokens(rng, 5), 5});    // waits: max_running is 2
  run_step(scheduler, kv, outputs);
  QCOMPARE(scheduler.sequence(3).status, SequenceStatus::kWaiting);
  QVERIFY(scheduler.cancel(3));  // waiting
  QVERIFY(!scheduler.contains(3));
  QCOMPARE(scheduler.sequence(2).status, SequenceStatus::kRunning);
  QVERIFY(scheduler.sequence(2).n_computed < 60);
  QVERIFY(scheduler.cancel(2));  // running, mid-prefill
  QVERIFY(!kv.has_sequence(2));

  scheduler.add(Request{4, random_tokens(rng, 40), 60});
  for (int i = 0; i < 4; ++i) run_step(scheduler, kv, outputs);
  QVERIFY(scheduler.sequence(4).n_generated >= 1);
  QVERIFY(scheduler.cancel(4));  // running, decoding

  // Two sequences that outgrow the pool: the newer one is preempted.
  scheduler.add(Request{5, random_tokens(rng, 50), 60});
  for (int i = 0; i < 200 && scheduler.sequence(5).n_preemptions == 0; ++i) {
    run_step(scheduler, kv, outputs);
  }
  QCOMPARE(scheduler.sequence(5).status, SequenceStatus::kPreempted);
  QVERIFY(scheduler.cancel(5));  // preempted, waiting again
  QVERIFY(scheduler.waiting().empty());

  // Between schedule() and complete(): the cancelled sequence's results are dropped.
  scheduler.add(Request{6, random_tokens(rng, 8), 3});
  StepPlan plan = scheduler.schedule();
  std::vector<TokenId> sampled(static_cast<size_t>(plan.n_logits()), 11);
  QVERIFY(scheduler.cancel(6));
  for (const EmittedToken& e : scheduler.complete(plan, sampled)) QVERIFY(e.id != 6);

  run_until_idle(scheduler, kv, outputs);
  QCOMPARE(scheduler.sequence(1).status, SequenceStatus::kFinished);
  QVERIFY(scheduler.cancel(1));  // finished
  QVERIFY(!scheduler.has_unfinished());
  QVERIFY(scheduler.take_finished().empty());
  verify_all_free(kv);
}

void TestScheduler::prefix_reuse_computes_only_the_uncached_tail() {
  KvManager kv(256);
  Scheduler scheduler(kv, 512, 8);
  std::mt19937 rng(5);
  const std::vector<TokenId> prompt = random_tokens(rng, 300);
  Outputs outputs;
  scheduler.add(Request{1, prompt, 2});
  run_until_idle(scheduler, kv, outputs);

  scheduler.add(Request{2, prompt, 2});
  const StepPlan plan = scheduler.schedule();
  QCOMPARE(plan.chunks.size(), size_t{1});
  // 299 / 16 = 18 full blocks are found; only the 12-token tail is computed.
  QCOMPARE(plan.chunks[0].first_token, 288);
  QCOMPARE(plan.chunks[0].n_tokens, 12);
  const std::vector<TokenId> sampled{fake_next(prompt)};
  for (const EmittedToken& e : scheduler.complete(plan, sampled)) outputs[e.id].push_back(e.token);
  run_until_idle(scheduler, kv, outputs);
  QCOMPARE(outputs[2], outputs[1]);
  QCOMPARE(outputs[2], reference_output(prompt, 2));
  QCOMPARE(kv.snapshot().prefix.hit_tokens, int64_t{288});
  scheduler.take_finished();
  verify_all_free(kv);
}

void TestScheduler::prefix_hit_on_unwritten_blocks_is_recomputed() {
  KvManager kv(256);
  Scheduler scheduler(kv, 128, 8);
  std::mt19937 rng(6);
  const std::vector<TokenId> prompt = random_tokens(rng, 150);
  Outputs outputs;
  scheduler.add(Request{1, prompt, 3});
  run_step(scheduler, kv, outputs);  // request 1 has written tokens [0, 128)
  scheduler.add(Request{2, prompt, 3});
  // Request 2 hits 9 registered blocks, but request 1 writes the ninth only in this step:
  // request 2 must start at token 128, not 144.
  const StepPlan plan = scheduler.schedule();
  QCOMPARE(plan.chunks.size(), size_t{2});
  QCOMPARE(plan.chunks[1].seq, SequenceId{2});
  QCOMPARE(plan.chunks[1].first_token, 128);
  QCOMPARE(plan.chunks[1].n_tokens, 22);
  const std::vector<TokenId> sampled{fake_next(prompt), fake_next(prompt)};
  for (const EmittedToken& e : scheduler.complete(plan, sampled)) outputs[e.id].push_back(e.token);
  run_until_idle(scheduler, kv, outputs);
  QCOMPARE(outputs[1], reference_output(prompt, 3));
  QCOMPARE(outputs[2], reference_output(prompt, 3));
  scheduler.take_finished();
  verify_all_free(kv);
}

void TestScheduler::request_too_large_for_the_pool_fails_alone() {
  KvManager kv(4);  // 64 tokens
  Scheduler scheduler(kv, 64, 4);
  std::mt19937 rng(7);
  scheduler.add(Request{1, random_tokens(rng, 5), 3});     // fits
  scheduler.add(Request{2, random_tokens(rng, 100), 3});   // prompt alone exceeds the pool
  scheduler.add(Request{3, random_tokens(rng, 10), 100});  // outgrows the pool while decoding
  scheduler.add(Request{4, random_tokens(rng, 6), 4});     // fits, after the failures
  Outputs outputs;
  run_until_idle(scheduler, kv, outputs);
  if (QTest::currentTestFailed()) return;
  QCOMPARE(scheduler.sequence(1).status, SequenceStatus::kFinished);
  QCOMPARE(scheduler.sequence(4).status, SequenceStatus::kFinished);
  for (const RequestId id : {RequestId{2}, RequestId{3}}) {
    const SequenceState& s = scheduler.sequence(id);
    QCOMPARE(s.status, SequenceStatus::kFailed);
    QVERIFY2(s.error.find("KV blocks") != std::string::npos, s.error.c_str());
  }
  QCOMPARE(static_cast<int32_t>(outputs[4].size()), 4);
  scheduler.take_finished();
  verify_all_free(kv);
}

void TestScheduler::end_of_generation_token_stops_early() {
  KvManager kv(32);
  std::mt19937 rng(8);
  const std::vector<TokenId> prompt = random_tokens(rng, 20);
  const std::vector<TokenId> reference = reference_output(prompt, 10);
  const TokenId eog = reference[3];
  Scheduler scheduler(kv, 64, 4, [eog](TokenId t) { return t == eog; });
  scheduler.add(Request{1, prompt, 10});
  Outputs outputs;
  run_until_idle(scheduler, kv, outputs);
  const auto first_eog = std::find(reference.begin(), reference.end(), eog);
  QCOMPARE(outputs[1], std::vector<TokenId>(reference.begin(), first_eog + 1));
  QCOMPARE(scheduler.sequence(1).status, SequenceStatus::kFinished);
  scheduler.take_finished();
  verify_all_free(kv);
}

// set_chunked_prefill(false): the 2,000-token prompt is one chunk, computed in the same step as the
// running decodes (which therefore wait for it: the behaviour chunking exists to avoid).
void TestScheduler::without_chunking_a_prompt_is_read_in_one_step() {
  KvManager kv(512);
  Scheduler scheduler(kv, 512, 64);
  scheduler.set_chunked_prefill(false);
  std::mt19937 rng(5);
  std::vector<Request> requests = add_random(scheduler, rng, 4, 10, 40, 20, 20);
  Outputs outputs;
  for (int i = 0; i < 2; ++i) run_step(scheduler, kv, outputs);
  const Request long_request{100, random_tokens(rng, 2000), 4};
  scheduler.add(long_request);
  requests.push_back(long_request);
  const StepPlan plan = scheduler.schedule();
  const auto it = std::find_if(plan.chunks.begin(), plan.chunks.end(),
                               [](const ScheduledChunk& c) { return c.seq == 100; });
  QVERIFY(it != plan.chunks.end());
  QCOMPARE(it->n_tokens, 2000);
  QVERIFY(it->wants_logits);
  QCOMPARE(plan.n_tokens(), 2000 + 4);  // the four decodes ride along
  std::vector<TokenId> sampled;
  for (const ScheduledChunk& c : plan.chunks)
    sampled.push_back(fake_next(scheduler.sequence(c.seq).tokens));
  for (const EmittedToken& e : scheduler.complete(plan, sampled)) outputs[e.id].push_back(e.token);
  run_until_idle(scheduler, kv, outputs);
  if (QTest::currentTestFailed()) return;
  verify_outputs(requests, outputs);
  scheduler.take_finished();
  verify_all_free(kv);
}

// A prefill limit caps the prompt tokens of a step that also decodes, and only of such steps: a
// long prompt arriving alone still takes the whole budget. Outputs are unchanged.
void TestScheduler::prefill_limit_applies_only_to_steps_with_decodes() {
  KvManager kv(512);
  Scheduler scheduler(kv, 512, 64);
  scheduler.set_prefill_limit_with_decodes(40);
  std::mt19937 rng(8);
  std::vector<Request> requests;
  const Request alone{50, random_tokens(rng, 1000), 200};  // decodes all through the test
  scheduler.add(alone);
  requests.push_back(alone);
  Outputs outputs;
  run_step(scheduler, kv, outputs);
  const auto& first = scheduler.step_log().back().advanced;  // no decodes yet: the whole budget
  QCOMPARE(first.size(), size_t{1});
  QCOMPARE(first[0].n_tokens, 512);
  run_step(scheduler, kv, outputs);  // the other 488 and the first token
  QCOMPARE(scheduler.sequence(50).n_generated, 1);

  const Request long_request{100, random_tokens(rng, 2000), 4};
  scheduler.add(long_request);
  requests.push_back(long_request);
  int steps = 0;
  while (scheduler.sequence(100).n_generated == 0) {
    run_step(scheduler, kv, outputs);
    if (QTest::currentTestFailed()) return;
    const StepLogEntry& entry = scheduler.step_log().back();
    int32_t prompt_tokens = 0;
    for (const auto& a : entry.advanced)
      if (a.seq == 100) prompt_tokens += a.n_tokens;
    QVERIFY2(prompt_tokens <= 40,
             qPrintable(QString("step %1 read %2 prompt tokens beside a decode")
                            .arg(entry.step)
                            .arg(prompt_tokens)));
    QVERIFY(++steps < 200);
  }
  QVERIFY2(steps >= 2000 / 40, qPrintable(QString("prefilled in %1 steps").arg(steps)));
  run_until_idle(scheduler, kv, outputs);
  if (QTest::currentTestFailed()) return;
  verify_outputs(requests, outputs);
  scheduler.take_finished();
  verify_all_free(kv);
}

namespace {

// A device whose step takes `fixed_s` for its decodes plus one `token_s` per prompt token.
struct LinearDevice {
  double fixed_s, token_s;
  double step(int32_t prompt_tokens) const { return fixed_s + prompt_tokens * token_s; }
};

}  // namespace

// On a device of known costs, steps sized by the sizer converge to the target — within 5 % after
// 20 steps — starting from the floor, and follow the device when it slows down.
void TestScheduler::chunk_sizer_keeps_mixed_steps_near_the_target() {
  ChunkSizer sizer(0.050, 512);
  QCOMPARE(sizer.limit(), ChunkSizer::kMinTokens);  // nothing measured yet
  LinearDevice device{0.010, 0.001};                // 10 ms of decodes, 1 ms per prompt token
  sizer.observe(0, 512, 0.5);                       // no decodes: not counted
  sizer.observe(8, 0, 0.2);                         // no prompt tokens: not counted
  QCOMPARE(sizer.limit(), ChunkSizer::kMinTokens);
  auto settle = [&](int steps) {
    for (int i = 0; i < steps; ++i) {
      const int32_t n = sizer.limit();
      sizer.observe(8, n, device.step(n));
    }
  };
  settle(20);
  double step_s = device.step(sizer.limit());
  QVERIFY2(std::abs(step_s - 0.050) < 0.0025, qPrintable(QString("step %1 s").arg(step_s)));
  QVERIFY2(std::abs(sizer.limit() - 40) <= 2, qPrintable(QString("limit %1").arg(sizer.limit())));

  device.token_s = 0.002;  // later chunks attend over a longer prompt: each token costs twice
  settle(20);
  step_s = device.step(sizer.limit());
  QVERIFY2(std::abs(step_s - 0.050) < 0.0025, qPrintable(QString("step %1 s").arg(step_s)));

  // A step whose prompts ran out below the limit, under the target, leaves it as it is.
  const int32_t before = sizer.limit();
  sizer.observe(8, 3, device.step(3));
  QCOMPARE(sizer.limit(), before);
  // One over the target lowers it, by at most half.
  sizer.observe(8, 3, 1.0);
  QCOMPARE(sizer.limit(), ChunkSizer::kMinTokens);
}

// The limit never falls below kMinTokens (prompts keep moving when decodes alone fill the
// target) nor exceeds the token budget (a fast device reads whole budgets), and moves by at most
// a factor of two per step; a bad target is refused.
void TestScheduler::chunk_sizer_floor_and_budget_bound_the_limit() {
  ChunkSizer slow(0.050, 512);
  for (int i = 0; i < 5; ++i) slow.observe(32, slow.limit(), 0.080);  // decodes alone: 80 ms
  QCOMPARE(slow.limit(), ChunkSizer::kMinTokens);

  ChunkSizer fast(0.050, 512);
  LinearDevice gpu{0.002, 0.00001};  // a GPU-like device: 512 tokens in about 5 ms
  int32_t previous = fast.limit();
  for (int i = 0; i < 10; ++i) {
    fast.observe(64, fast.limit(), gpu.step(fast.limit()));
    QVERIFY(fast.limit() <= 2 * previous);
    previous = fast.limit();
  }
  QCOMPARE(fast.limit(), 512);

  ChunkSizer tiny_budget(0.050, 8);
  QCOMPARE(tiny_budget.limit(), 8);
  tiny_budget.observe(4, 8, 0.001);
  QCOMPARE(tiny_budget.limit(), 8);

  QVERIFY_THROWS_EXCEPTION(Error, ChunkSizer(0.0, 512));
  QVERIFY_THROWS_EXCEPTION(Error, ChunkSizer(-1.0, 512));
  QVERIFY_THROWS_EXCEPTION(Error, ChunkSizer(0.05, 0));
}

// Disaggregated hand-off on the scheduler level: a prefill-side scheduler computes each prompt
// and its first token (max_tokens 1); the decode-side scheduler receives the request (blocks
// reserved, status kReceiving, not scheduled), adopts it with that token and decodes the rest.
// The outputs equal generating alone.
void TestScheduler::received_requests_resume_where_the_prefill_device_stopped() {
  KvManager prefill_kv(256), decode_kv(256);
  Scheduler prefill(prefill_kv, 512, 64), decode(decode_kv, 512, 64);
  std::mt19937 rng(9);
  std::vector<Request> requests;
  for (int i = 0; i < 6; ++i) {
    requests.push_back({i + 1, random_tokens(rng, 5 + 37 * i), 12});
    prefill.add({requests.back().id, requests.back().prompt, 1});
  }
  Outputs outputs;
  run_until_idle(prefill, prefill_kv, outputs);
  if (QTest::currentTestFailed()) return;
  prefill.take_finished();
  verify_all_free(prefill_kv);
  for (const Request& r : requests) {
    const std::optional<int32_t> ready = decode.receive(r);
    QVERIFY(ready.has_value());
    QCOMPARE(*ready, 0);  // nothing of it was in this pool
    QCOMPARE(decode.sequence(r.id).status, SequenceStatus::kReceiving);
    QCOMPARE(decode_kv.table(r.id).n_tokens(), static_cast<int32_t>(r.prompt.size()));
  }
  const StepPlan nothing = decode.schedule();
  QVERIFY(nothing.empty());  // receiving requests are not scheduled
  decode.complete(nothing, std::span<const TokenId>());
  QVERIFY_THROWS_EXCEPTION(Error, decode.adopt(requests[0].id, {}));
  for (const Request& r : requests) decode.adopt(r.id, outputs[r.id]);
  QVERIFY_THROWS_EXCEPTION(Error, decode.adopt(requests[0].id, outputs[requests[0].id]));
  run_until_idle(decode, decode_kv, outputs);
  if (QTest::currentTestFailed()) return;
  verify_outputs(requests, outputs);
  decode.take_finished();
  verify_all_free(decode_kv);
}

// A received prompt whose leading full blocks an adopted request already wrote in this pool needs
// only the rest sent; a pool without room answers nullopt and changes nothing; cancelling a
// receiving request frees its blocks.
void TestScheduler::receive_reuses_written_blocks_and_waits_for_room() {
  KvManager kv(8);  // 128 tokens
  Scheduler scheduler(kv, 512, 64);
  std::mt19937 rng(4);
  const std::vector<TokenId> shared = random_tokens(rng, 48);
  Request first{1, shared, 4};
  first.prompt.push_back(11);
  QCOMPARE(scheduler.receive(first), std::optional<int32_t>(0));
  // Before adoption the blocks are reserved but not written: a second request must not count on
  // them.
  Request second{2, shared, 4};
  second.prompt.insert(second.prompt.end(), {12, 13});
  QCOMPARE(scheduler.receive(second), std::optional<int32_t>(0));
  scheduler.cancel(2);
  scheduler.adopt(1, std::vector<TokenId>{fake_next(first.prompt)});
  QCOMPARE(scheduler.receive(second), std::optional<int32_t>(48));  // three written blocks
  Request big{3, random_tokens(rng, 100), 4};
  const KvSnapshot before = kv.snapshot();
  QVERIFY(!scheduler.receive(big).has_value());
  QVERIFY(!scheduler.contains(3));
  QCOMPARE(kv.snapshot().n_owned, before.n_owned);
  scheduler.cancel(2);
  scheduler.cancel(1);
  scheduler.take_finished();
  verify_all_free(kv);
}

// A decode worker's only running sequence needs a block that a received request holds while its
// KV arrives: it neither fails nor gives its blocks up, but sits the step out. Once the arrival
// runs, the newest yields (preempted) and the older one goes on.
void TestScheduler::lone_decode_short_of_reserved_blocks_sits_out() {
  KvManager kv(4);  // 64 tokens
  Scheduler scheduler(kv, 64, 4);
  std::mt19937 rng(7);
  Request old_one{1, random_tokens(rng, 32), 8};  // 2 full blocks
  QCOMPARE(scheduler.receive(old_one), std::optional<int32_t>(0));
  scheduler.adopt(1, std::vector<TokenId>{fake_next(old_one.prompt)});
  Request arrival{2, random_tokens(rng, 20), 8};
  QCOMPARE(scheduler.receive(arrival), std::optional<int32_t>(0));  // the other 2 blocks
  const StepPlan idle = scheduler.schedule();  // token 33 needs a third block: none is free
  QVERIFY(idle.chunks.empty());
  QCOMPARE(scheduler.running(), (std::vector<SequenceId>{1}));
  QVERIFY(scheduler.take_finished().empty());  // not failed
  scheduler.adopt(2, std::vector<TokenId>{fake_next(arrival.prompt)});
  const StepPlan plan = scheduler.schedule();
  QCOMPARE(static_cast<int>(plan.chunks.size()), 1);
  QCOMPARE(plan.chunks[0].seq, SequenceId{1});
  QCOMPARE(scheduler.waiting(), (std::deque<SequenceId>{2}));  // preempted, to be recomputed
  scheduler.cancel(1);
  scheduler.cancel(2);
  verify_all_free(kv);
}

// Speculative steps in a tight pool: every decoding sequence gets drafts of 1–5 tokens (the true
// continuation with random corruptions) before each step. Outputs equal the reference, drafted
// tokens are marked, the invariants hold after each step and everything is free at the end.
void TestScheduler::drafts_are_verified_and_rejected_ones_rolled_back() {
  KvManager kv(20);
  Scheduler scheduler(kv, 96, 16);
  std::mt19937 rng(12);
  const std::vector<Request> requests = add_random(scheduler, rng, 24, 5, 60, 10, 50);
  Outputs outputs;
  int64_t drafted = 0;
  for (int step = 0; step < 5000 && scheduler.has_unfinished(); ++step) {
    for (const SequenceId seq : scheduler.running()) {
      const SequenceState& s = scheduler.sequence(seq);
      if (s.n_pending() != 1 || s.n_generated == 0) continue;
      std::vector<TokenId> context = s.tokens, draft;
      std::uniform_int_distribution<int> len(1, 5), corrupt(0, 7);
      for (int k = len(rng); k > 0; --k) {
        TokenId t = fake_next(context);
        if (corrupt(rng) == 0) t += 1;
        draft.push_back(t);
        context.push_back(t);
      }
      scheduler.set_draft(seq, draft);
    }
    run_step(scheduler, kv, outputs);
    if (QTest::currentTestFailed()) return;
    for (const StepLogEntry::Advance& a : scheduler.step_log().back().advanced)
      drafted += a.n_tokens > 1;
  }
  QVERIFY(!scheduler.has_unfinished());
  verify_outputs(requests, outputs);
  QVERIFY2(scheduler.n_preemptions() > 0, "the pool never filled up");
  QVERIFY(drafted > 0);
  scheduler.take_finished();
  verify_all_free(kv);
}

QTEST_APPLESS_MAIN(TestScheduler)
#include "test_scheduler.moc"
