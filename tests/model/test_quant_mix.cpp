// Quantization mixtures (core/model/quant_mix.h): the type of every tensor equals the one
// llama.cpp's llama-quantize chose, for every target on two models (tests/data/
// quant_mix_golden.json, written by tools/golden_quant_mix.py: the embedded SmolLM2-135M, whose
// 576-wide rows take the fallbacks, and a synthetic llama-mini whose rows all divide into 256);
// and the quantization study's targets re-quantized in memory (LlamaModel::requantize_mix,
// requantize_target) take those types and still compute. No model file needed.

#include <QFile>
#include <QJsonArray>
#include <QJsonDocument>
#include <QJsonObject>
#include <QTemporaryDir>
#include <QtTest>
#include <cmath>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "core/common/error.h"
#include "core/gguf/file_type.h"
#include "core/gguf/gguf_types.h"
#include "core/model/llama_forward.h"
#include "core/model/quant_mix.h"
#include "core/model/synthetic_model.h"
#include "core/training/generation_eval.h"
#include "kernels/cpu/quantize.h"

using tokenfab::LlamaModel;
using tokenfab::MixModel;
using tokenfab::gguf::TensorType;
using tokenfab::kernels::WeightType;

namespace {

const QString kGolden = QStringLiteral(TOKENFAB_SOURCE_DIR "/tests/data/quant_mix_golden.json");

std::optional<TensorType> type_named(const std::string& name) {
  for (uint32_t raw = 0; raw < 64; ++raw) {
    const auto traits = tokenfab::gguf::tensor_type_traits(raw);
    if (traits && name == traits->name) return static_cast<TensorType>(raw);
  }
  return std::nullopt;
}

MixModel model_from(const QJsonObject& m) {
  MixModel model;
  model.architecture = m["architecture"].toString().toStdString();
  model.n_layer = m["n_layer"].toInt();
  model.n_head = m["n_head"].toInt();
  model.n_kv_head = m["n_kv_head"].toInt();
  for (const QJsonValue& v : m["tensors"].toArray()) {
    const QJsonObject t = v.toObject();
    tokenfab::MixTensor tensor;
    tensor.name = t["name"].toString().toStdString();
    for (const QJsonValue& d : t["shape"].toArray())
      tensor.dims.push_back(static_cast<uint64_t>(d.toDouble()));
    tensor.type = type_named(t["type"].toString().toStdString()).value();
    model.tensors.push_back(std::move(tensor));
  }
  return model;
}

// The 576-wide smollm2-135m shape cut to 2 layers and 512 tokens, in Q8_0.
std::unique_ptr<LlamaModel> small_model(const QTemporaryDir& dir, bool tied) {
  tokenfab::SyntheticShape s = tokenfab::SyntheticShape::smollm2_135m();
  s.name = "smollm2-135m-2l";
  s.n_layer = 2;
  s.n_vocab = 512;
  s.n_ctx = 256;
  s.tied_output = tied;
  const std::filesystem::path path = dir.filePath(tied ? "tied.gguf" : "untied.gguf").toStdString();
  if (!std::filesystem::exists(path)) tokenfab::write_synthetic_llama(path, s, WeightType::Q8_0, 5);
  return LlamaModel::load(path);
}

// The last token's logits are finite: the re-quantized matrices compute.
bool computes(const LlamaModel& model) {
  tokenfab::kernels::ThreadPool pool(2);
  tokenfab::LlamaForward forward(model, pool);
  tokenfab::KvCache cache = forward.make_cache();
  std::vector<float> logits;
  const std::vector<int32_t> tokens = {1, 72, 101, 108, 300};
  forward.forward(tokens, cache, tokenfab::LogitsFor::LastToken, logits);
  for (float v : logits)
    if (!std::isfinite(v)) return false;
  return !logits.empty();
}

// Row 0 of `m` as f32.
std::vector<float> first_row(const tokenfab::WeightMatrix& m) {
  std::vector<float> row(static_cast<size_t>(m.cols));
  tokenfab::kernels::dequantize_row(m.type, m.row(0), row.data(), m.cols);
  return row;
}

}  // namespace

class QuantMixTest : public QObject {
  Q_OBJECT

 private slots:
  void initTestCase();
  void mix_equals_llama_quantize_data();
  void mix_equals_llama_quantize();
  void names_and_fallbacks();
  void refuses_what_it_does_not_define();
  void requantize_in_memory_follows_the_mix();
  void target_quants_are_single_types_or_mixtures();

 private:
  QJsonObject golden_;
};

void QuantMixTest::initTestCase() {
  QFile file(kGolden);
  QVERIFY2(file.open(QIODevice::ReadOnly), qPrintable("cannot read " + kGolden));
  const QByteArray text = file.readAll();
  // The file's first key says where its values came from.
  QVERIFY(text.startsWith("{\n  \"source\": \"llama-quantize of the llama.cpp"));
  golden_ = QJsonDocument::fromJson(text).object();
  QVERIFY(!golden_.isEmpty());
}

void QuantMixTest::mix_equals_llama_quantize_data() {
  QTest::addColumn<int>("model");
  QTest::addColumn<QString>("target");
  const QJsonArray models = golden_["models"].toArray();
  QCOMPARE(models.size(), 2);
  // Every target Tokenfab writes was run through llama-quantize, in the order shown.
  QStringList targets;
  for (const QJsonValue& t : golden_["targets"].toArray()) targets << t.toString();
  QStringList ours;
  for (const std::string& n : tokenfab::quant_mix_names()) ours << QString::fromStdString(n);
  QCOMPARE(targets, ours);
  for (int m = 0; m < models.size(); ++m)
    for (const QString& target : targets)
      QTest::newRow(qPrintable(QString("%1 %2").arg(m == 0 ? "smollm2" : "llama-mini", target)))
          << m << target;
}

// Each tensor's type equals llama-quantize's; a mismatch names the tensor and both types.
void QuantMixTest::mix_equals_llama_quantize() {
  QFETCH(int, model);
  QFETCH(QString, target);
  const QJsonObject m = golden_["models"].toArray()[model].toObject();
  const MixModel mix_model = model_from(m);
  const std::optional<uint32_t> file_type = tokenfab::quant_mix_file_type(target.toStdString());
  QVERIFY(file_type.has_value());
  const std::vector<TensorType> ours = tokenfab::quant_mix(mix_model, *file_type);
  const QJsonArray theirs = m["mixes"].toObject()[target].toArray();
  QCOMPARE(static_cast<qsizetype>(ours.size()), theirs.size());
  QCOMPARE(ours.size(), mix_model.tensors.size());
  QStringList differences;
  for (size_t i = 0; i < ours.size(); ++i) {
    const QString want = theirs[static_cast<qsizetype>(i)].toString();
    const QString got = tokenfab::gguf::tensor_type_name(ours[i]);
    if (want != got)
      differences << QString("%1: llama-quantize %2, ours %3")
                         .arg(QString::fromStdString(mix_model.tensors[i].name), want, got);
  }
  QVERIFY2(differences.isEmpty(), qPrintable(differences.mid(0, 8).join("; ")));
}

void QuantMixTest::names_and_fallbacks() {
  QCOMPARE(tokenfab::quant_mix_file_type("q4_k_m"), std::optional<uint32_t>(15));
  QCOMPARE(tokenfab::quant_mix_file_type("IQ4_XS"), std::optional<uint32_t>(30));
  QCOMPARE(tokenfab::quant_mix_file_type("bf16"), std::optional<uint32_t>(32));
  // Known to llama.cpp but not written by Tokenfab (imatrix-only, or not computed on).
  QCOMPARE(tokenfab::quant_mix_file_type("IQ2_XXS"), std::optional<uint32_t>());
  QCOMPARE(tokenfab::quant_mix_file_type("F32"), std::optional<uint32_t>());
  QCOMPARE(tokenfab::quant_mix_file_type("q4_k"), std::optional<uint32_t>());
  for (const std::string& name : tokenfab::quant_mix_names())
    QCOMPARE(tokenfab::gguf::file_type_name(*tokenfab::quant_mix_file_type(name)), name);
  QVERIFY(tokenfab::quant_mix_names_text().starts_with("F16, BF16, Q8_0, Q6_K"));

  using tokenfab::quant_fallback;
  QCOMPARE(quant_fallback(TensorType::Q4_K, 4096), TensorType::Q4_K);
  QCOMPARE(quant_fallback(TensorType::Q2_K, 576), TensorType::Q4_0);
  QCOMPARE(quant_fallback(TensorType::Q3_K, 576), TensorType::Q4_0);
  QCOMPARE(quant_fallback(TensorType::Q4_K, 576), TensorType::Q5_0);
  QCOMPARE(quant_fallback(TensorType::Q5_K, 576), TensorType::Q5_1);
  QCOMPARE(quant_fallback(TensorType::Q6_K, 576), TensorType::Q8_0);
  QCOMPARE(quant_fallback(TensorType::IQ4_XS, 576), TensorType::IQ4_NL);
  QCOMPARE(quant_fallback(TensorType::Q4_K, 100), TensorType::F16);  // not even 32 divides it
  QCOMPARE(quant_fallback(TensorType::Q8_0, 100), TensorType::F16);
}

void QuantMixTest::refuses_what_it_does_not_define() {
  MixModel model = model_from(golden_["models"].toArray()[0].toObject());
  try {
    tokenfab::quant_mix(model, 19);  // IQ2_XXS: needs an importance matrix
    QFAIL("IQ2_XXS must be refused");
  } catch (const tokenfab::Error& e) {
    QVERIFY2(std::string(e.what()).find("no quantization mixture IQ2_XXS (expected F16, BF16") !=
                 std::string::npos,
             e.what());
  }
  model.architecture = "gemma3";
  QVERIFY_THROWS_EXCEPTION(tokenfab::Error, tokenfab::quant_mix(model, 15));
}

// requantize_mix gives every matrix its tensor's type in the mixture (a tied LM head
// token_embd.weight's), keeps the embedding lookup's rows, changes the values by no more than
// the new type's rounding, and the model computes.
void QuantMixTest::requantize_in_memory_follows_the_mix() {
  QTemporaryDir dir;
  QVERIFY(dir.isValid());
  for (const bool tied : {true, false}) {
    const auto model = small_model(dir, tied);
    const MixModel mix_model = MixModel::from_gguf(model->file());
    const std::vector<TensorType> mix = tokenfab::quant_mix(mix_model, 15);  // Q4_K_M
    std::map<std::string, WeightType> want;
    for (size_t i = 0; i < mix.size(); ++i)
      if (const auto type = tokenfab::kernel_type_of(mix[i]))
        want[mix_model.tensors[i].name] = *type;
    const std::vector<float> before = first_row(model->layers()[0].wq);

    model->requantize_mix(15, 2);
    for (const auto& l : model->layers())
      for (const tokenfab::WeightMatrix* m :
           {&l.wq, &l.wk, &l.wv, &l.wo, &l.w_gate, &l.w_up, &l.w_down})
        QCOMPARE(m->type, want.at(m->name));
    QCOMPARE(model->output().type, want.at(tied ? "token_embd.weight" : "output.weight"));
    QCOMPARE(model->token_embedding().type, WeightType::Q8_0);  // the lookup reads the file's rows
    // Layer 0's attn_v is Q4_K → Q5_0 (576 wide), layer 1's (use_more_bits) Q6_K → Q8_0; ffn_down
    // (1536 wide) keeps its K-quants.
    QCOMPARE(model->layers()[0].wv.type, WeightType::Q5_0);
    QCOMPARE(model->layers()[1].wv.type, WeightType::Q8_0);
    QCOMPARE(model->layers()[0].w_down.type, WeightType::Q4_K);
    QCOMPARE(model->layers()[1].w_down.type, WeightType::Q6_K);

    const std::vector<float> after = first_row(model->layers()[0].wq);  // Q8_0 → Q5_0
    double err = 0.0, norm = 0.0;
    for (size_t i = 0; i < before.size(); ++i) {
      err += (after[i] - before[i]) * (after[i] - before[i]);
      norm += before[i] * before[i];
    }
    QVERIFY2(err < 0.01 * norm, qPrintable(QString::number(std::sqrt(err / norm))));
    QVERIFY(computes(*model));
  }
}

// The study's names: f16 and the 32-element types put every matrix, the LM head included, in that
// type; the K-quant names and iq4_xs are llama-quantize's mixtures; others are refused, listed.
void QuantMixTest::target_quants_are_single_types_or_mixtures() {
  const std::vector<std::string>& names = tokenfab::target_quant_names();
  QCOMPARE(names.size(), size_t{18});
  QCOMPARE(names.front(), std::string("native"));
  QCOMPARE(names.back(), std::string("q2_k"));
  QTemporaryDir dir;
  QVERIFY(dir.isValid());

  auto model = small_model(dir, true);
  tokenfab::requantize_target(*model, "q4_0", 2);
  QCOMPARE(model->output().type, WeightType::Q4_0);
  QCOMPARE(model->layers()[1].w_down.type, WeightType::Q4_0);

  model = small_model(dir, true);
  tokenfab::requantize_target(*model, "q2_k", 2);
  QCOMPARE(model->output().type, WeightType::Q8_0);  // Q6_K does not fit 576: Q8_0
  QCOMPARE(model->layers()[1].w_down.type, WeightType::Q3_K);
  QCOMPARE(model->layers()[1].wo.type, WeightType::Q4_0);  // Q3_K → Q4_0 (576 wide)
  QVERIFY(computes(*model));

  model = small_model(dir, true);
  tokenfab::requantize_target(*model, "native", 2);
  QCOMPARE(model->layers()[0].wq.type, WeightType::Q8_0);
  try {
    tokenfab::requantize_target(*model, "q4_k", 2);
    QFAIL("q4_k must be refused");
  } catch (const tokenfab::Error& e) {
    QVERIFY2(std::string(e.what()).find("--target-quant q4_k: expected native, f16, q8_0, q6_k") !=
                 std::string::npos,
             e.what());
  }
  // Uniform super-blocks where they fit, the fallback where they do not; BF16 is not a target.
  model = small_model(dir, true);
  model->requantize(WeightType::Q4_K, 2);
  QCOMPARE(model->layers()[0].wq.type, WeightType::Q5_0);
  QCOMPARE(model->layers()[0].w_down.type, WeightType::Q4_K);
  QVERIFY_THROWS_EXCEPTION(tokenfab::Error, model->requantize(WeightType::BF16));
}

QTEST_GUILESS_MAIN(QuantMixTest)
#include "test_quant_mix.moc"
