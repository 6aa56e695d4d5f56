// Every family Tokenfab runs (llama with Llama 3's RoPE factors, qwen2, qwen3, gemma2, gemma3,
// phi3) on a synthetic file of its own shape against the independent NumPy reference forward
// (tools/reference_forward.py --families → tests/data/forward_families_golden.json): the logits
// at every prompt position, the greedy continuation token by token (the decode path), and the
// same continuation through the engine in colocated, chunked and disaggregated modes (the paged
// KV cache, its windows crossing block boundaries, the KV transfer). No model file is needed:
// the files are written here, and their SHA-256 must be the golden's (the same weights).

#include <QJsonArray>
#include <QJsonDocument>
#include <QJsonObject>
#include <QTemporaryDir>
#include <QtTest>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>

#include "core/common/error.h"
#include "core/common/sha256.h"
#include "core/model/llama_forward.h"
#include "core/model/llama_model.h"
#include "core/model/synthetic_model.h"
#include "core/serving/engine.h"
#include "kernels/cpu/thread_pool.h"

using namespace tokenfab;

namespace {

constexpr const char* kFamilies[] = {"llama3", "qwen2", "qwen3", "gemma2", "gemma3", "phi3"};

// Logits within this fraction of their position's RMS of the reference's. The margin covers the
// K/V rounded to fp16 in the cache (a relative error of 2^-11 per value) and f32 sums: the worst
// difference seen is 1.9e-3 of the RMS (gemma3), while a wrong RoPE pairing, norm, scale, window
// or activation moves logits by about their RMS.
constexpr double kRelativeTolerance = 0.005;

// The greedy tokens that must agree: the reference's continuation up to its first near-tie
// (top two logits within twice the tolerance of each other), after which either token is right
// and the continuations may rightly part.
size_t decisive_steps(const QJsonObject& g) {
  const QJsonArray margins = g["greedy_margins"].toArray();
  const double rms = g["position_logits_rms"].toArray().last().toDouble();
  size_t n = 0;
  while (n < static_cast<size_t>(margins.size()) &&
         margins[static_cast<int>(n)].toDouble() > 2 * kRelativeTolerance * rms)
    ++n;
  return n;
}

QJsonObject load_golden() {
  std::ifstream in(std::string(TOKENFAB_SOURCE_DIR) + "/tests/data/forward_families_golden.json");
  const std::string text{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  return QJsonDocument::fromJson(QByteArray::fromStdString(text)).object();
}

std::vector<int32_t> ints(const QJsonArray& a) {
  std::vector<int32_t> out;
  for (const auto& v : a) out.push_back(v.toInt());
  return out;
}

int32_t argmax(const float* x, int64_t n) {
  return static_cast<int32_t>(std::max_element(x, x + n) - x);
}

}  // namespace

class ModelFamiliesTest : public QObject {
  Q_OBJECT

 private slots:
  void initTestCase();
  void logits_match_the_reference_data();
  void logits_match_the_reference();
  void greedy_decode_matches_the_reference_data();
  void greedy_decode_matches_the_reference();
  void engine_modes_match_the_reference_data();
  void engine_modes_match_the_reference();
  void unknown_architecture_is_named_with_the_list();

 private:
  std::unique_ptr<LlamaModel> load(const QString& family);

  QTemporaryDir dir_;
  QJsonObject golden_;
  std::vector<int32_t> prompt_;
  std::unique_ptr<kernels::ThreadPool> pool_;
};

void ModelFamiliesTest::initTestCase() {
  QVERIFY(dir_.isValid());
  golden_ = load_golden();
  QVERIFY2(!golden_.isEmpty(), "tests/data/forward_families_golden.json is missing or invalid");
  prompt_ = ints(golden_["prompt_ids"].toArray());
  pool_ = std::make_unique<kernels::ThreadPool>(2);
}

// The family's synthetic file, written with the golden's seed; its bytes must be the ones the
// reference computed on.
std::unique_ptr<LlamaModel> ModelFamiliesTest::load(const QString& family) {
  const std::filesystem::path path = dir_.filePath(family + ".gguf").toStdString();
  if (!std::filesystem::exists(path))
    write_synthetic_llama(path, SyntheticShape::family_tiny(family.toStdString()),
                          kernels::WeightType::F32,
                          static_cast<uint64_t>(golden_["seed"].toInt()));
  const QJsonObject g = golden_["families"].toObject()[family].toObject();
  if (QString::fromStdString(sha256_file(path)) != g["sha256"].toString()) {
    QTest::qFail(qPrintable("the synthetic " + family +
                            " file differs from the one the golden was computed on; rerun "
                            "tools/reference_forward.py --families"),
                 __FILE__, __LINE__);
    return nullptr;
  }
  return LlamaModel::load(path);
}

void ModelFamiliesTest::logits_match_the_reference_data() {
  QTest::addColumn<QString>("family");
  for (const char* f : kFamilies) QTest::newRow(f) << QString(f);
}

// All prompt positions at once (one prefill chunk): every logit compared is within
// kRelativeTolerance of the reference's, and the argmax equals the reference's wherever that is
// not a near-tie (at least three quarters of the positions).
void ModelFamiliesTest::logits_match_the_reference() {
  QFETCH(QString, family);
  const auto model = load(family);
  if (!model) return;
  const QJsonObject g = golden_["families"].toObject()[family].toObject();
  const int64_t n_vocab = model->hparams().n_vocab;
  LlamaForward fwd(*model, *pool_);
  KvCache cache = fwd.make_cache();
  std::vector<float> logits;
  fwd.forward(prompt_, cache, LogitsFor::AllTokens, logits);
  const std::vector<int32_t> want_argmax = ints(g["per_position_argmax"].toArray());
  const QJsonArray first = g["first_logits"].toArray();
  const QJsonArray rms = g["position_logits_rms"].toArray();
  const QJsonArray margins = g["per_position_margin"].toArray();
  double worst = 0;
  int compared = 0;
  for (size_t t = 0; t < prompt_.size(); ++t) {
    const float* row = logits.data() + static_cast<int64_t>(t) * n_vocab;
    const double bound = kRelativeTolerance * rms[static_cast<int>(t)].toDouble();
    const QJsonArray want = first[static_cast<int>(t)].toArray();
    for (int i = 0; i < want.size(); ++i) {
      const double diff = std::abs(row[i] - want[i].toDouble());
      worst = std::max(worst, diff / rms[static_cast<int>(t)].toDouble());
      QVERIFY2(diff <= bound, qPrintable(QString("position %1, logit %2: %3 against %4 (bound %5)")
                                             .arg(t).arg(i).arg(row[i]).arg(want[i].toDouble())
                                             .arg(bound)));
    }
    // A near-tie of the reference (top two within twice the tolerance) may go either way.
    if (margins[static_cast<int>(t)].toDouble() <= 2 * bound) continue;
    ++compared;
    QVERIFY2(argmax(row, n_vocab) == want_argmax[t],
             qPrintable(QString("position %1: argmax %2, the reference's %3 (margin %4)")
                            .arg(t).arg(argmax(row, n_vocab)).arg(want_argmax[t])
                            .arg(margins[static_cast<int>(t)].toDouble())));
  }
  qInfo("%s: worst logit difference %.2e of the RMS; argmax compared at %d of %zu positions",
        qPrintable(family), worst, compared, prompt_.size());
  QVERIFY(compared >= static_cast<int>(prompt_.size()) * 3 / 4);
  const QJsonArray last = g["last_logits"].toArray();
  const float* row = logits.data() + static_cast<int64_t>(prompt_.size() - 1) * n_vocab;
  const double bound = kRelativeTolerance * rms[static_cast<int>(prompt_.size() - 1)].toDouble();
  for (int i = 0; i < last.size(); ++i)
    QVERIFY2(std::abs(row[i] - last[i].toDouble()) <= bound,
             qPrintable(QString("last position, logit %1").arg(i)));
}

void ModelFamiliesTest::greedy_decode_matches_the_reference_data() { logits_match_the_reference_data(); }

// The prompt in chunks of 5 tokens, then one token per pass: the continuation is the reference's.
void ModelFamiliesTest::greedy_decode_matches_the_reference() {
  QFETCH(QString, family);
  const auto model = load(family);
  if (!model) return;
  const QJsonObject g = golden_["families"].toObject()[family].toObject();
  std::vector<int32_t> want = ints(g["greedy_continuation_ids"].toArray());
  want.resize(decisive_steps(g));
  QVERIFY2(want.size() >= 2, "the reference's continuation is a near-tie at once");
  LlamaForward fwd(*model, *pool_, /*max_chunk=*/5);
  KvCache cache = fwd.make_cache();
  std::vector<float> logits;
  fwd.forward(prompt_, cache, LogitsFor::LastToken, logits);
  std::vector<int32_t> got;
  while (got.size() < want.size()) {
    got.push_back(argmax(logits.data(), model->hparams().n_vocab));
    fwd.forward(std::vector<int32_t>{got.back()}, cache, LogitsFor::LastToken, logits);
  }
  QCOMPARE(got, want);
}

void ModelFamiliesTest::engine_modes_match_the_reference_data() {
  QTest::addColumn<QString>("family");
  QTest::addColumn<QString>("devices");
  QTest::addColumn<QString>("prefill");
  QTest::addColumn<QString>("decode");
  QTest::addColumn<int>("token_budget");
  for (const char* f : kFamilies) {
    QTest::newRow((std::string(f) + " colocated").c_str()) << QString(f) << "cpu:0" << "" << "" << 512;
    QTest::newRow((std::string(f) + " chunked").c_str()) << QString(f) << "cpu:0" << "" << "" << 7;
    QTest::newRow((std::string(f) + " disaggregated").c_str())
        << QString(f) << "" << "cpu:0" << "cpu:1" << 512;
  }
}

// Through the engine: paged KV (blocks of 4 positions, so a window of 8 spans three blocks), the
// scheduler, chunked prefill and the prefill → decode transfer.
void ModelFamiliesTest::engine_modes_match_the_reference() {
  QFETCH(QString, family);
  QFETCH(QString, devices);
  QFETCH(QString, prefill);
  QFETCH(QString, decode);
  QFETCH(int, token_budget);
  const auto model = load(family);
  if (!model) return;
  const QJsonObject g = golden_["families"].toObject()[family].toObject();
  std::vector<int32_t> want = ints(g["greedy_continuation_ids"].toArray());
  want.resize(decisive_steps(g));
  EngineConfig c;
  c.devices = devices.toStdString();
  c.prefill = prefill.toStdString();
  c.decode = decode.toStdString();
  c.threads = 2;
  c.kv_blocks = 256;
  c.block_size = 4;
  c.token_budget = token_budget;
  c.max_running = 4;
  Engine engine(*model, c);
  GenerationRequest request(prompt_, static_cast<int32_t>(want.size()));
  request.stop_at_end_of_generation = false;
  const RequestInfo info = engine.wait(engine.submit(request));
  QCOMPARE(info.state, RequestState::kFinished);
  QCOMPARE(info.output, want);
}

void ModelFamiliesTest::unknown_architecture_is_named_with_the_list() {
  SyntheticShape s = SyntheticShape::family_tiny("qwen2");
  s.architecture = "mamba";
  try {
    write_synthetic_llama(dir_.filePath("mamba.gguf").toStdString(), s, kernels::WeightType::F32, 1);
    QFAIL("the synthetic writer accepted an unknown architecture");
  } catch (const Error& e) {
    QVERIFY2(QString(e.what()).contains("mamba"), e.what());
  }
  // A file that says mamba: the loader names it and the list.
  s.architecture = "qwen2";
  const std::filesystem::path good = dir_.filePath("qwen2-mamba.gguf").toStdString();
  write_synthetic_llama(good, s, kernels::WeightType::F32, 1);
  std::string bytes;
  {
    std::ifstream in(good, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  // "qwen2" and "mamba" have the same length: replace the architecture value in place.
  const std::string key = "general.architecture";
  const size_t at = bytes.find(key);
  QVERIFY(at != std::string::npos);
  const size_t value = bytes.find("qwen2", at + key.size());
  QVERIFY(value != std::string::npos && value < at + key.size() + 16);
  bytes.replace(value, 5, "mamba");
  const std::filesystem::path bad = dir_.filePath("mamba2.gguf").toStdString();
  std::ofstream(bad, std::ios::binary) << bytes;
  try {
    LlamaModel::load(bad);
    QFAIL("a mamba file loaded");
  } catch (const Error& e) {
    const QString what(e.what());
    QVERIFY2(what.contains("'mamba'") && what.contains(QString::fromStdString(
                                             supported_architectures_text())),
             e.what());
  }
}

QTEST_GUILESS_MAIN(ModelFamiliesTest)
#include "test_model_families.moc"
