// The engine facade on the real model: the same greedy tokens in every mode (one request alone,
// colocated batches, disaggregated prefill → transfer → decode, with and without a long-prompt
// pool), a tiny pool that forces preemption, cancellation in every lifecycle state, an injected
// transfer failure, a failed device step (its worker's requests fail, the engine goes on), the
// decode-side prefix cache, and the lifecycle timestamps. After each run
// every device's pool must hold no owned block.

#include <QtTest>
#include <algorithm>
#include <atomic>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <thread>

#include "core/common/error.h"
#include "core/model/llama_model.h"
#include "core/model/model_files.h"
#include "core/serving/engine.h"
#include "core/tokenizer/tokenizer.h"
#include "tests/common/default_model.h"
#include "tests/serving/serving_prompts.h"

using namespace tokenfab;

namespace {

constexpr int32_t kMaxTokens = 12;

bool no_owned_blocks(const EngineSnapshot& s, QString& why) {
  for (const DeviceSnapshot& d : s.devices) {
    if (d.kv.n_owned != 0 || d.running != 0 || d.waiting != 0 || d.receiving != 0) {
      why = QString("%1: %2 owned blocks, %3 running, %4 waiting, %5 receiving")
                .arg(QString::fromStdString(d.name))
                .arg(d.kv.n_owned)
                .arg(d.running)
                .arg(d.waiting)
                .arg(d.receiving);
      return false;
    }
  }
  return true;
}

}  // namespace

class EngineTest : public QObject {
  Q_OBJECT

 private slots:
  void initTestCase();
  void identical_greedy_outputs_in_every_mode();
  void events_stream_every_token_in_order();
  void tiny_pool_preempts_and_matches_unconstrained();
  void partitions_share_storage_under_pressure();
  void cancel_in_each_state_frees_everything();
  void injected_transfer_failure_fails_only_its_request();
  void failed_step_fails_its_workers_requests_and_the_engine_goes_on();
  void transfer_streams_layers_during_the_last_prefill_step();
  void request_ended_at_its_first_token_leaves_nothing_on_the_decode_device();
  void follow_up_turn_prefills_only_new_tokens_on_the_decode_device();
  void long_prompts_use_their_own_prefill_pool();
  void lifecycle_timestamps_are_ordered();
  void output_rate_leaves_out_idle_time_before_a_run();
  void bad_requests_and_configurations_throw();
  void devices_text_names_the_devices_and_how_gpus_decode();

 private:
  EngineConfig config(std::string devices, std::string prefill = "", std::string decode = "") const;
  // Submits every prompt at once, waits, returns the outputs in prompt order.
  std::vector<std::vector<TokenId>> run_all(Engine& engine, int32_t max_tokens = kMaxTokens);
  void expect_all_free(Engine& engine);

  std::unique_ptr<LlamaModel> model_;
  std::optional<Tokenizer> tokenizer_;
  std::vector<std::vector<TokenId>> prompts_;
  std::vector<std::vector<TokenId>> alone_;  // each prompt alone on one device
};

void EngineTest::initTestCase() {
  TOKENFAB_LOAD_DEFAULT_MODEL(model_, tokenizer_);
  for (const std::string& t : test::prompt_texts())
    prompts_.push_back(tokenizer_->encode(t, false, false));
  QVERIFY(prompts_.size() >= 16);
  Engine engine(*model_, config("cpu:0"));
  for (const auto& p : prompts_) {
    const RequestId id = engine.submit({p, kMaxTokens});
    const RequestInfo info = engine.wait(id);
    QCOMPARE(info.state, RequestState::kFinished);
    QCOMPARE(static_cast<int32_t>(info.output.size()), kMaxTokens);
    alone_.push_back(info.output);
  }
  expect_all_free(engine);
}

EngineConfig EngineTest::config(std::string devices, std::string prefill,
                                std::string decode) const {
  EngineConfig c;
  c.devices = std::move(devices);
  c.prefill = std::move(prefill);
  c.decode = std::move(decode);
  c.threads = 2;
  c.kv_blocks = 512;
  return c;
}

std::vector<std::vector<TokenId>> EngineTest::run_all(Engine& engine, int32_t max_tokens) {
  std::vector<RequestId> ids;
  for (const auto& p : prompts_) ids.push_back(engine.submit({p, max_tokens}));
  std::vector<std::vector<TokenId>> out;
  for (const RequestId id : ids) {
    const RequestInfo info = engine.wait(id);
    if (info.state != RequestState::kFinished)
      qWarning("request %lld ended %s: %s", static_cast<long long>(id),
               request_state_name(info.state), info.error.c_str());
    out.push_back(info.output);
  }
  return out;
}

void EngineTest::expect_all_free(Engine& engine) {
  engine.wait_idle();
  // Holds on prefill devices are released a moment after the decode side adopts the request.
  QString why;
  QTRY_VERIFY2_WITH_TIMEOUT(no_owned_blocks(engine.snapshot(), why), qPrintable(why), 5000);
}

void EngineTest::identical_greedy_outputs_in_every_mode() {
  struct Mode {
    const char* name;
    EngineConfig config;
  };
  std::vector<Mode> modes = {{"colocated cpu:0", config("cpu:0")},
                             {"colocated cpu:0,cpu:1", config("cpu:0,cpu:1")},
                             {"disaggregated cpu:0 -> cpu:1", config("", "cpu:0", "cpu:1")},
                             {"two partitions of cpu:0", config("", "cpu:0", "cpu:0")}};
  modes.push_back({"colocated, small budget", config("cpu:0")});
  modes.back().config.token_budget = 64;  // long prompts read in several chunks
  for (const Mode& m : modes) {
    Engine engine(*model_, m.config);
    const auto outputs = run_all(engine);
    for (size_t i = 0; i < prompts_.size(); ++i)
      QVERIFY2(outputs[i] == alone_[i], qPrintable(QString("%1: prompt %2 (%3 tokens) differs")
                                                       .arg(m.name)
                                                       .arg(i)
                                                       .arg(prompts_[i].size())));
    expect_all_free(engine);
    const ServingSummary s = engine.summary();
    QCOMPARE(s.completed, static_cast<int64_t>(prompts_.size()));
    // The live series saw every output token (the sliding-window rate is built on it).
    int64_t emitted = 0;
    for (const auto& sample : engine.metrics().emission_snapshot())
      emitted += static_cast<int64_t>(sample.value);
    QCOMPARE(emitted, s.output_tokens);
    if (m.config.disaggregated()) {
      QVERIFY(s.transfer.count >= static_cast<int64_t>(prompts_.size()));
      QVERIFY(s.transfer.bytes > 0);
    }
    // One device's two partitions hand every full prompt block over and copy at most each
    // prompt's partial last block.
    if (m.config.disaggregated() && m.config.prefill == m.config.decode) {
      QVERIFY(s.transfer.handed_over_blocks > 0);
      const HParams& hp = model_->hparams();
      const int64_t block_bytes =
          2 * hp.n_layer * hp.n_kv_head * kDefaultBlockSize * hp.head_dim * 2;  // fp16 K and V
      QVERIFY2(
          s.transfer.bytes <= s.transfer.count * block_bytes,
          qPrintable(
              QString("%1 bytes in %2 transfers").arg(s.transfer.bytes).arg(s.transfer.count)));
    } else {
      QCOMPARE(s.transfer.handed_over_blocks, int64_t{0});
    }
  }
}

void EngineTest::events_stream_every_token_in_order() {
  std::mutex mutex;  // the subscriber's state, made before the engine so that it outlives it
  std::map<RequestId, std::vector<TokenId>> streamed;
  std::map<RequestId, int> final_events;
  std::map<RequestId, std::set<std::string>> devices;
  Engine engine(*model_, config("", "cpu:0", "cpu:1"));
  engine.subscribe([&](const TokenEvent& e) {
    std::lock_guard lock(mutex);
    auto& v = streamed[e.id];
    v.insert(v.end(), e.tokens.begin(), e.tokens.end());
    if (request_ended(e.state)) ++final_events[e.id];
    if (!e.tokens.empty()) devices[e.id].insert(e.device);
  });
  const auto outputs = run_all(engine);
  engine.wait_idle();
  std::lock_guard lock(mutex);
  for (size_t i = 0; i < prompts_.size(); ++i) {
    const RequestId id = static_cast<RequestId>(i + 1);
    QCOMPARE(streamed[id], outputs[i]);
    QCOMPARE(final_events[id], 1);
    // First token from the prefill device, the rest from the decode device.
    QCOMPARE(devices[id], (std::set<std::string>{"cpu:0", "cpu:1"}));
  }
}

void EngineTest::tiny_pool_preempts_and_matches_unconstrained() {
  // 64 requests over the prompts; the pool holds a few requests at a time.
  EngineConfig c = config("cpu:0");
  c.kv_blocks = 48;
  Engine engine(*model_, c);
  std::vector<RequestId> ids;
  for (int i = 0; i < 64; ++i)
    ids.push_back(engine.submit({prompts_[i % prompts_.size()], kMaxTokens}));
  for (int i = 0; i < 64; ++i) {
    const RequestInfo info = engine.wait(ids[i]);
    QCOMPARE(info.state, RequestState::kFinished);
    QVERIFY2(info.output == alone_[i % prompts_.size()], qPrintable(QString("request %1").arg(i)));
  }
  expect_all_free(engine);
  QVERIFY2(engine.summary().preemptions > 0, "the tiny pool never preempted");
}

// Two partitions of one device over one storage, with a pool small enough that both sides evict
// and preempt, and prompts repeated so that both prefix caches hit blocks whose storage the other
// side also maps: every output is still the one of the prompt alone.
void EngineTest::partitions_share_storage_under_pressure() {
  EngineConfig c = config("", "cpu:0", "cpu:0");
  c.kv_blocks = 28;  // the longest prompt needs 25 blocks
  // Every prompt goes to the prefill partition: a repeated prompt whose blocks the decode side
  // has cached by the time it is submitted would otherwise be prefilled there (Router), which
  // depends on timing.
  c.decode_side_prefill_tokens = 0;
  Engine engine(*model_, c);
  std::vector<RequestId> ids;
  for (int i = 0; i < 48; ++i)
    ids.push_back(engine.submit({prompts_[i % prompts_.size()], kMaxTokens}));
  for (int i = 0; i < 48; ++i) {
    const RequestInfo info = engine.wait(ids[i]);
    QVERIFY2(info.state == RequestState::kFinished, info.error.c_str());
    QVERIFY2(info.output == alone_[i % prompts_.size()], qPrintable(QString("request %1").arg(i)));
    QCOMPARE(QString::fromStdString(info.prefill_device), QString("cpu:0/prefill"));
    QCOMPARE(QString::fromStdString(info.decode_device), QString("cpu:0/decode"));
  }
  expect_all_free(engine);
  const ServingSummary s = engine.summary();
  QVERIFY(s.transfer.handed_over_blocks > 0);
  QVERIFY2(s.prefix_hit_rate.value_or(0.0) > 0.0, "no prefix hits");
  QVERIFY2(s.preemptions > 0, "the small pools never preempted");
}

void EngineTest::cancel_in_each_state_frees_everything() {
  EngineConfig c = config("", "cpu:0", "cpu:1");
  Engine engine(*model_, c);
  // Make transfers slow enough to be caught in flight: the fault injector sleeps 20 ms a layer.
  // Layers are copied while the last prefill step computes them, so on a loaded machine the
  // copies can keep pace with a slow prefill, and the last layer's copy can even end before the
  // step hands the request over: it would then be in the transferring state only for a moment.
  // So until a request has been cancelled while transferring, the last layer's copy waits for
  // the hand-over, and a layer copied in that state waits for the poll below to see it (each
  // wait up to 5 s).
  const int32_t last_layer = static_cast<int32_t>(model_->hparams().n_layer) - 1;
  std::atomic<bool> slow{true};
  std::atomic<bool> cancelled_transferring{false};
  engine.set_transfer_fault_injector([&](const KvTransferSpec& spec, int32_t layer) {
    if (!slow) return std::string();
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    const auto handed_over_by = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    while (layer == last_layer && slow && !cancelled_transferring &&
           engine.request(spec.request).state == RequestState::kPrefilling &&
           std::chrono::steady_clock::now() < handed_over_by)
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    const auto hold_until = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    while (slow && !cancelled_transferring &&
           engine.request(spec.request).state == RequestState::kTransferring &&
           std::chrono::steady_clock::now() < hold_until)
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    return std::string();
  });
  std::mutex mutex;
  std::map<RequestState, RequestId> to_cancel;  // state → a request to cancel when seen in it
  std::map<RequestState, bool> cancelled_in;
  // Cancel requests as they are seen in each live state, from the event callback (queued and
  // prefilling are caught by polling below).
  const std::vector<TokenId>& long_prompt = prompts_[13];
  std::vector<RequestId> ids;
  for (int i = 0; i < 8; ++i) ids.push_back(engine.submit({long_prompt, 64}));
  bool seen[kRequestStateCount] = {};
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (std::chrono::steady_clock::now() < deadline) {
    bool all_ended = true;
    for (const RequestId id : ids) {
      const RequestInfo info = engine.request(id);
      if (request_ended(info.state)) continue;
      all_ended = false;
      const auto s = static_cast<size_t>(info.state);
      if (!seen[s] && engine.cancel(id)) {
        seen[s] = true;
        cancelled_in[info.state] = true;
        if (info.state == RequestState::kTransferring) cancelled_transferring = true;
      }
    }
    if (all_ended) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  slow = false;
  for (const RequestId id : ids) {
    const RequestInfo info = engine.wait(id);
    QVERIFY(info.state == RequestState::kFinished || info.state == RequestState::kCancelled);
  }
  for (RequestState s : {RequestState::kQueued, RequestState::kPrefilling,
                         RequestState::kTransferring, RequestState::kDecoding})
    QVERIFY2(cancelled_in[s],
             qPrintable(QString("no request was cancelled while %1").arg(request_state_name(s))));
  QVERIFY(!engine.cancel(ids.front()));  // already ended
  expect_all_free(engine);
  // The engine keeps serving.
  const RequestInfo after = engine.wait(engine.submit({prompts_[0], kMaxTokens}));
  QCOMPARE(after.output, alone_[0]);
  expect_all_free(engine);
}

void EngineTest::injected_transfer_failure_fails_only_its_request() {
  Engine engine(*model_, config("", "cpu:0", "cpu:1"));
  const RequestId doomed_id = 3;  // ids count from 1 in submission order
  engine.set_transfer_fault_injector([&](const KvTransferSpec& spec, int32_t layer) {
    return spec.request == doomed_id && layer == 2 ? std::string("injected fault") : std::string();
  });
  const auto outputs = run_all(engine);
  for (size_t i = 0; i < prompts_.size(); ++i) {
    const RequestInfo info = engine.request(static_cast<RequestId>(i + 1));
    if (info.id == doomed_id) {
      QCOMPARE(info.state, RequestState::kFailed);
      QVERIFY2(info.error.find("injected fault") != std::string::npos, info.error.c_str());
      QVERIFY2(info.error.find("request 3") != std::string::npos, info.error.c_str());
    } else {
      QCOMPARE(info.state, RequestState::kFinished);
      QCOMPARE(outputs[i], alone_[i]);
    }
  }
  expect_all_free(engine);
  const ServingSummary s = engine.summary();
  QCOMPARE(s.failed, int64_t{1});
  QCOMPARE(s.completed, static_cast<int64_t>(prompts_.size()) - 1);
}

// A step whose pass throws (as a CUDA call does after a device fault; injected here) ends every
// request its worker owns as failed, naming the device and the error, and gives back their blocks,
// holds and transfers; the process and the other workers go on, and once the fault is gone the
// same engine serves every prompt with its usual output. Colocated, and disaggregated with the
// fault on the prefill and then on the decode device.
void EngineTest::failed_step_fails_its_workers_requests_and_the_engine_goes_on() {
  struct Case {
    const char* devices;
    const char* prefill;
    const char* decode;
    const char* faulty;
  };
  for (const Case& c : {Case{"cpu:0", "", "", "cpu:0"}, Case{"", "cpu:0", "cpu:1", "cpu:0"},
                        Case{"", "cpu:0", "cpu:1", "cpu:1"}}) {
    Engine engine(*model_, config(c.devices, c.prefill, c.decode));
    std::atomic<bool> armed{true};
    std::atomic<int> injected{0};
    // The faulty device's first step fails (a later one might never come: the prefill device can
    // read every prompt in one or two steps).
    engine.set_step_fault_injector([&](const std::string& device, int64_t) {
      if (!armed || device != c.faulty) return std::string();
      armed = false;  // one fault: the steps after it run
      ++injected;
      return std::string("injected device fault");
    });
    const auto first = run_all(engine);
    QCOMPARE(injected.load(), 1);
    int failed = 0;
    for (size_t i = 0; i < prompts_.size(); ++i) {
      const RequestInfo info = engine.request(static_cast<RequestId>(i + 1));
      if (info.state == RequestState::kFailed) {
        ++failed;
        const std::string expected = std::string("a step on ") + c.faulty + " failed";
        QVERIFY2(info.error.find(expected) != std::string::npos, info.error.c_str());
        QVERIFY2(info.error.find("injected device fault") != std::string::npos, info.error.c_str());
      } else {
        QCOMPARE(info.state, RequestState::kFinished);
        QCOMPARE(first[i], alone_[i]);
      }
    }
    QVERIFY2(failed > 0, c.faulty);
    expect_all_free(engine);
    QCOMPARE(engine.summary().failed, static_cast<int64_t>(failed));
    // The fault is gone: the same engine serves every prompt as before.
    QCOMPARE(run_all(engine), alone_);
    expect_all_free(engine);
  }
}

// Disaggregated: the prefill worker hands a request to its decode worker before the step that
// computes the prompt's last chunk, and the transfer copies each layer once that step has written
// it. So some layer is copied while the request is still prefilling, the transfer's stats count
// layers copied before the producer finished and the time it waited for them, and the output
// equals a colocated run's.
void EngineTest::transfer_streams_layers_during_the_last_prefill_step() {
  std::vector<TokenId> prompt;  // about a thousand tokens: a prefill step of a second or so
  while (prompt.size() < 1000)
    for (const auto& p : prompts_) prompt.insert(prompt.end(), p.begin(), p.end());
  EngineConfig c = config("", "cpu:0", "cpu:1");
  c.token_budget = 2048;  // the whole prompt in one step
  Engine engine(*model_, c);
  std::atomic<int> layers_while_prefilling{0};
  engine.set_transfer_fault_injector([&](const KvTransferSpec& spec, int32_t) {
    if (engine.request(spec.request).state == RequestState::kPrefilling) ++layers_while_prefilling;
    return std::string();
  });
  const RequestInfo info = engine.wait(engine.submit({prompt, kMaxTokens}));
  QCOMPARE(info.state, RequestState::kFinished);
  QCOMPARE(info.decode_device, std::string("cpu:1"));
  QVERIFY2(layers_while_prefilling.load() > 0, "no layer was copied during the prefill step");
  const std::vector<KvTransferStats> transfers = engine.snapshot().transfers;
  QCOMPARE(transfers.size(), size_t{1});
  const KvTransferStats& t = transfers[0];
  QCOMPARE(t.state, TransferState::kDone);
  QCOMPARE(t.layers_done, static_cast<int32_t>(model_->hparams().n_layer));
  QVERIFY2(t.layers_overlapped > 0 && t.layers_overlapped < t.layers_done,
           qPrintable(QString("%1 layers overlapped").arg(t.layers_overlapped)));
  QVERIFY(t.waited_s > 0.0 && t.waited_s < t.seconds());
  Engine colocated(*model_, config("cpu:0"));
  QCOMPARE(info.output, colocated.wait(colocated.submit({prompt, kMaxTokens})).output);
  expect_all_free(engine);
}

// A streamed request that ends at its first token (here every token ends generation) ends on its
// prefill device; its decode device, which had reserved blocks and started the transfer, gives
// everything back and never decodes it.
void EngineTest::request_ended_at_its_first_token_leaves_nothing_on_the_decode_device() {
  Engine engine(*model_, config("", "cpu:0", "cpu:1"), [](TokenId) { return true; });
  const auto outputs = run_all(engine);
  for (size_t i = 0; i < prompts_.size(); ++i) {
    const RequestInfo info = engine.request(static_cast<RequestId>(i + 1));
    QCOMPARE(info.state, RequestState::kFinished);
    QCOMPARE(outputs[i].size(), size_t{1});
    QCOMPARE(outputs[i][0], alone_[i][0]);
    QCOMPARE(info.prefill_device, std::string("cpu:0"));
    QVERIFY2(info.decode_device.empty(), info.decode_device.c_str());
  }
  expect_all_free(engine);
  const EngineSnapshot snap = engine.snapshot();
  QCOMPARE(snap.devices[1].steps, int64_t{0});
  QCOMPARE(snap.devices[1].receiving, 0);
}

void EngineTest::follow_up_turn_prefills_only_new_tokens_on_the_decode_device() {
  Engine engine(*model_, config("", "cpu:0", "cpu:1"));
  std::vector<TokenId> turn = prompts_[13];  // long enough to fill blocks
  const RequestInfo first = engine.wait(engine.submit({turn, 24}));
  QCOMPARE(first.prefill_device, std::string("cpu:0"));
  QCOMPARE(first.decode_device, std::string("cpu:1"));
  expect_all_free(engine);
  // The follow-up: the first turn, its answer and a few new tokens.
  turn.insert(turn.end(), first.output.begin(), first.output.end());
  const std::vector<TokenId> more = tokenizer_->encode(" And then?", false, false);
  turn.insert(turn.end(), more.begin(), more.end());
  const int64_t hits_before = engine.snapshot().devices[1].kv.prefix.hit_tokens;
  const RequestInfo second = engine.wait(engine.submit({turn, 8}));
  QCOMPARE(second.state, RequestState::kFinished);
  QCOMPARE(second.prefill_device, std::string("cpu:1"));
  QCOMPARE(second.decode_device, std::string("cpu:1"));
  QVERIFY(!second.entered[static_cast<size_t>(RequestState::kTransferring)]);
  const int64_t hits = engine.snapshot().devices[1].kv.prefix.hit_tokens - hits_before;
  const int64_t bs = engine.config().block_size;
  // Every full block of the first turn and its answer (but the last, written while decoding) hits.
  QVERIFY2(hits >= (static_cast<int64_t>(turn.size() - more.size()) / bs - 1) * bs,
           qPrintable(QString("only %1 prompt tokens came from the cache").arg(hits)));
  // The same answer as a fresh engine computing everything.
  Engine fresh(*model_, config("cpu:0"));
  QCOMPARE(second.output, fresh.wait(fresh.submit({turn, 8})).output);
  expect_all_free(engine);
}

void EngineTest::long_prompts_use_their_own_prefill_pool() {
  EngineConfig c = config("", "cpu:0", "cpu:2");
  c.long_prefill = "cpu:1";
  c.long_prompt_tokens = 100;
  c.threads = 3;
  Engine engine(*model_, c);
  const auto outputs = run_all(engine);
  for (size_t i = 0; i < prompts_.size(); ++i) {
    const RequestInfo info = engine.request(static_cast<RequestId>(i + 1));
    QCOMPARE(info.prefill_device, std::string(prompts_[i].size() > 100 ? "cpu:1" : "cpu:0"));
    QCOMPARE(info.decode_device, std::string("cpu:2"));
    QCOMPARE(outputs[i], alone_[i]);
  }
  expect_all_free(engine);
}

void EngineTest::lifecycle_timestamps_are_ordered() {
  Engine engine(*model_, config("", "cpu:0", "cpu:1"));
  const RequestInfo info = engine.wait(engine.submit({prompts_[1], kMaxTokens}));
  std::optional<MetricsTime> previous;
  for (RequestState s :
       {RequestState::kQueued, RequestState::kPrefilling, RequestState::kTransferring,
        RequestState::kDecoding, RequestState::kFinished}) {
    const auto& t = info.entered[static_cast<size_t>(s)];
    QVERIFY2(t.has_value(), request_state_name(s));
    if (previous) QVERIFY2(*previous <= *t, request_state_name(s));
    previous = t;
  }
  QVERIFY(info.metrics.has_value());
  QCOMPARE(info.metrics->output_tokens, int64_t{kMaxTokens});
  QCOMPARE(info.metrics->itl_s.size(), size_t{kMaxTokens - 1});
  QVERIFY(*info.metrics->ttft_s > 0.0);
}

// The live output rate of a run that follows idle time counts from the run's first request:
// its span is at most the time since that submit, and it holds every token the run emitted.
void EngineTest::output_rate_leaves_out_idle_time_before_a_run() {
  Engine engine(*model_, config("cpu:0"));
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // idle
  QCOMPARE(engine.snapshot().output_rate.events, int64_t{0});
  const MetricsTime before_submit = MetricsClock::now();
  engine.wait(engine.submit({prompts_[1], kMaxTokens}));
  const EngineSnapshot snap = engine.snapshot();
  const double since_submit = std::chrono::duration<double>(snap.time - before_submit).count();
  QVERIFY2(snap.output_rate.span_s <= since_submit,
           qPrintable(QString("span %1 s, %2 s since the submit")
                          .arg(snap.output_rate.span_s)
                          .arg(since_submit)));
  QCOMPARE(snap.output_rate.sum, static_cast<double>(kMaxTokens));
  QVERIFY(snap.output_rate.per_second > 0.0);
}

// The devices an evaluation or a run records: the colocated list, the two pools, and the fused
// decode layers where a GPU would run them (not for CPU devices, where the option does nothing).
void EngineTest::devices_text_names_the_devices_and_how_gpus_decode() {
  EngineConfig c;
  c.devices = "cpu:0,cpu:1";
  QCOMPARE(c.devices_text(), std::string("cpu:0,cpu:1"));
  c.fused_layers = true;
  QCOMPARE(c.devices_text(), std::string("cpu:0,cpu:1"));
  c.devices = "cuda:0";
  QCOMPARE(c.devices_text(), std::string("cuda:0, fused decode layers"));
  c.fused_tensor_cores = true;
  QCOMPARE(c.devices_text(), std::string("cuda:0, fused decode layers on tensor cores"));
  c.fused_tensor_cores = false;
  c.fused_layers = false;
  QCOMPARE(c.devices_text(), std::string("cuda:0"));
  c.prefill = "cpu:0";
  c.decode = "cuda:0";
  c.long_prefill = "cpu:1";
  QCOMPARE(c.devices_text(), std::string("prefill cpu:0, decode cuda:0, long prefill cpu:1"));
  c.fused_layers = true;
  QCOMPARE(c.devices_text(),
           std::string("prefill cpu:0, decode cuda:0, long prefill cpu:1, fused decode layers"));
}

void EngineTest::bad_requests_and_configurations_throw() {
  Engine engine(*model_, config("cpu:0"));
  QVERIFY_THROWS_EXCEPTION(Error, engine.submit({{}, 4}));
  QVERIFY_THROWS_EXCEPTION(Error, engine.submit({{1, 2, 1 << 30}, 4}));
  QVERIFY_THROWS_EXCEPTION(Error, engine.submit({{1, 2}, 0}));
  QVERIFY_THROWS_EXCEPTION(Error, engine.submit({std::vector<TokenId>(100, 5), 1 << 20}));
  QVERIFY_THROWS_EXCEPTION(Error, engine.request(12345));
  auto throws = [&](EngineConfig c) {
    try {
      Engine e(*model_, c);
    } catch (const Error& e) {
      qInfo("%s", e.what());
      return true;
    }
    return false;
  };
  QVERIFY(throws(config("", "cpu:0", "")));
  QVERIFY(throws(config("", "cpu:0", "cpu:0,cpu:0")));  // listed twice
  EngineConfig overlap = config("", "cpu:0", "cpu:1");  // two prefill roles for cpu:0
  overlap.long_prefill = "cpu:0";
  overlap.long_prompt_tokens = 64;
  QVERIFY(throws(overlap));
  QVERIFY(throws(config("gpu:0")));
  QVERIFY(throws(config("cpu:0,cpu:0")));
  QVERIFY(throws(config("cpu:0,cpu:1,cpu:2")));  // 2 threads for 3 devices
  EngineConfig bad_connector = config("", "cpu:0", "cpu:1");
  bad_connector.connector = "carrier-pigeon";
  QVERIFY(throws(bad_connector));
  // A prompt larger than the pool fails alone; the engine keeps serving.
  EngineConfig small = config("", "cpu:0", "cpu:1");
  small.kv_blocks = 4;
  Engine tiny(*model_, small);
  const RequestInfo too_big = tiny.wait(tiny.submit({prompts_[13], 4}));
  QCOMPARE(too_big.state, RequestState::kFailed);
  QVERIFY2(too_big.error.find("blocks") != std::string::npos, too_big.error.c_str());
  QCOMPARE(tiny.wait(tiny.submit({prompts_[0], kMaxTokens})).output, alone_[0]);
  expect_all_free(tiny);
}

QTEST_GUILESS_MAIN(EngineTest)
#include "test_engine.moc"
