// Replays the fuzz targets' inputs in an ordinary build: the seeds (written here, so that every
// target starts from inputs it accepts) and every committed regression input. A target aborts on
// a finding, so a fault that comes back fails this suite by crashing it, with the finding on
// stderr.

#include <QtTest>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <vector>

#include "core/model/llama_model.h"
#include "core/speculative/draft_head.h"
#include "core/storage/database.h"
#include "core/storage/registry.h"
#include "kernels/cpu/quant_types.h"
#include "tests/fuzz/fuzz_targets.h"

using namespace tokenfab;
namespace fs = std::filesystem;

namespace {

const char* const kTargets[] = {"gguf_file",    "model_file",    "head_file",   "tokenizer_text",
                                "sampler_rows", "database_file", "quant_blocks", "chat_template",
                                "openai_request"};

std::vector<uint8_t> read_bytes(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

std::vector<fs::path> files_in(const fs::path& dir) {
  std::vector<fs::path> out;
  if (fs::is_directory(dir))
    for (const auto& entry : fs::directory_iterator(dir))
      if (entry.is_regular_file()) out.push_back(entry.path());
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace

class TestFuzzReplay : public QObject {
  Q_OBJECT

 private slots:
  void initTestCase() {
    QVERIFY(dir_.isValid());
    fuzz::write_seeds(seeds());
  }

  // The seeds are what the targets must accept: a model that loads, heads that load.
  void seeds_are_valid_inputs() {
    for (const fs::path& p : files_in(seeds() / "model_file")) {
      const auto model = LlamaModel::load(p);
      QCOMPARE(model->hparams().n_layer, int64_t{2});
      // The Q4_K model's FFN rows are whole super-blocks: its ffn_down is Q4_K.
      if (p.filename() == "small-q4_k.gguf")
        QCOMPARE(model->layers().front().w_down.type, kernels::WeightType::Q4_K);
    }
    QVERIFY(fs::exists(seeds() / "model_file" / "small-q4_k.gguf"));
    // A seed per weight type, and two with a non-finite scale.
    QCOMPARE(files_in(seeds() / "quant_blocks").size(),
             static_cast<size_t>(kernels::WeightType::IQ4_XS) + 1 + 2);
    const std::vector<fs::path> heads = files_in(seeds() / "head_file");
    QCOMPARE(heads.size(), size_t{2});
    for (const fs::path& p : heads) QCOMPARE(load_draft_head(p).info.n_embd, 64);
    QVERIFY(!files_in(seeds() / "tokenizer_text").empty());
    // (A copy: opening the seed itself would leave its WAL files among the inputs.)
    const fs::path copy = fs::path(checks_.path().toStdString()) / "registry.db";
    fs::copy_file(seeds() / "database_file" / "registry.db", copy);
    QCOMPARE(Registry(*Database::open(copy)).heads().size(), size_t{1});
    if (!fuzz::embedded_tokenizer_available())
      qWarning("the embedded model is not fetched: tokenizer_text inputs pass without a tokenizer");
  }

  void targets_pass_over_seeds_and_regressions_data() {
    QTest::addColumn<QString>("target");
    QTest::addColumn<QString>("file");
    const fs::path regressions = fs::path(TOKENFAB_SOURCE_DIR) / "tests/fuzz/regressions";
    for (const char* target : kTargets) {
      for (const fs::path& dir : {seeds() / target, regressions / target})
        for (const fs::path& p : files_in(dir))
          QTest::newRow((std::string(target) + " " + p.filename().string()).c_str())
              << QString(target) << QString::fromStdString(p.string());
    }
  }
  void targets_pass_over_seeds_and_regressions() {
    QFETCH(QString, target);
    QFETCH(QString, file);
    const fuzz::Target run = fuzz::target_named(target.toStdString());
    QVERIFY(run != nullptr);
    const std::vector<uint8_t> bytes = read_bytes(file.toStdString());
    run(bytes);  // aborts on a finding
  }

  void unknown_target_names_nothing() { QVERIFY(fuzz::target_named("no_such_target") == nullptr); }

 private:
  fs::path seeds() const { return fs::path(dir_.path().toStdString()); }
  QTemporaryDir dir_;
  QTemporaryDir checks_;
};

QTEST_GUILESS_MAIN(TestFuzzReplay)
#include "test_fuzz_replay.moc"
