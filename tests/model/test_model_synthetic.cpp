// Synthetic models (core/model/synthetic_model.h): the file describes itself and loads, and the
// forward pass matches a plain-loop reference in every weight type the kernels support (the
// super-block types on a shape whose rows divide into 256).

#include <QTemporaryDir>
#include <cmath>
#include <fstream>
#include <iterator>

#include "core/gguf/gguf_reader.h"
#include "core/gguf/gguf_writer.h"
#include "core/model/llama_forward.h"
#include "core/model/synthetic_model.h"
#include "core/tokenizer/chat_template.h"
#include "tests/model/model_test.h"
#include "tests/model/reference_forward.h"

using tokenfab::KvCache;
using tokenfab::LlamaForward;
using tokenfab::LlamaModel;
using tokenfab::LogitsFor;
using tokenfab::SyntheticShape;
using tokenfab::kernels::WeightType;

Q_DECLARE_METATYPE(WeightType)

namespace {

// The 135M shape cut to 2 layers and a 512-token vocabulary: every op and head layout of the
// real shape (576 wide, 9 query heads sharing 3 KV heads of 64), a fraction of the work.
SyntheticShape small_shape(bool tied_output) {
  SyntheticShape s = SyntheticShape::smollm2_135m();
  s.name = "smollm2-135m-2l";
  s.n_layer = 2;
  s.n_vocab = 512;
  s.n_ctx = 256;
  s.tied_output = tied_output;
  return s;
}

// The super-block types need rows that divide into 256: the llama-mini shape (512 wide, 8 query
// heads sharing 2 KV heads of 64, ff 1536) cut to 2 layers and a 512-token vocabulary.
SyntheticShape small_k_shape(bool tied_output) {
  SyntheticShape s = SyntheticShape::llama_mini();
  s.name = "llama-mini-2l";
  s.n_layer = 2;
  s.n_vocab = 512;
  s.n_ctx = 256;
  s.tied_output = tied_output;
  return s;
}

std::string file_bytes(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// A copy of the GGUF file `from` with the metadata value `key` replaced by `value`.
void write_with(const std::filesystem::path& from, const std::filesystem::path& to,
                const std::string& key, tokenfab::gguf::Value value) {
  const tokenfab::gguf::GgufFile file = tokenfab::gguf::GgufFile::open(from);
  tokenfab::gguf::GgufWriter w;
  for (const tokenfab::gguf::KeyValue& kv : file.metadata())
    w.add(kv.key, kv.key == key ? value : kv.value);
  for (const tokenfab::gguf::TensorInfo& t : file.tensors())
    w.add_tensor(t.name, t.type, t.dims, {t.data, t.n_bytes});
  w.write(to);
}

}  // namespace

// Counts a file can state but not back with tensors are refused with one message before the
// loader allocates anything for them (found by tests/fuzz: a block count of ~10^8 made the loader
// allocate ~10 GB of layer records; a head count of 2^32 became 0 and divided by it).
void ModelTest::hostile_counts_are_refused_before_allocating() {
  QTemporaryDir dir;
  QVERIFY(dir.isValid());
  const std::filesystem::path good = dir.filePath("good.gguf").toStdString();
  tokenfab::write_synthetic_llama(good, small_shape(true), WeightType::Q8_0, 7);
  const auto refused = [&](const std::string& key, tokenfab::gguf::Value value,
                           const std::string& message) {
    const std::filesystem::path bad = dir.filePath("bad.gguf").toStdString();
    write_with(good, bad, key, std::move(value));
    try {
      LlamaModel::load(bad);
      QFAIL(qPrintable(QString::fromStdString(key + " must be refused")));
    } catch (const tokenfab::Error& e) {
      QVERIFY2(std::string(e.what()).find(message) != std::string::npos, e.what());
    }
  };
  refused("llama.block_count", tokenfab::gguf::Value::u32(100'000'000),
          "llama.block_count is 100000000, but the file holds only 20 tensors (each layer has at "
          "least 6)");
  refused("llama.attention.head_count", tokenfab::gguf::Value::u64(uint64_t{1} << 32),
          "llama.attention.head_count is 4294967296, more than any model has");
  refused("llama.embedding_length", tokenfab::gguf::Value::i64(int64_t{1} << 40),
          "llama.embedding_length is 1099511627776, more than any model has");
  // The copy itself loads: only the replaced value was wrong.
  write_with(good, dir.filePath("same.gguf").toStdString(), "general.name",
             tokenfab::gguf::Value::string("copy"));
  QCOMPARE(LlamaModel::load(dir.filePath("same.gguf").toStdString())->hparams().n_layer,
           int64_t{2});
}

void ModelTest::synthetic_file_describes_itself() {
  const SyntheticShape s135 = SyntheticShape::smollm2_135m();
  QCOMPARE(s135.n_vocab, int64_t{49152});
  QCOMPARE(s135.n_layer, int64_t{30});
  QCOMPARE(s135.n_kv_head, 3);
  const SyntheticShape s8b = SyntheticShape::llama3_8b();
  QCOMPARE(s8b.n_vocab, int64_t{128256});
  QCOMPARE(s8b.n_ff, int64_t{14336});
  QCOMPARE(s8b.n_kv_head, 8);

  QTemporaryDir dir;
  QVERIFY(dir.isValid());
  const std::filesystem::path a = dir.filePath("a.gguf").toStdString();
  const std::filesystem::path b = dir.filePath("b.gguf").toStdString();
  const std::filesystem::path c = dir.filePath("c.gguf").toStdString();
  const SyntheticShape shape = small_shape(true);
  tokenfab::write_synthetic_llama(a, shape, WeightType::Q4_1, 7);
  tokenfab::write_synthetic_llama(b, shape, WeightType::Q4_1, 7);
  tokenfab::write_synthetic_llama(c, shape, WeightType::Q4_1, 8);
  QVERIFY2(file_bytes(a) == file_bytes(b), "the same seed must give the same file");
  QVERIFY2(file_bytes(a) != file_bytes(c), "another seed must give other weights");

  const auto model = LlamaModel::load(a);
  const auto& file = model->file();
  QCOMPARE(file.get("general.name").as_string(),
           std::string("synthetic smollm2-135m-2l (random weights)"));
  QVERIFY(file.get("tokenfab.synthetic").as_bool());
  QCOMPARE(model->hparams().n_vocab, int64_t{512});
  QCOMPARE(model->hparams().n_kv_head, 3);
  QVERIFY(model->output_is_tied());

  const tokenfab::Tokenizer tok = tokenfab::Tokenizer::from_gguf(file);
  QCOMPARE(tok.n_vocab(), 512);
  const std::string text = "Hello, wörld!\n";
  const auto ids = tok.encode(text, false, false);
  QCOMPARE(ids.size(), text.size());  // bytes only, no merges
  QCOMPARE(tok.decode(ids), text);
  const auto im_end = tok.find_token("<|im_end|>");
  QCOMPARE(im_end, 2);
  QVERIFY(tok.is_end_of_generation(im_end));
  QCOMPARE(tok.encode("<|im_start|>", false, true), (std::vector<tokenfab::TokenId>{1}));
  const auto chat = tokenfab::ChatTemplate::from_gguf(file);
  QVERIFY(chat.default_system_prompt().has_value());

  // A type the kernels lack (IQ2_XXS: a valid ggml type, needing an importance matrix to make)
  // is written (zero blocks) and refused by the loader, naming the tensor and the type.
  const std::filesystem::path k = dir.filePath("iq2_xxs.gguf").toStdString();
  tokenfab::write_synthetic_llama(k, shape, WeightType::Q4_1, 7,
                                  tokenfab::gguf::TensorType::IQ2_XXS);
  QCOMPARE(tokenfab::gguf::GgufFile::open(k).tensor(tokenfab::kSyntheticOverrideTensor).type,
           tokenfab::gguf::TensorType::IQ2_XXS);
  try {
    LlamaModel::load(k);
    QFAIL("an IQ2_XXS tensor must be refused");
  } catch (const tokenfab::Error& e) {
    QVERIFY2(std::string(e.what()).find("tensor blk.0.ffn_down.weight has type IQ2_XXS, which "
                                        "tokenfab cannot compute on (supported: F32, F16") !=
                 std::string::npos,
             e.what());
  }

  // A super-block type where 256 does not divide the rows (576 wide) falls back as llama-quantize
  // does (Q4_K → Q5_0); ffn_down's 1536-element rows keep Q4_K.
  const std::filesystem::path q4k = dir.filePath("q4_k.gguf").toStdString();
  tokenfab::write_synthetic_llama(q4k, shape, WeightType::Q4_K, 7);
  const auto fallback = LlamaModel::load(q4k);
  QCOMPARE(fallback->layers()[0].wq.type, WeightType::Q5_0);
  QCOMPARE(fallback->layers()[0].w_down.type, WeightType::Q4_K);
  QCOMPARE(fallback->output().type, WeightType::Q5_0);
  QCOMPARE(fallback->file().get("general.file_type").as_int(), int64_t{14});  // Q4_K_S: mostly Q4_K
}

void ModelTest::synthetic_matches_reference_data() {
  // Tolerances on max |logit - reference| over 7 positions × 512 logits whose RMS is ~0.48
  // (weights normal(0, 0.02) over 576 inputs), each ~2× the largest deviation measured:
  // - F32 / F16 / BF16: the kernels multiply f32 activations by the very weights the reference
  //   reads, so only the fp16 K/V cache (and f32 vs double sums) separate them. Measured
  //   4e-4 .. 5.2e-4 (7e-7 while the cache was f32).
  // - Q8_0 / Q4_0 / Q4_1: the kernels also round every matmul input to 8 bits per block of 32
  //   (Q8A) for integer dot products. Measured 0.021 .. 0.032 (~6% of the RMS) over several
  //   kernel revisions. A wrong block layout, scale or minimum moves logits by about their RMS.
  // - Q5_0 / Q5_1 / IQ4_NL and the super-block types Q2_K … Q6_K / IQ4_XS: the same Q8A inputs.
  //   Measured 0.019 .. 0.027 (AVX-512 VNNI, AVX2 and scalar kernels alike).
  QTest::addColumn<WeightType>("type");
  QTest::addColumn<double>("tolerance");
  QTest::newRow("F32") << WeightType::F32 << 1e-3;
  QTest::newRow("F16") << WeightType::F16 << 1e-3;
  QTest::newRow("BF16") << WeightType::BF16 << 1e-3;
  QTest::newRow("Q8_0") << WeightType::Q8_0 << 0.06;
  QTest::newRow("Q4_0") << WeightType::Q4_0 << 0.06;
  QTest::newRow("Q4_1") << WeightType::Q4_1 << 0.06;
  // The types added with the K-quants, on the same Q8A activations: Q5_0, Q5_1 and IQ4_NL on the
  // 576-wide shape, the super-block types on the 512-wide one (small_k_shape).
  QTest::newRow("Q5_0") << WeightType::Q5_0 << 0.06;
  QTest::newRow("Q5_1") << WeightType::Q5_1 << 0.06;
  QTest::newRow("IQ4_NL") << WeightType::IQ4_NL << 0.06;
  QTest::newRow("Q2_K") << WeightType::Q2_K << 0.06;
  QTest::newRow("Q3_K") << WeightType::Q3_K << 0.06;
  QTest::newRow("Q4_K") << WeightType::Q4_K << 0.06;
  QTest::newRow("Q5_K") << WeightType::Q5_K << 0.06;
  QTest::newRow("Q6_K") << WeightType::Q6_K << 0.06;
  QTest::newRow("IQ4_XS") << WeightType::IQ4_XS << 0.06;
}

// Prefill 5 tokens (the many-row kernels), then decode 2 one at a time (the one-row kernels):
// the logits at all 7 positions match the plain-loop reference (reference_forward.cpp). The LM
// head is tied for half of the types and a separate output.weight for the others.
void ModelTest::synthetic_matches_reference() {
  QFETCH(WeightType, type);
  QFETCH(double, tolerance);
  QTemporaryDir dir;
  QVERIFY(dir.isValid());
  const std::filesystem::path path = dir.filePath("synthetic.gguf").toStdString();
  const bool tied = type == WeightType::F32 || type == WeightType::BF16 ||
                    type == WeightType::Q4_0 || type == WeightType::Q5_1 ||
                    type == WeightType::Q3_K || type == WeightType::Q5_K ||
                    type == WeightType::IQ4_XS;
  const bool super_blocks = tokenfab::kernels::block_elements(type) == tokenfab::kernels::kQK_K;
  const SyntheticShape shape = super_blocks ? small_k_shape(tied) : small_shape(tied);
  tokenfab::write_synthetic_llama(path, shape, type, 1234 + static_cast<int>(type));
  const auto model = LlamaModel::load(path);
  QCOMPARE(model->output_is_tied(), tied);
  QCOMPARE(model->layers()[0].wq.type, type);
  QCOMPARE(model->layers()[1].w_down.type, type);
  QCOMPARE(model->output().type, type);

  const std::vector<int32_t> tokens = {1, 72, 101, 108, 300, 511, 3};
  const int64_t n_vocab = model->hparams().n_vocab;
  LlamaForward forward(*model, *pool_);
  KvCache cache = forward.make_cache();
  std::vector<float> ours;  // (7, n_vocab)
  std::vector<float> step;  // (1, n_vocab)
  forward.forward(std::span(tokens).first(5), cache, LogitsFor::AllTokens, ours);
  for (size_t i = 5; i < tokens.size(); ++i) {
    forward.forward(std::span(tokens).subspan(i, 1), cache, LogitsFor::LastToken, step);
    ours.insert(ours.end(), step.begin(), step.end());
  }
  const std::vector<double> want = tokenfab::test::reference_logits(model->file(), tokens);
  QCOMPARE(static_cast<int64_t>(want.size()), 7 * n_vocab);
  QCOMPARE(ours.size(), want.size());

  double worst = 0.0, sum_sq = 0.0;
  for (size_t i = 0; i < want.size(); ++i) {
    worst = std::max(worst, std::abs(ours[i] - want[i]));
    sum_sq += want[i] * want[i];
  }
  const double rms = std::sqrt(sum_sq / static_cast<double>(want.size()));
  qInfo("%s: max |logit - reference| %.3g (tolerance %.0e); reference RMS %.3f",
        tokenfab::kernels::weight_type_name(type), worst, tolerance, rms);
  QVERIFY(rms > 0.1);  // the comparison is not between near-zero numbers
  QVERIFY(worst <= tolerance);
}
