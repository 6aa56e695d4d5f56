// The engine under load on the real model: 1,000 greedy requests submitted at once to an engine
// whose KV pool holds about 20 of them, colocated and disaggregated. Every request finishes (many
// after being preempted), each output equals the unconstrained output of its prompt, every device
// ends with no owned block (blocks kept in the prefix cache are free to evict and allowed), the
// process's resident memory after a second run of the workload is within 5 % of what it was after
// the first (the first run brings the allocator's arenas to their steady state), and once the
// engine is gone the heap in use is back where it was before it (within 1 MiB).
//
// "Unconstrained" is one engine whose pool never runs short (no preemption, checked), with the
// same greedy sampling. Its outputs are comparable to the small pool's because a row's result
// depends only on its own tokens (paged_attention.h): the CPU kernels are batch-invariant, which
// this suite checks again on a sample of prompts run one at a time.

#include <malloc.h>
#include <unistd.h>

#include <QtTest>
#include <chrono>
#include <cstdint>
#include <fstream>
#include <memory>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "core/model/llama_model.h"
#include "core/serving/engine.h"
#include "core/tokenizer/tokenizer.h"
#include "tests/common/default_model.h"

using namespace tokenfab;

namespace {

constexpr int kRequests = 1000;
constexpr int32_t kMinPrompt = 8, kMaxPrompt = 24;  // prompt tokens
constexpr int32_t kMaxTokens = 16;                  // output tokens (no end-of-generation stop)
constexpr int32_t kBlockSize = 16;
// A request holds at most ceil((24 + 16) / 16) = 3 blocks: 60 blocks hold about 20 requests, so
// most of the 64 the scheduler may run at once are preempted as their sequences grow.
constexpr int32_t kSmallPoolBlocks = 60;
// Enough for max_running (64) requests of 3 blocks each: the unconstrained run never preempts.
constexpr int32_t kLargePoolBlocks = 256;
constexpr int kAloneSample = 24;  // prompts also run one at a time (batch invariance)
constexpr double kRssTolerance = 0.05;
// Under a sanitizer the allocator is the sanitizer's (ASan keeps freed memory in quarantine):
// memory is not compared there, and LeakSanitizer looks for leaks instead (tools/sanitize.sh).
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
constexpr bool kCompareMemory = false;
#else
constexpr bool kCompareMemory = true;
#endif
// With the engine gone, the heap in use may have grown by at most this much: less than 512 bytes
// for each of its 2,000 requests.
constexpr int64_t kHeapLeftAfterEngine = 1 << 20;

// Words for the prompts; written for this suite.
const char* const kWords[] = {
    "the",    "a",       "river",   "mountain", "city",    "engine",  "quietly", "under",
    "green",  "bright",  "old",     "new",      "teacher", "student", "wrote",   "carried",
    "into",   "across",  "because", "while",    "seven",   "twelve",  "morning", "evening",
    "coffee", "bread",   "library", "market",   "north",   "south",   "bridge",  "window",
    "opened", "closed",  "found",   "lost",     "music",   "number",  "garden",  "storm",
    "slowly", "quickly", "paper",   "stone",    "light",   "shadow",  "ship",    "harbor",
    "why",    "how",     "when",    "where",    "and",     "but",     "never",   "always",
    "red",    "blue",    "winter",  "summer",   "clock",   "table",   "letter",  "answer",
};

// Resident set size of this process, bytes (/proc/self/statm: pages).
int64_t resident_bytes() {
  std::ifstream statm("/proc/self/statm");
  int64_t size_pages = 0, resident_pages = 0;
  statm >> size_pages >> resident_pages;
  return resident_pages * sysconf(_SC_PAGESIZE);
}

// Bytes the allocator has handed out and not had back, over all arenas, mmapped chunks included.
int64_t heap_in_use_bytes() {
  const struct mallinfo2 m = mallinfo2();
  return static_cast<int64_t>(m.uordblks + m.hblkhd);
}

double mib(int64_t bytes) { return static_cast<double>(bytes) / (1024.0 * 1024.0); }

struct LoadRun {
  std::vector<RequestInfo> infos;  // in submission order
  int64_t preemptions = 0;         // this run's, from the engine's counter
  double seconds = 0.0;
};

}  // namespace

class EngineLoadTest : public QObject {
  Q_OBJECT

 private slots:
  void initTestCase();
  void colocated_small_pool_serves_a_thousand_requests();
  void disaggregated_small_pools_serve_a_thousand_requests();

 private:
  EngineConfig config(std::string devices, std::string prefill = "", std::string decode = "",
                      int32_t kv_blocks = kSmallPoolBlocks) const;
  LoadRun run_load(Engine& engine);
  // Every request finished with its unconstrained output; no device owns a block.
  void check_run(Engine& engine, const LoadRun& run, const char* what);
  // A warm-up run, then the measured run: both checked, and resident memory compared.
  void serve_twice(const EngineConfig& config, const char* mode);

  std::unique_ptr<LlamaModel> model_;
  std::optional<Tokenizer> tokenizer_;
  std::vector<std::vector<TokenId>> prompts_;
  std::vector<std::vector<TokenId>> unconstrained_;  // per prompt
};

void EngineLoadTest::initTestCase() {
  TOKENFAB_LOAD_DEFAULT_MODEL(model_, tokenizer_);
  // Distinct prompts of 8–24 tokens from random words (fixed seed; mt19937's raw output is the
  // same everywhere, unlike the standard distributions).
  std::mt19937 rng(20240611);
  constexpr size_t n_words = sizeof(kWords) / sizeof(kWords[0]);
  std::set<std::vector<TokenId>> seen;
  while (static_cast<int>(prompts_.size()) < kRequests) {
    const int32_t length = kMinPrompt + static_cast<int32_t>(rng() % (kMaxPrompt - kMinPrompt + 1));
    std::string text = "Story:";
    std::vector<TokenId> tokens;
    while (static_cast<int32_t>(tokens.size()) < length) {
      text += " ";
      text += kWords[rng() % n_words];
      tokens = tokenizer_->encode(text, false, false);
    }
    tokens.resize(length);
    if (seen.insert(tokens).second) prompts_.push_back(std::move(tokens));
  }

  // Unconstrained: a pool that never runs short.
  Engine engine(*model_, config("cpu:0", "", "", kLargePoolBlocks));
  const LoadRun run = run_load(engine);
  QCOMPARE(run.preemptions, int64_t{0});
  for (const RequestInfo& info : run.infos) {
    QVERIFY2(info.state == RequestState::kFinished, info.error.c_str());
    QCOMPARE(static_cast<int32_t>(info.output.size()), kMaxTokens);
    unconstrained_.push_back(info.output);
  }
  qInfo("unconstrained: %d requests in %.1f s", kRequests, run.seconds);

  // Batch invariance: a sample of prompts, each alone in the engine, gives the batched outputs.
  for (int i = 0; i < kAloneSample; ++i) {
    const size_t p = static_cast<size_t>(i) * (kRequests / kAloneSample);
    const RequestInfo info = engine.wait(engine.submit({prompts_[p], kMaxTokens}));
    QCOMPARE(info.state, RequestState::kFinished);
    QVERIFY2(info.output == unconstrained_[p],
             qPrintable(QString("prompt %1 alone differs from its batched output").arg(p)));
  }
}

EngineConfig EngineLoadTest::config(std::string devices, std::string prefill, std::string decode,
                                    int32_t kv_blocks) const {
  EngineConfig c;
  c.devices = std::move(devices);
  c.prefill = std::move(prefill);
  c.decode = std::move(decode);
  c.threads = 2;
  c.kv_blocks = kv_blocks;
  c.block_size = kBlockSize;
  // Colocated, a step target makes the scheduler admit only as many prompt tokens per step as keep
  // the step short, and so few requests run at once that the small pool never runs short: without
  // it, a burst is admitted as far as max_running and the pool allow, and decodes preempt.
  c.step_target_ms = 0.0;
  return c;
}

LoadRun EngineLoadTest::run_load(Engine& engine) {
  LoadRun run;
  const int64_t preemptions_before = engine.summary().preemptions;
  const auto start = std::chrono::steady_clock::now();
  std::vector<RequestId> ids;
  ids.reserve(prompts_.size());
  for (const auto& p : prompts_) ids.push_back(engine.submit({p, kMaxTokens}));
  for (const RequestId id : ids) run.infos.push_back(engine.wait(id));
  run.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  run.preemptions = engine.summary().preemptions - preemptions_before;
  return run;
}

void EngineLoadTest::check_run(Engine& engine, const LoadRun& run, const char* what) {
  QCOMPARE(run.infos.size(), prompts_.size());
  int32_t preempted_requests = 0;
  for (size_t i = 0; i < run.infos.size(); ++i) {
    const RequestInfo& info = run.infos[i];
    QVERIFY2(info.state == RequestState::kFinished,
             qPrintable(QString("%1: request %2 ended %3: %4")
                            .arg(what)
                            .arg(i)
                            .arg(request_state_name(info.state))
                            .arg(QString::fromStdString(info.error))));
    QVERIFY2(info.output == unconstrained_[i],
             qPrintable(QString("%1: request %2 (%3 prompt tokens, %4 preemptions) differs from "
                                "its unconstrained output")
                            .arg(what)
                            .arg(i)
                            .arg(prompts_[i].size())
                            .arg(info.preemptions)));
    if (info.preemptions > 0) ++preempted_requests;
  }
  engine.wait_idle();
  // Holds on prefill devices are released a moment after the decode side adopts the request.
  const auto owned = [&engine](QString& why) {
    for (const DeviceSnapshot& d : engine.snapshot().devices)
      if (d.kv.n_owned != 0 || d.running != 0 || d.waiting != 0 || d.receiving != 0) {
        why = QString("%1: %2 owned blocks, %3 running, %4 waiting, %5 receiving")
                  .arg(QString::fromStdString(d.name))
                  .arg(d.kv.n_owned)
                  .arg(d.running)
                  .arg(d.waiting)
                  .arg(d.receiving);
        return true;
      }
    return false;
  };
  QString why;
  QTRY_VERIFY2_WITH_TIMEOUT(!owned(why), qPrintable(why), 5000);
  QString pools;
  for (const DeviceSnapshot& d : engine.snapshot().devices)
    pools += QString(" %1: %2 free + %3 cached of %4;")
                 .arg(QString::fromStdString(d.name))
                 .arg(d.kv.n_free)
                 .arg(d.kv.n_cached)
                 .arg(d.kv.n_blocks);
  qInfo("%s: %d requests in %.1f s, %lld preemptions (%d requests preempted);%s", what, kRequests,
        run.seconds, static_cast<long long>(run.preemptions), preempted_requests,
        qPrintable(pools));
  QVERIFY2(run.preemptions > 0, "the small pool never preempted");
}

void EngineLoadTest::serve_twice(const EngineConfig& config, const char* mode) {
  // glibc keeps freed memory in its arenas (the main heap and one per thread that allocated) and
  // returns it to the system only when trimmed: untrimmed, the resident size counts whatever
  // earlier work happened to free (7–14 MiB after a warm-up run). After malloc_trim(0) it is
  // what the process holds, but for pages that a few live chunks keep resident in a heap.
  malloc_trim(0);
  const int64_t rss_start = resident_bytes(), heap_start = heap_in_use_bytes();
  std::optional<Engine> engine(std::in_place, *model_, config);
  check_run(*engine, run_load(*engine), qPrintable(QString("%1, warm-up").arg(mode)));
  if (QTest::currentTestFailed()) return;
  const int64_t rss_steady_untrimmed = resident_bytes();
  malloc_trim(0);
  const int64_t rss_steady = resident_bytes(), heap_steady = heap_in_use_bytes();

  // The runs' RequestInfo copies are gone by now; the engine keeps its own for request().
  check_run(*engine, run_load(*engine), qPrintable(QString("%1, measured").arg(mode)));
  if (QTest::currentTestFailed()) return;
  const int64_t rss_after_untrimmed = resident_bytes();
  malloc_trim(0);
  const int64_t rss_after = resident_bytes(), heap_after = heap_in_use_bytes();
  engine.reset();
  malloc_trim(0);
  const int64_t rss_end = resident_bytes(), heap_end = heap_in_use_bytes();
  qInfo("%s: RSS MiB: %.1f before the engine; %.1f after the warm-up (%.1f untrimmed); %.1f after "
        "the measured run (%.1f untrimmed); %.1f once the engine is gone",
        mode, mib(rss_start), mib(rss_steady), mib(rss_steady_untrimmed), mib(rss_after),
        mib(rss_after_untrimmed), mib(rss_end));
  qInfo("%s: heap in use MiB: %.2f before the engine; %.2f after the warm-up; %.2f after the "
        "measured run; %.2f once the engine is gone",
        mode, mib(heap_start), mib(heap_steady), mib(heap_after), mib(heap_end));
  if (!kCompareMemory) return;
  QVERIFY2(static_cast<double>(rss_after) <= static_cast<double>(rss_steady) * (1.0 + kRssTolerance),
           qPrintable(QString("%1: resident memory grew from %2 to %3 MiB over the measured run")
                          .arg(mode)
                          .arg(mib(rss_steady))
                          .arg(mib(rss_after))));
  // With the engine gone, nothing of its requests is left. (Its resident size is no measure: the
  // arenas its threads used keep a few MiB of pages resident however little they hold.)
  QVERIFY2(heap_end - heap_start <= kHeapLeftAfterEngine,
           qPrintable(QString("%1: the heap in use grew from %2 to %3 MiB with the engine gone")
                          .arg(mode)
                          .arg(mib(heap_start))
                          .arg(mib(heap_end))));
}

void EngineLoadTest::colocated_small_pool_serves_a_thousand_requests() {
  serve_twice(config("cpu:0"), "colocated cpu:0");
}

void EngineLoadTest::disaggregated_small_pools_serve_a_thousand_requests() {
  serve_twice(config("", "cpu:0", "cpu:1"), "disaggregated cpu:0 -> cpu:1");
}

QTEST_GUILESS_MAIN(EngineLoadTest)
#include "test_engine_load.moc"
