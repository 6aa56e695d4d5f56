// The tolerance of the GPU tests, justified on any machine. The GPU tests hold a GPU's logit rows
// on the real model within kExactRel (relative L2) of the exact forward pass and each greedy token
// within kTieLogits of the exact best (tests/common/gpu_tolerance.h). Here the reference pass runs
// with the CUDA backend's roundings emulated (tests/model/reference_forward.h: Rounding::
// kGpuFewRows, the decode GEMVs' f32 inputs; kGpuManyRows, the GEMMs' BF16 inputs) on each of
// those prompts, continued greedily for kRealSteps tokens by the CPU. Every emulated row must be
// within kExactRel of the exact one, and the emulated best token within kTieLogits of the exact
// best, so a GPU that rounds as designed passes those tests and the bounds are not looser than
// the rounding needs by more than the margins printed here. (The emulation leaves out the GPU's
// f32 sums and the order of its additions, both far smaller than the roundings.) For the record it
// also prints how far the CPU backend's rows are from the exact ones on the same tokens: its 8-bit
// activations put it further away than the GPU's rounding, which is why the GPU tests compare with
// the exact pass and not with the CPU.

#include <QtTest>
#include <algorithm>
#include <cmath>
#include <optional>
#include <string>
#include <vector>

#include "core/device/device.h"
#include "core/model/llama_model.h"
#include "core/runtime/generator.h"
#include "core/tokenizer/tokenizer.h"
#include "tests/common/default_model.h"
#include "tests/common/gpu_tolerance.h"
#include "tests/model/reference_forward.h"

using namespace tokenfab;

namespace {

struct Distance {
  double worst_rel = 0.0;        // the largest relative L2 distance of a row from the exact one
  double worst_shortfall = 0.0;  // the most the row's best token fell short of the exact best
  int flips = 0;                 // rows whose best token is not the exact best
};

// Rows [from, rows) of `emulated` against `exact`, each (rows, n) row-major.
Distance compare(const std::vector<double>& exact, const std::vector<double>& emulated, int64_t n,
                 size_t from) {
  Distance d;
  for (size_t r = from; r < exact.size() / static_cast<size_t>(n); ++r) {
    const double* e = exact.data() + r * n;
    const double* g = emulated.data() + r * n;
    double diff = 0.0, norm = 0.0;
    for (int64_t i = 0; i < n; ++i) {
      diff += (g[i] - e[i]) * (g[i] - e[i]);
      norm += e[i] * e[i];
    }
    d.worst_rel = std::max(d.worst_rel, std::sqrt(diff / norm));
    const int64_t pick = std::max_element(g, g + n) - g;
    const double shortfall = *std::max_element(e, e + n) - e[pick];
    d.flips += shortfall > 0;
    d.worst_shortfall = std::max(d.worst_shortfall, shortfall);
  }
  return d;
}

}  // namespace

class GpuRoundingTest : public QObject {
  Q_OBJECT

 private slots:
  void initTestCase();
  void emulated_gpu_rounding_stays_within_the_gpu_tests_bounds();

 private:
  std::unique_ptr<LlamaModel> model_;
  std::optional<Tokenizer> tokenizer_;
};

void GpuRoundingTest::initTestCase() {
  TOKENFAB_LOAD_DEFAULT_MODEL(model_, tokenizer_);
}

void GpuRoundingTest::emulated_gpu_rounding_stays_within_the_gpu_tests_bounds() {
  const int64_t n_vocab = model_->hparams().n_vocab;
  Generator generator(*model_, *tokenizer_, 2, 256);
  GenerateOptions greedy;
  greedy.max_tokens = test::kRealSteps;
  greedy.stop_at_end_of_generation = false;
  struct Mode {
    const char* name;
    test::Rounding rounding;
    Distance worst;
  };
  Mode modes[] = {{"few rows (f32 inputs)", test::Rounding::kGpuFewRows, {}},
                  {"many rows (BF16 inputs)", test::Rounding::kGpuManyRows, {}}};
  constexpr int32_t kBlockSize = 16, kBlocks = 16;
  CpuDevice cpu({DeviceKind::kCpu, 0}, *model_, 2, kBlocks, kBlockSize);
  std::vector<int32_t> table(kBlocks);
  for (int32_t b = 0; b < kBlocks; ++b) table[static_cast<size_t>(b)] = b;
  Distance cpu_worst;
  for (const char* text : test::kRealPrompts) {
    std::vector<int32_t> tokens = tokenizer_->encode(text, true, false);
    const size_t n_prompt = tokens.size();
    generator.reset();
    const GenerateResult r = generator.generate(tokens, greedy);
    tokens.insert(tokens.end(), r.ids.begin(), r.ids.end());
    tokens.pop_back();  // the last token's logits are not needed
    const std::vector<double> exact = test::reference_logits(model_->file(), tokens);
    {
      const BatchSequence all{tokens, 0, table, false, true};
      std::vector<float> rows;
      cpu.run({&all, 1}, rows);
      const Distance d =
          compare(exact, std::vector<double>(rows.begin(), rows.end()), n_vocab, n_prompt - 1);
      qInfo("\"%.32s…\", the CPU backend: worst relative L2 %.4f", text, d.worst_rel);
      cpu_worst.worst_rel = std::max(cpu_worst.worst_rel, d.worst_rel);
    }
    for (Mode& mode : modes) {
      const std::vector<double> emulated =
          test::reference_logits(model_->file(), tokens, mode.rounding);
      // The rows that choose the generated tokens: after the prompt's last token on.
      const Distance d = compare(exact, emulated, n_vocab, n_prompt - 1);
      qInfo(
          "\"%.32s…\", %s: worst relative L2 %.4f, %d picks below the exact best (worst by "
          "%.3f)",
          text, mode.name, d.worst_rel, d.flips, d.worst_shortfall);
      mode.worst.worst_rel = std::max(mode.worst.worst_rel, d.worst_rel);
      mode.worst.worst_shortfall = std::max(mode.worst.worst_shortfall, d.worst_shortfall);
      mode.worst.flips += d.flips;
    }
  }
  qInfo("the CPU backend, all prompts: worst relative L2 %.4f (not bounded here)",
        cpu_worst.worst_rel);
  for (const Mode& mode : modes) {
    qInfo(
        "%s, all prompts: worst relative L2 %.4f of the %.2f allowed; worst shortfall %.3f of "
        "the %.2f allowed",
        mode.name, mode.worst.worst_rel, test::kExactRel, mode.worst.worst_shortfall,
        test::kTieLogits);
    QVERIFY2(mode.worst.worst_rel <= test::kExactRel,
             qPrintable(QString("%1: a row is %2 from the exact one, more than the GPU tests allow")
                            .arg(mode.name)
                            .arg(mode.worst.worst_rel)));
    QVERIFY2(mode.worst.worst_shortfall <= test::kTieLogits,
             qPrintable(QString("%1: a best token is %2 below the exact best, more than the GPU "
                                "tests allow")
                            .arg(mode.name)
                            .arg(mode.worst.worst_shortfall)));
  }
}

QTEST_MAIN(GpuRoundingTest)
#include "test_gpu_rounding.moc"
