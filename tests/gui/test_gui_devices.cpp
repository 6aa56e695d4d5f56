// The Devices page and the roofline arithmetic behind it:
//   - roofline() against numbers worked out by hand for a tiny model shape;
//   - on a real disaggregated run (prefill cpu:0 → decode cpu:1, the embedded default model) fed
//     to the page directly: one table row per device with the snapshot's figures, and once the
//     limits are measured, roofline series with a point per recent step and the summary sentence;
//   - through a real bridge: apply() refuses an overlapping prefill/decode configuration with a
//     message and keeps the engine, and applies a valid one.

#include <QSignalSpy>
#include <QtTest>
#include <algorithm>
#include <chrono>
#include <memory>
#include <optional>

#include "core/device/roofline.h"
#include "core/model/llama_model.h"
#include "core/serving/engine.h"
#include "core/tokenizer/tokenizer.h"
#include "tests/common/default_model.h"
#include "ui/bridge/engine_bridge.h"
#include "ui/views/devices_page.h"

using namespace tokenfab;
using namespace tokenfab::ui;

namespace {

// q_dim = 8, kv_dim = 4. Per layer: wq 8·8 + wk, wv 2·4·8 + wo 8·8 + gate, up, down 3·16·8 = 576.
HParams tiny_hparams() {
  HParams hp;
  hp.n_vocab = 100;
  hp.n_embd = 8;
  hp.n_ff = 16;
  hp.n_layer = 2;
  hp.n_head = 2;
  hp.n_kv_head = 1;
  hp.head_dim = 4;
  return hp;
}

const char* const kPrompts[] = {
    "The capital of France is",
    "Once upon a time, in a small village by the sea, there lived an old fisherman who",
    "def fibonacci(n):\n    if n < 2:\n        return n\n    return",
};

}  // namespace

class GuiDevicesTest : public QObject {
  Q_OBJECT

 private slots:
  void initTestCase();
  void roofline_matches_hand_computed_limits();
  void page_shows_devices_and_roofline_of_a_real_run();
  void limits_are_measured_when_shown_and_again_when_idle();
  void apply_rejects_overlapping_roles_and_applies_valid_ones();

 private:
  // A finished disaggregated run of kPrompts (24 tokens each); the engine is idle.
  std::shared_ptr<const EngineSnapshot> idle_run_snapshot();

  std::shared_ptr<const LlamaModel> model_;
  std::optional<Tokenizer> tokenizer_;
};

void GuiDevicesTest::initTestCase() {
  TOKENFAB_LOAD_DEFAULT_MODEL(model_, tokenizer_);
}

void GuiDevicesTest::roofline_matches_hand_computed_limits() {
  const HParams hp = tiny_hparams();
  QCOMPARE(layer_matrix_elements(hp), int64_t{576});
  const StepWork step{
      .rows = 3, .logit_rows = 2, .attended_positions = 10, .kv_positions = 20, .compute_s = 0.5};
  // MACs = 3·2·576 (rows × layers × per layer) + 2·100·8 (LM head) + 2·10·8·2 (attention)
  //      = 3456 + 1600 + 320 = 5376.
  // bytes = 1000 + 20·2·2·4·2 = 1000 + 640 = 1640.
  // 1e-6 GB/s = 1000 B/s and 1e-6 GMAC/s = 1000 MAC/s: 1.64 s and 5.376 s.
  RooflinePoint p = roofline(step, hp, 1000, 1e-6, 1e-6);
  QCOMPARE(p.measured_s, 0.5);
  QVERIFY(qFuzzyCompare(p.memory_bound_s, 1.64));
  QVERIFY(qFuzzyCompare(p.compute_bound_s, 5.376));
  QVERIFY(qFuzzyCompare(p.bound_s, 5.376));
  // Ten times less bandwidth: memory-bound (16.4 s).
  p = roofline(step, hp, 1000, 1e-7, 1e-6);
  QVERIFY(qFuzzyCompare(p.memory_bound_s, 16.4));
  QVERIFY(qFuzzyCompare(p.bound_s, 16.4));
  // No limits measured: no bound.
  p = roofline(step, hp, 1000, 0, 0);
  QCOMPARE(p.bound_s, 0.0);

  // The embedded model: a one-row step with its logits and no attention does one multiply-add
  // per element of the file's matrices (every block's attention and FFN matrices, and the LM
  // head — the output matrix, or the embedding when the two are tied), counted from the file.
  uint64_t elements = 0;
  bool has_output = false;
  for (const gguf::TensorInfo& t : model_->file().tensors()) {
    const std::string& n = t.name;
    const bool matrix = n.ends_with("attn_q.weight") || n.ends_with("attn_k.weight") ||
                        n.ends_with("attn_v.weight") || n.ends_with("attn_output.weight") ||
                        n.ends_with("ffn_gate.weight") || n.ends_with("ffn_up.weight") ||
                        n.ends_with("ffn_down.weight");
    if (n.starts_with("blk.") && matrix) elements += t.n_elements;
    if (n == "output.weight") {
      elements += t.n_elements;
      has_output = true;
    }
  }
  if (!has_output) elements += model_->file().tensor("token_embd.weight").n_elements;
  const StepWork one_row{.rows = 1, .logit_rows = 1, .compute_s = 1.0};
  p = roofline(one_row, model_->hparams(), 0, 0, 1e-9);  // 1 MAC/s: seconds = MACs
  QCOMPARE(p.compute_bound_s, static_cast<double>(elements));
}

std::shared_ptr<const EngineSnapshot> GuiDevicesTest::idle_run_snapshot() {
  EngineConfig config;
  config.devices = "";
  config.prefill = "cpu:0";
  config.decode = "cpu:1";
  config.threads = 2;
  config.kv_blocks = 256;
  Engine engine(*model_, config);
  for (const char* text : kPrompts) {
    GenerationRequest request;
    request.prompt = tokenizer_->encode(text, false, false);
    request.max_tokens = 24;
    engine.submit(std::move(request));
  }
  engine.wait_idle();
  return std::make_shared<const EngineSnapshot>(engine.snapshot());
}

void GuiDevicesTest::page_shows_devices_and_roofline_of_a_real_run() {
  const auto snapshot = idle_run_snapshot();
  QCOMPARE(snapshot->devices.size(), size_t{2});

  DevicesPage page;
  page.resize(1200, 900);
  page.show();
  QVERIFY(page.cpu_choices() >= 2);
  page.on_snapshot(snapshot);
  QCOMPARE(page.device_rows(), 2);
  for (int row = 0; row < 2; ++row) {
    const DeviceSnapshot& d = snapshot->devices[static_cast<size_t>(row)];
    QCOMPARE(page.cell(row, 0), QString::fromStdString(d.name));
    QCOMPARE(page.cell(row, 1), QString::fromStdString(d.role));
    QCOMPARE(page.cell(row, 2), QString::number(d.threads));
    QCOMPARE(page.cell(row, 3),
             QString("%1 / %2").arg(d.kv.n_blocks - d.kv.n_free).arg(d.kv.n_blocks));
    QCOMPARE(page.cell(row, 4), QString::number(d.steps));
  }

  // Before the limits are known: measured points only, and "measuring…".
  page.set_model(model_);
  const QString decode = QString::fromStdString(snapshot->devices[1].name);
  QVERIFY(page.roofline_summary(decode).startsWith("measuring"));
  int timed_steps = 0;
  for (const StepSample& s : snapshot->devices[1].recent_steps) timed_steps += s.compute_s > 0;
  QVERIFY(timed_steps > 0);
  QCOMPARE(page.roofline_points(decode, "measured"), timed_steps);

  const int threads = snapshot->devices[1].threads;
  QTRY_VERIFY_WITH_TIMEOUT(page.limits(threads).has_value(), 120000);
  QVERIFY(page.limits(threads)->bandwidth_gbs > 0);
  QVERIFY(page.limits(threads)->peak_gmacs > 0);
  QVERIFY(!page.limits_provisional(threads));  // the engine was idle throughout
  page.on_snapshot(snapshot);
  QCOMPARE(page.roofline_points(decode, "measured"), timed_steps);
  QCOMPARE(page.roofline_points(decode, "memory"), timed_steps);
  QCOMPARE(page.roofline_points(decode, "compute"), timed_steps);
  QVERIFY2(
      page.roofline_summary(decode).contains(QString("The last %1 steps ran at").arg(timed_steps)),
      qPrintable(page.roofline_summary(decode)));
  QVERIFY2(page.roofline_summary(decode).contains(QString("%1 kernels").arg(cpu_matmul_kernels())),
           qPrintable(page.roofline_summary(decode)));
  QVERIFY2(!page.roofline_summary(decode).contains("measured again"),
           qPrintable(page.roofline_summary(decode)));
  qInfo().noquote() << decode << page.roofline_summary(decode);
  QCOMPARE(page.roofline_points("cpu:9", "measured"), -1);

  // The time axis ends at the newest step and spans at least a second, back to the oldest one.
  const auto& steps = snapshot->devices[1].recent_steps;
  const double oldest = std::chrono::duration<double>(steps.front().end - steps.back().end).count();
  const auto [x_min, x_max] = page.roofline_x_range(decode);
  QCOMPARE(x_max, 0.0);
  QVERIFY2(x_min <= std::min(oldest, -1.0), qPrintable(QString::number(x_min)));
}

// Limits are measured only once the page is shown. Those measured while the engine had a request
// are marked provisional and said to be so; the next snapshot of an idle engine measures them
// again, which clears the mark and keeps the higher value of each limit.
void GuiDevicesTest::limits_are_measured_when_shown_and_again_when_idle() {
  const auto idle = idle_run_snapshot();
  auto busy_copy = std::make_shared<EngineSnapshot>(*idle);
  RequestInfo running;
  running.id = 99;
  running.state = RequestState::kDecoding;
  busy_copy->requests.push_back(running);
  const std::shared_ptr<const EngineSnapshot> busy = busy_copy;
  const QString decode = QString::fromStdString(idle->devices[1].name);
  const int threads = idle->devices[1].threads;

  DevicesPage page;
  QSignalSpy measured(&page, &DevicesPage::limitsMeasured);
  page.on_snapshot(busy);
  page.set_model(model_);
  // Nothing is measured for a page that is not shown (the probe would take the cores).
  QTest::qWait(300);
  QCOMPARE(measured.count(), 0);
  QVERIFY(!page.limits(threads).has_value());
  page.show();
  QTRY_VERIFY_WITH_TIMEOUT(measured.count() >= 1, 120000);
  QVERIFY(page.limits(threads).has_value());
  QVERIFY(page.limits_provisional(threads));
  QVERIFY2(page.roofline_summary(decode).contains("measured again when it is idle"),
           qPrintable(page.roofline_summary(decode)));
  const MachineLimits first = *page.limits(threads);

  // Still busy: nothing is measured again.
  page.on_snapshot(busy);
  QTest::qWait(200);
  QCOMPARE(measured.count(), 1);

  page.on_snapshot(idle);
  QTRY_VERIFY_WITH_TIMEOUT(measured.count() >= 2, 120000);
  QVERIFY(!page.limits_provisional(threads));
  QVERIFY(page.limits(threads)->bandwidth_gbs >= first.bandwidth_gbs);
  QVERIFY(page.limits(threads)->peak_gmacs >= first.peak_gmacs);
  QVERIFY2(!page.roofline_summary(decode).contains("measured again"),
           qPrintable(page.roofline_summary(decode)));
}

void GuiDevicesTest::apply_rejects_overlapping_roles_and_applies_valid_ones() {
  EngineBridge bridge;
  DevicesPage page;
  QVERIFY(!page.apply(EngineConfig{}).isEmpty());  // no bridge yet
  page.attach(&bridge);
  QSignalSpy loaded(&bridge, &EngineBridge::loaded);
  QSignalSpy failed(&bridge, &EngineBridge::failed);
  EngineConfig config;
  config.threads = 2;
  config.kv_blocks = 128;
  bridge.load(QString(), config);
  QTRY_VERIFY_WITH_TIMEOUT(loaded.count() + failed.count() > 0, 120000);
  QCOMPARE(failed.count(), 0);
  QCOMPARE(page.editor_config().devices, std::string("cpu:0"));

  EngineConfig bad = bridge.config();  // cpu:0 both a prefill and a long-prompt prefill device
  bad.devices = "";
  bad.prefill = "cpu:0";
  bad.decode = "cpu:1";
  bad.long_prefill = "cpu:0";
  bad.long_prompt_tokens = 64;
  const QString error = page.apply(bad);
  QVERIFY(!error.isEmpty());
  QVERIFY2(error.contains("cpu:0"), qPrintable(error));
  QCOMPARE(bridge.config().prefill, std::string());  // the old engine stays
  QVERIFY(bridge.ready());

  EngineConfig good = bridge.config();
  good.devices = "";
  good.prefill = "cpu:0";
  good.decode = "cpu:1";
  QCOMPARE(page.apply(good), QString());
  QCOMPARE(bridge.config().decode, std::string("cpu:1"));
  QVERIFY(bridge.ready());

  // One device as both: its two partitions.
  EngineConfig partitions = good;
  partitions.decode = "cpu:0";
  QCOMPARE(page.apply(partitions), QString());
  QCOMPARE(bridge.config().prefill, std::string("cpu:0"));
  QCOMPARE(bridge.config().decode, std::string("cpu:0"));
  QVERIFY(bridge.ready());
}

QTEST_MAIN(GuiDevicesTest)
#include "test_gui_devices.moc"
