// The Live and KV inspector pages on a real disaggregated run (prefill cpu:0 → decode cpu:1, the
// embedded default model), fed snapshots and token events directly — no bridge: the KV map's
// used cells equal the snapshot's owned + cached blocks on every device, the HUD's token count
// equals the tokens generated, chart series have points, the transfer log has the run's
// transfers, block tokens shown are the sequence's real tokens at those positions, CSV / PNG
// exports write files. The BlockMap on a synthetic 100k-block snapshot rebuilds its image once
// per snapshot, not once per paint (the responsiveness property; no timing is asserted).

#include <QImage>
#include <QTemporaryDir>
#include <QtTest>
#include <algorithm>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <optional>

#include "core/model/llama_model.h"
#include "core/model/model_files.h"
#include "core/serving/engine.h"
#include "core/tokenizer/tokenizer.h"
#include "tests/common/default_model.h"
#include "ui/views/kv_block_tokens.h"
#include "ui/views/kv_page.h"
#include "ui/views/live_page.h"
#include "ui/widgets/block_map.h"

using namespace tokenfab;
using namespace tokenfab::ui;

namespace {

constexpr int32_t kMaxTokens = 40;

const char* const kPrompts[] = {
    "The capital of France is",
    "Once upon a time, in a small village by the sea, there lived an old fisherman who",
    "def fibonacci(n):\n    if n < 2:\n        return n\n    return",
    "Here is a long note about rivers. Rivers carry water from the hills to the sea, shaping "
    "valleys and feeding towns. Rivers carry water from the hills to the sea. In short, rivers",
};

StreamUpdate to_update(const TokenEvent& e) {
  StreamUpdate u;
  u.id = e.id;
  u.tokens = e.tokens;
  u.drafted = e.drafted;
  u.state = e.state;
  u.device = QString::fromStdString(e.device);
  u.error = QString::fromStdString(e.error);
  return u;
}

KvSnapshot synthetic_snapshot(int32_t n_blocks) {
  KvSnapshot kv;
  kv.block_size = 16;
  kv.n_blocks = n_blocks;
  kv.blocks.resize(static_cast<size_t>(n_blocks));
  for (int32_t b = 0; b < n_blocks; ++b) {
    BlockRecord& r = kv.blocks[static_cast<size_t>(b)];
    switch (b % 3) {
      case 0:
        ++kv.n_free;
        break;
      case 1:
        r.state = BlockState::kOwned;
        r.owners = {b / 48 + 1};
        if (b % 7 == 1) r.owners.push_back(b / 48 + 2);
        r.ref_count = static_cast<int32_t>(r.owners.size());
        r.n_tokens = 16;
        ++kv.n_owned;
        break;
      case 2:
        r.state = BlockState::kCached;
        r.n_tokens = 16;
        r.has_hash = true;
        r.hash = 0x9e3779b97f4a7c15ull * static_cast<uint64_t>(b);
        ++kv.n_cached;
        break;
    }
  }
  return kv;
}

}  // namespace

class GuiLiveKvTest : public QObject {
  Q_OBJECT

 private slots:
  void initTestCase();
  void pages_show_what_a_disaggregated_run_reported();
  void block_map_paints_100k_blocks_from_one_image_per_snapshot();
  void pause_keeps_the_window_and_reset_empties_it();
  void bars_show_accept_lengths_and_position_acceptance();

 private:
  std::unique_ptr<LlamaModel> model_;
  std::optional<Tokenizer> tokenizer_;
};

void GuiLiveKvTest::initTestCase() {
  TOKENFAB_LOAD_DEFAULT_MODEL(model_, tokenizer_);
}

void GuiLiveKvTest::pages_show_what_a_disaggregated_run_reported() {
  EngineConfig config;
  config.devices = "";
  config.prefill = "cpu:0";
  config.decode = "cpu:1";
  config.threads = 2;
  config.kv_blocks = 256;
  std::mutex mutex;
  std::vector<TokenEvent> events;  // guarded by mutex; drained on this (the GUI) thread
  Engine engine(*model_, config);  // after its subscriber's state, so that it goes first
  engine.subscribe([&](const TokenEvent& e) {
    std::lock_guard lock(mutex);
    events.push_back(e);
  });

  LivePage live;
  KvPage kv;
  kv.set_tokenizer(&*tokenizer_);
  live.resize(1200, 900);
  kv.resize(1200, 900);

  std::map<RequestId, std::vector<TokenId>> prompts;
  for (const char* text : kPrompts) {
    GenerationRequest request;
    request.prompt = tokenizer_->encode(text, false, false);
    request.max_tokens = kMaxTokens;
    const std::vector<TokenId> prompt = request.prompt;
    prompts[engine.submit(std::move(request))] = prompt;
  }

  // Block tokens the inspector derived while requests were live: checked against the real
  // sequences once they are complete.
  std::vector<BlockTokens> derived;
  std::vector<bool> ttft_seen;  // per snapshot fed: whether it had a TTFT p50
  int snapshots = 0;
  auto feed = [&](const SnapshotPtr& snapshot) {
    std::vector<TokenEvent> drained;
    {
      std::lock_guard lock(mutex);
      drained.swap(events);
    }
    QVector<StreamUpdate> updates;
    for (const TokenEvent& e : drained) updates.push_back(to_update(e));
    live.on_streamed(updates);
    live.on_snapshot(snapshot);
    ttft_seen.push_back(snapshot->summary.ttft_ms.p50.has_value());
    kv.on_snapshot(snapshot);
    ++snapshots;
    for (const DeviceSnapshot& d : snapshot->devices) {
      QVERIFY(kv.select_device(QString::fromStdString(d.name)));
      QCOMPARE(kv.block_map()->cells(), d.kv.n_blocks);
      QCOMPARE(kv.block_map()->used_cells(), d.kv.n_owned + d.kv.n_cached);
      for (BlockId b = 0; b < d.kv.n_blocks; ++b) {
        BlockTokens found = block_tokens(d.kv, b, snapshot->requests);
        if (!found.tokens.empty()) derived.push_back(std::move(found));
      }
    }
  };

  for (;;) {
    const auto snapshot = std::make_shared<const EngineSnapshot>(engine.snapshot());
    feed(snapshot);
    if (QTest::currentTestFailed()) return;
    if (snapshot->requests.empty()) break;
    QTest::qWait(20);
  }
  engine.wait_idle();
  const auto last = std::make_shared<const EngineSnapshot>(engine.snapshot());
  feed(last);
  if (QTest::currentTestFailed()) return;

  // HUD: every token generated was counted once.
  int64_t generated = 0;
  std::map<RequestId, std::vector<TokenId>> sequences;  // prompt + output
  for (const auto& [id, prompt] : prompts) {
    const RequestInfo info = engine.request(id);
    QCOMPARE(info.state, RequestState::kFinished);
    generated += static_cast<int64_t>(info.output.size());
    sequences[id] = prompt;
    sequences[id].insert(sequences[id].end(), info.output.begin(), info.output.end());
  }
  QCOMPARE(live.tokens_seen(), generated);
  QCOMPARE(live.hud_text("TOKENS"), QString::number(generated));

  // Charts: one point per snapshot fed (the window keeps the last 600); a KV series per device.
  const int window = std::min(snapshots, static_cast<int>(LivePage::kMaxSamples));
  QVERIFY(window > 1);
  QCOMPARE(live.points("decode_tps"), window);
  QCOMPARE(live.points("kv:cpu:0"), window);
  QCOMPARE(live.points("kv:cpu:1"), window);
  QCOMPARE(
      live.points("ttft_p50"), window - [&] {  // a point once a request has completed
        int before_first = 0;
        for (const auto& snapshot_ttft : ttft_seen) before_first += snapshot_ttft ? 0 : 1;
        return before_first;
      }());
  QCOMPARE(live.points("no such series"), -1);
  // The KV inspector's usage over time: one point per snapshot fed, for the device it shows.
  QCOMPARE(kv.usage_points(), std::min(snapshots, static_cast<int>(KvPage::kUsagePoints)));
  // Per-request lines: requests seen decoding in a snapshot have one (the newest kept).
  int request_lines = 0;
  for (const auto& [id, prompt] : prompts)
    if (live.points(QStringLiteral("req:%1").arg(id)) > 0) ++request_lines;
  QVERIFY(request_lines > 0 && request_lines <= LivePage::kMaxRequestSeries);
  // Without a draft head every step emits one token: the accept-length histogram is one bar at
  // 100 %, and no draft position was proposed.
  QCOMPARE(live.bars("accept_length"), (QList<qreal>{100.0}));
  QVERIFY(live.bars("position_acceptance").isEmpty());
  // Nor any verifying step: no draft or verify time to chart.
  QCOMPARE(live.points("draft_ms"), 0);
  QCOMPARE(live.points("verify_ms"), 0);

  // Transfer log: the run's transfers, most recent first, cpu:0 → cpu:1.
  QVERIFY(!last->transfers.empty());
  QCOMPARE(kv.transfers_table()->rowCount(), static_cast<int>(last->transfers.size()));
  QCOMPARE(kv.transfers_table()->item(0, 1)->text(), QString("cpu:0 → cpu:1"));
  {  // copy time, waits for the prefill and overlapped layers, as the stats say
    const KvTransferStats& t = last->transfers.back();
    QCOMPARE(kv.transfers_table()->item(0, 4)->text(),
             QString::number(t.copy_seconds() * 1e3, 'f', 2));
    QCOMPARE(kv.transfers_table()->item(0, 5)->text(), QString::number(t.waited_s * 1e3, 'f', 1));
    QCOMPARE(kv.transfers_table()->item(0, 6)->text(),
             QString("%1 / %2").arg(t.layers_overlapped).arg(t.layers_done));
  }
  QCOMPARE(kv.sequences_table()->rowCount(), 0);  // nothing live any more

  // Tokens the inspector showed for blocks are the sequence's tokens at those positions.
  qInfo("%d snapshots, %d blocks with derived tokens", snapshots, static_cast<int>(derived.size()));
  QVERIFY2(!derived.empty(), "no block's tokens were derived during the run");
  for (const BlockTokens& b : derived) {
    const auto& seq = sequences.at(*b.request);
    const auto at = [&](size_t first) {
      return first + b.tokens.size() <= seq.size() &&
             std::equal(b.tokens.begin(), b.tokens.end(), seq.begin() + first);
    };
    if (b.first_position >= 0) {
      QVERIFY2(at(static_cast<size_t>(b.first_position)), "derived tokens differ from the run's");
    } else {  // repeated text: the content must still be a block of the sequence
      bool somewhere = false;
      for (size_t first = 0; first < seq.size() && !somewhere; first += 16) somewhere = at(first);
      QVERIFY(somewhere);
    }
  }

  // A cached block's details after the run: its record, and why its tokens are not shown.
  QVERIFY(kv.select_device("cpu:1"));
  const KvSnapshot& pool = last->devices.back().kv;
  for (BlockId b = 0; b < pool.n_blocks; ++b) {
    if (pool.blocks[static_cast<size_t>(b)].state != BlockState::kCached) continue;
    kv.select_block(b);
    QVERIFY(kv.block_details().contains("cached"));
    QVERIFY(kv.block_tokens().contains("not available for cached blocks"));
    break;
  }

  // Exports: the window as CSV (a header, one row per sample) and the page as PNG.
  QTemporaryDir dir;
  QVERIFY(dir.isValid());
  const QString csv = dir.filePath("live.csv");
  QVERIFY(live.export_csv(csv));
  QFile file(csv);
  QVERIFY(file.open(QIODevice::ReadOnly | QIODevice::Text));
  const QStringList lines = QString::fromUtf8(file.readAll()).split('\n', Qt::SkipEmptyParts);
  QCOMPARE(lines.size(), window + 1);
  QVERIFY(lines.front().startsWith(
      "t_s,decode_tok_s,accept_per_step,draft_ms_per_step,verify_ms_per_step,"));
  QVERIFY(lines.front().contains("kv_owned_pct:cpu:1"));
  const QString png = dir.filePath("live.png");
  QVERIFY(live.export_png(png));
  QVERIFY(!QImage(png).isNull());
  QVERIFY(!live.export_csv(dir.filePath("no/such/dir/live.csv")));
}

void GuiLiveKvTest::block_map_paints_100k_blocks_from_one_image_per_snapshot() {
  const KvSnapshot kv = synthetic_snapshot(100'000);
  BlockMap map;
  map.resize(800, 600);
  map.set_snapshot(kv);
  QCOMPARE(map.cells(), 100'000);
  QCOMPARE(map.used_cells(), kv.n_owned + kv.n_cached);
  for (int i = 0; i < 3; ++i) QVERIFY(!map.grab().isNull());
  QCOMPARE(map.image_rebuilds(), 1);  // paints blit the cached image

  // Hit-testing is arithmetic on the same grid: the first cell is block 0, and every block the
  // map reports lies inside the pool.
  QCOMPARE(map.block_at(QPoint(0, 0)), 0);
  for (int y = 0; y < 560; y += 37)
    for (int x = 0; x < 800; x += 41) QVERIFY(map.block_at(QPoint(x, y)) < 100'000);
  QCOMPARE(map.block_at(QPoint(-5, 10)), -1);

  // A new snapshot or a new size rebuilds once.
  map.set_snapshot(kv);
  map.grab();
  map.grab();
  QCOMPARE(map.image_rebuilds(), 2);
  map.resize(300, 200);
  map.grab();
  map.grab();
  QCOMPARE(map.image_rebuilds(), 3);

  // Colours: free, cached and owned differ; a shared block is drawn lighter than its owner's.
  const BlockRecord& free_block = kv.blocks[0];
  const BlockRecord& owned = kv.blocks[4];   // one owner
  const BlockRecord& shared = kv.blocks[1];  // two owners (1 % 7 == 1)
  const BlockRecord& cached = kv.blocks[2];
  QCOMPARE(shared.ref_count, 2);
  QVERIFY(BlockMap::cell_color(free_block) != BlockMap::cell_color(cached));
  QVERIFY(BlockMap::cell_color(owned) != BlockMap::cell_color(cached));
  QVERIFY(QColor(BlockMap::cell_color(shared)).value() >
          QColor(BlockMap::cell_color(owned)).value());
  QVERIFY(BlockMap::describe(shared, 1, 16).contains("ref count 2"));
  // A pool of its own says nothing of slots; a partition's pool names each block's slot and
  // whether the other partition maps it too.
  QVERIFY(!BlockMap::describe(kv, 1).contains("storage slot"));
  KvSnapshot partition = kv;
  partition.block_slots.assign(partition.blocks.size(), 0);
  partition.slot_refs.assign(partition.blocks.size(), 1);
  partition.block_slots[1] = 37;
  partition.slot_refs[1] = 2;
  QVERIFY(BlockMap::describe(partition, 1).contains("storage slot 37"));
  QVERIFY(BlockMap::describe(partition, 1).contains("shared between the partitions"));
  QVERIFY(BlockMap::describe(partition, 4).contains("its own"));
}

void GuiLiveKvTest::pause_keeps_the_window_and_reset_empties_it() {
  LivePage live;
  auto snapshot = std::make_shared<EngineSnapshot>();
  snapshot->time = MetricsClock::now();
  DeviceSnapshot device;
  device.name = "cpu:0";
  device.kv = synthetic_snapshot(30);
  snapshot->devices.push_back(device);
  live.on_snapshot(snapshot);
  QCOMPARE(live.points("decode_tps"), 1);
  QCOMPARE(live.points("kv:cpu:0"), 1);
  QCOMPARE(live.points("draft_ms"), 0);  // no verifying step yet
  // Completed requests with drafts: their draft and verify time per verifying step are charted.
  snapshot->summary.draft_ms_per_step = 0.5;
  snapshot->summary.verify_ms_per_step = 4.0;
  live.on_snapshot(snapshot);
  QCOMPARE(live.points("draft_ms"), 1);
  QCOMPARE(live.points("verify_ms"), 1);
  QCOMPARE(live.points("decode_tps"), 2);
  live.reset();
  QCOMPARE(live.points("verify_ms"), 0);
  live.on_snapshot(snapshot);
  QCOMPARE(live.points("decode_tps"), 1);
  live.set_paused(true);
  live.on_snapshot(snapshot);
  StreamUpdate update;
  update.tokens = {1, 2, 3};
  live.on_streamed({update});
  QCOMPARE(live.points("decode_tps"), 1);
  QCOMPARE(live.tokens_seen(), int64_t{3});  // counted while paused, shown on resume
  live.set_paused(false);
  QCOMPARE(live.hud_text("TOKENS"), QString("3"));
  live.on_snapshot(snapshot);
  QCOMPARE(live.points("decode_tps"), 2);
  live.reset();
  QCOMPARE(live.points("decode_tps"), 0);
  QCOMPARE(live.tokens_seen(), int64_t{0});
  QCOMPARE(live.samples(), size_t{0});
}

// The bars show the engine's cumulative step and draft counts as shares, counted from the last
// Reset.
void GuiLiveKvTest::bars_show_accept_lengths_and_position_acceptance() {
  LivePage live;
  auto first = std::make_shared<EngineSnapshot>();
  first->time = MetricsClock::now();
  first->summary.steps_by_tokens = {0, 2, 1, 1};  // 4 steps: two of 1 token, one of 2, one of 3
  first->summary.draft_proposed_at = {4, 2};
  first->summary.draft_accepted_at = {2, 1};
  live.on_snapshot(first);
  QCOMPARE(live.bars("accept_length"), (QList<qreal>{50.0, 25.0, 25.0}));
  QCOMPARE(live.bars("position_acceptance"), (QList<qreal>{50.0, 50.0}));
  live.reset();
  QVERIFY(live.bars("accept_length").isEmpty());
  auto second = std::make_shared<EngineSnapshot>(*first);
  second->summary.steps_by_tokens = {0, 2, 1, 3};  // two more 3-token steps since the reset
  second->summary.draft_proposed_at = {6, 4};
  second->summary.draft_accepted_at = {4, 3};
  live.on_snapshot(second);
  QCOMPARE(live.bars("accept_length"), (QList<qreal>{0.0, 0.0, 100.0}));
  QCOMPARE(live.bars("position_acceptance"), (QList<qreal>{100.0, 100.0}));
}

QTEST_MAIN(GuiLiveKvTest)
#include "test_gui_live_kv.moc"
