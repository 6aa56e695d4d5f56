// tokenfab-cli as a user runs it (QProcess on the built binary): the JSON contracts of each
// subcommand, and one clear message with a non-zero exit for each kind of bad input. Cases that
// run a model use the embedded SmolLM2-135M-Instruct (they fail, naming `tokenfab-cli fetch`, when
// it is absent) or small synthetic models written here.

#include <QJsonArray>
#include <QJsonDocument>
#include <QJsonObject>
#include <QProcess>
#include <QFile>
#include <QTemporaryDir>
#include <QtTest>
#include <filesystem>
#include <fstream>
#include <map>

#include "core/gguf/gguf_writer.h"
#include "core/model/model_files.h"
#include "core/model/quant_mix.h"
#include "core/model/synthetic_model.h"

namespace {

const QString kCli = QStringLiteral(TOKENFAB_BINARY_DIR "/bin/tokenfab-cli");
const QString kPerplexityText = QStringLiteral(TOKENFAB_SOURCE_DIR "/tests/data/perplexity_en.txt");
constexpr int kTimeoutMs = 120'000;

struct CliRun {
  int exit_code = -1;
  bool finished = false;
  QByteArray out;
  QByteArray err;
};

CliRun run_cli(const QStringList& args) {
  QProcess p;
  p.start(kCli, args);
  CliRun r;
  r.finished = p.waitForFinished(kTimeoutMs) && p.exitStatus() == QProcess::NormalExit;
  if (!r.finished) p.kill();
  r.exit_code = p.exitCode();
  r.out = p.readAllStandardOutput();
  r.err = p.readAllStandardError();
  return r;
}

// Overwrites bytes of the file at `path` from `offset` on.
void patch_file(const std::string& path, uint64_t offset, const std::string& bytes) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  f.seekp(static_cast<std::streamoff>(offset));
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

// The file offset of tensor `name`'s data, and of its dims[0] in the tensor infos (the name's
// bytes are followed by n_dims, a u32, then the dims, u64 each).
uint64_t data_offset(const std::string& path, const std::string& name) {
  const tokenfab::gguf::GgufFile f = tokenfab::gguf::GgufFile::open(path);
  return static_cast<uint64_t>(f.tensor(name).data - f.bytes().data());
}
uint64_t dims_offset(const std::string& path, const std::string& name) {
  std::ifstream in(path, std::ios::binary);
  const std::string bytes{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  return bytes.find(name) + name.size() + 4;
}

// The bad block cases: a 1-layer Llama 256 wide whose matrices are all Q4_K (its own
// output.weight, the last tensor of the file).
void write_q4_k_model(const std::string& path) {
  tokenfab::SyntheticShape shape{"tiny-k", 512, 256, 256, 1, 2, 1, 128};
  shape.tied_output = false;
  tokenfab::write_synthetic_llama(path, shape, tokenfab::kernels::WeightType::Q4_K, 1);
}

QString describe(const QStringList& args, const CliRun& r) {
  return QString("tokenfab-cli %1\n  exit %2\n  stdout: %3\n  stderr: %4")
      .arg(args.join(' '))
      .arg(r.exit_code)
      .arg(QString::fromUtf8(r.out.left(400)), QString::fromUtf8(r.err.left(400)));
}

}  // namespace

class CliTest : public QObject {
  Q_OBJECT

 private slots:
  void initTestCase();

  void info_json();
  void info_describes_files_it_cannot_run();
  void tokenize_json();
  void detokenize_text();
  void generate_json();
  void generate_is_identical_in_every_mode();
  void serve_bench_json();
  void bench_json();
  void batch_bench_json();
  void perplexity_json();
  void perplexity_llama_cpp_convention();
  void synth_json();
  void quantize_json();
  void quantize_q8_0_keeps_the_perplexity();
  void devices_json();
  void heads_eval_names_its_devices();
  void fetch_takes_any_destination();
  void fetch_list();
  void fetch_gemma_needs_the_license();
  void fetch_failure_leaves_nothing();
  void fetch_pins_the_hashes_of_model_files();
  void models_json();

  void bad_input_data();
  void bad_input();

 private:
  // Runs `args` with --json; checks exit 0 and that stdout is exactly one line holding one JSON
  // object (no log line leaked there). Returns the object.
  QJsonObject run_json(const QStringList& args);
  bool require_model();

  QTemporaryDir dir_;
  QString model_error_;
  QString garbage_;    // a file that is not GGUF
  QString gpt2_;       // a GGUF file of architecture gpt2
  QString iq2_xxs_;    // a synthetic model with one IQ2_XXS matrix (a type Tokenfab lacks)
  QString k_rows_;     // a Q4_K matrix whose rows of 288 do not divide into 256-element blocks
  QString nan_scale_;  // a Q4_K super-block whose d is NaN
  QString truncated_;  // a Q4_K model cut short inside its last super-block
};

void CliTest::initTestCase() {
  QVERIFY2(QFile::exists(kCli), qPrintable(kCli + " is not built"));
  QVERIFY(dir_.isValid());
  const auto model = tokenfab::default_model_path();
  if (!std::filesystem::exists(model))
    model_error_ = QString::fromStdString("the model file " + model.string() +
                                          " is missing; fetch it with `tokenfab-cli fetch`");

  garbage_ = dir_.filePath("garbage.gguf");
  std::ofstream(garbage_.toStdString()) << "this is plain text, not a GGUF model\n";

  gpt2_ = dir_.filePath("gpt2.gguf");
  tokenfab::gguf::GgufWriter w;
  w.add("general.architecture", tokenfab::gguf::Value::string("gpt2"));
  w.add("gpt2.block_count", tokenfab::gguf::Value::u32(1));
  const std::vector<float> zeros(64, 0.0f);
  w.add_tensor("token_embd.weight", tokenfab::gguf::TensorType::F32, {32, 2},
               {reinterpret_cast<const uint8_t*>(zeros.data()), zeros.size() * sizeof(float)});
  w.write(gpt2_.toStdString());

  iq2_xxs_ = dir_.filePath("iq2_xxs.gguf");
  tokenfab::SyntheticShape shape{"tiny", 512, 64, 256, 1, 2, 1, 128};
  tokenfab::write_synthetic_llama(iq2_xxs_.toStdString(), shape,
                                  tokenfab::kernels::WeightType::Q8_0, 1,
                                  tokenfab::gguf::TensorType::IQ2_XXS);

  k_rows_ = dir_.filePath("k_rows.gguf");
  write_q4_k_model(k_rows_.toStdString());
  const uint64_t dims = dims_offset(k_rows_.toStdString(), "blk.0.attn_q.weight");
  patch_file(k_rows_.toStdString(), dims, std::string("\x20\x01\0\0\0\0\0\0", 8));  // 288
  nan_scale_ = dir_.filePath("nan_scale.gguf");
  write_q4_k_model(nan_scale_.toStdString());
  // Row 1 of ffn_down (one 144-byte super-block a row): its fp16 d, the block's first field.
  const uint64_t row1 = data_offset(nan_scale_.toStdString(), "blk.0.ffn_down.weight") + 144;
  patch_file(nan_scale_.toStdString(), row1, std::string("\x00\x7e", 2));  // 0x7e00: NaN
  truncated_ = dir_.filePath("truncated.gguf");
  write_q4_k_model(truncated_.toStdString());
  std::filesystem::resize_file(truncated_.toStdString(),
                               std::filesystem::file_size(truncated_.toStdString()) - 100);
}

bool CliTest::require_model() {
  if (model_error_.isEmpty()) return true;
  QTest::qFail(qPrintable(model_error_), __FILE__, __LINE__);
  return false;
}

QJsonObject CliTest::run_json(const QStringList& args) {
  const CliRun r = run_cli(args + QStringList{"--json"});
  const QString what = describe(args, r);
  [&] {
    QVERIFY2(r.finished && r.exit_code == 0, qPrintable(what));
    QVERIFY2(r.out.endsWith('\n') && r.out.count('\n') == 1, qPrintable("not one line: " + what));
  }();
  QJsonParseError error;
  const QJsonDocument doc = QJsonDocument::fromJson(r.out, &error);
  if (!doc.isObject()) {
    QTest::qFail(qPrintable("stdout is not a JSON object (" + error.errorString() + "): " + what),
                 __FILE__, __LINE__);
    return {};
  }
  return doc.object();
}

#define REQUIRE_MODEL()           \
  do {                            \
    if (!require_model()) return; \
  } while (false)

// After run_json(): stop the test function when it already failed.
#define RETURN_IF_FAILED()                  \
  do {                                      \
    if (QTest::currentTestFailed()) return; \
  } while (false)

void CliTest::info_json() {
  REQUIRE_MODEL();
  const QJsonObject j = run_json({"info"});
  RETURN_IF_FAILED();
  QCOMPARE(j["architecture"].toString(), QString("llama"));
  QCOMPARE(j["n_layer"].toInt(), 30);
  QVERIFY(j["tensor_count"].toInt() > 0);
  QCOMPARE(j["sha256"].toString(), QString(tokenfab::EmbeddedModel::kSha256));
  QVERIFY(j["runnable"].toBool());
  // Every tensor with its type; the mix and the bits per weight add up to them.
  const QJsonArray tensors = j["tensors"].toArray();
  QCOMPARE(tensors.size(), j["tensor_count"].toInt());
  double bytes = 0, elements = 0;
  std::map<QString, double> bytes_by_type;
  for (const QJsonValue& t : tensors) {
    const QJsonObject o = t.toObject();
    double n = 1;
    for (const QJsonValue& d : o["shape"].toArray()) n *= d.toDouble();
    elements += n;
    bytes += o["bytes"].toDouble();
    bytes_by_type[o["type"].toString()] += o["bytes"].toDouble();
  }
  QCOMPARE(j["bits_per_weight"].toDouble(), 8 * bytes / elements);
  const QJsonObject mix = j["type_mix"].toObject();
  QCOMPARE(static_cast<size_t>(mix.size()), bytes_by_type.size());
  for (const auto& [type, b] : bytes_by_type) QCOMPARE(mix[type].toObject()["bytes"].toDouble(), b);
  // The embedded file's own statement of its quantization, and its matrices' types.
  QCOMPARE(j["file_type"].toString(), QString("Q4_1"));
  QVERIFY(mix.contains("Q4_1") && mix.contains("Q8_0") && mix.contains("F32"));
}

// Any valid GGUF file is described, also one Tokenfab cannot run, which says why.
void CliTest::info_describes_files_it_cannot_run() {
  const QJsonObject j = run_json({"info", "--model", gpt2_});
  RETURN_IF_FAILED();
  QCOMPARE(j["architecture"].toString(), QString("gpt2"));
  QCOMPARE(j["runnable"].toBool(), false);
  QVERIFY2(j["not_runnable_because"].toString().contains("unsupported architecture 'gpt2'"),
           qPrintable(j["not_runnable_because"].toString()));
  QCOMPARE(j["n_layer"].toInt(), 1);
  QCOMPARE(j["tensors"].toArray().size(), 1);
  QCOMPARE(j["tensors"].toArray()[0].toObject()["type"].toString(), QString("F32"));
  QCOMPARE(j["bits_per_weight"].toDouble(), 32.0);
}

void CliTest::tokenize_json() {
  REQUIRE_MODEL();
  const QJsonObject j = run_json({"tokenize", "--text", "Hello"});
  RETURN_IF_FAILED();
  QCOMPARE(j, (QJsonObject{{"ids", QJsonArray{19556}}}));
}

void CliTest::detokenize_text() {
  REQUIRE_MODEL();
  const CliRun r = run_cli({"detokenize", "--ids", "19556"});
  QVERIFY2(r.finished && r.exit_code == 0, qPrintable(describe({"detokenize"}, r)));
  QCOMPARE(r.out, QByteArray("Hello\n"));
}

void CliTest::generate_json() {
  REQUIRE_MODEL();
  const QJsonObject j = run_json({"generate", "--prompt", "The capital of France is",
                                  "--temperature", "0", "--max-tokens", "8", "--threads", "2"});
  RETURN_IF_FAILED();
  for (const char* key :
       {"text", "ids", "prompt_tokens", "output_tokens", "ttft_ms", "decode_tok_s"})
    QVERIFY2(j.contains(key), key);
  QVERIFY(j["text"].isString());
  QVERIFY(j["text"].toString().contains("Paris"));
  QCOMPARE(j["ids"].toArray().size(), j["output_tokens"].toInt());
  QCOMPARE(j["prompt_tokens"].toInt(), 5);
  QVERIFY(j["output_tokens"].toInt() >= 1 && j["output_tokens"].toInt() <= 8);
  QVERIFY(j["ttft_ms"].toDouble() > 0.0);
  QVERIFY(j["decode_tok_s"].isDouble());
}

// --temperature 0 through the engine: one device, two colocated devices, prefill on cpu:0 with
// the KV moved to cpu:1 for decode, and cpu:0's two partitions handing the KV over without a copy
// all give the same tokens.
void CliTest::generate_is_identical_in_every_mode() {
  REQUIRE_MODEL();
  const QStringList base = {"generate",
                            "--chat",
                            "Name three rivers in Europe.",
                            "--temperature",
                            "0",
                            "--max-tokens",
                            "24",
                            "--threads",
                            "2"};
  QJsonArray first;
  for (const QStringList& mode :
       {QStringList{"--devices", "cpu:0"}, QStringList{"--devices", "cpu:0,cpu:1"},
        QStringList{"--prefill", "cpu:0", "--decode", "cpu:1"},
        QStringList{"--prefill", "cpu:0", "--decode", "cpu:0"}}) {
    const QJsonObject j = run_json(base + mode);
    RETURN_IF_FAILED();
    QCOMPARE(j["mode"].toString(),
             QString(mode.first() == "--devices" ? "colocated" : "disaggregated"));
    if (first.isEmpty()) first = j["ids"].toArray();
    QVERIFY2(j["ids"].toArray() == first, qPrintable(mode.join(' ')));
  }
  QVERIFY(first.size() > 0);
}

// The serve-bench contract: exactly these keys (plus details), every request completed, latencies
// present, and in disaggregated mode the KV transfers counted.
void CliTest::serve_bench_json() {
  REQUIRE_MODEL();
  for (const QStringList& mode : {QStringList{"--devices", "cpu:0"},
                                  QStringList{"--prefill", "cpu:0", "--decode", "cpu:1"}}) {
    const QJsonObject j =
        run_json(QStringList{"serve-bench", "--requests", "6", "--concurrency", "3", "--prompt-len",
                             "40:80", "--long-every", "3", "--long-len", "200", "--max-tokens", "6",
                             "--threads", "2", "--seed", "3", "--no-record"} +
                 mode);
    RETURN_IF_FAILED();
    for (const char* key :
         {"requests", "completed", "failed", "preemptions", "duration_s", "throughput_tok_s",
          "ttft_ms", "itl_ms", "tpot_ms", "e2e_ms", "prefix_hit_rate", "transfer"})
      QVERIFY2(j.contains(key), key);
    QCOMPARE(j["requests"].toInt(), 6);
    QCOMPARE(j["completed"].toInt(), 6);
    QCOMPARE(j["failed"].toInt(), 0);
    QVERIFY(j["throughput_tok_s"].toDouble() > 0);
    for (const char* key : {"ttft_ms", "itl_ms", "tpot_ms", "e2e_ms"})
      for (const char* p : {"p50", "p95", "p99"})
        QVERIFY2(j[key].toObject()[p].toDouble() > 0, qPrintable(QString("%1.%2").arg(key, p)));
    const QJsonObject t = j["transfer"].toObject();
    if (mode.first() == "--prefill") {
      QCOMPARE(t["count"].toInt(), 6);
      QVERIFY(t["bytes"].toDouble() > 0);
      QVERIFY(t["gb_s"].toDouble() > 0);
    } else {
      QCOMPARE(t["count"].toInt(), 0);
    }
  }
  // --prompts: user messages from a file (api_bench.py --save-prompts), taken in turn.
  const QString prompts = dir_.filePath("prompts.json");
  QFile f(prompts);
  QVERIFY(f.open(QIODevice::WriteOnly));
  f.write(R"(["Name a color.", "What is two plus two?"])");
  f.close();
  const QJsonObject j =
      run_json(QStringList{"serve-bench", "--prompts", prompts, "--requests", "3", "--concurrency",
                           "2", "--max-tokens", "4", "--threads", "2", "--no-record"});
  RETURN_IF_FAILED();
  QCOMPARE(j["completed"].toInt(), 3);
  QCOMPARE(j["output_tokens"].toInt(), 12);
  QCOMPARE(j["workload"].toObject()["prompts_file"].toString(), prompts);
}

void CliTest::bench_json() {
  REQUIRE_MODEL();
  const QJsonObject j = run_json({"bench", "--prompt-tokens", "16", "--gen-tokens", "4",
                                  "--repetitions", "1", "--threads", "2"});
  RETURN_IF_FAILED();
  QVERIFY(j["prefill_tok_s"].toDouble() > 0.0);
  QVERIFY(j["decode_tok_s"].toDouble() > 0.0);
  QCOMPARE(j["threads"].toInt(), 2);
  QVERIFY(j["model"].toString().endsWith(tokenfab::EmbeddedModel::kFileName));
  QVERIFY(!j.contains("verify"));

  // --verify-rows: one entry per count, in the order given, each a measured step; the one-row
  // step is the unit of the ratios.
  const QJsonObject v = run_json({"bench", "--prompt-tokens", "16", "--gen-tokens", "2",
                                  "--repetitions", "1", "--threads", "2", "--verify-rows", "3,1"});
  RETURN_IF_FAILED();
  const QJsonArray rows = v["verify"].toArray();
  QCOMPARE(rows.size(), 2);
  QCOMPARE(rows[0].toObject()["rows"].toInt(), 3);
  QCOMPARE(rows[1].toObject()["rows"].toInt(), 1);
  for (const QJsonValue& r : rows) QVERIFY(r.toObject()["step_ms"].toDouble() > 0.0);
  QCOMPARE(rows[1].toObject()["vs_one_row"].toDouble(), 1.0);
  QCOMPARE(rows[0].toObject()["vs_one_row"].toDouble(),
           rows[0].toObject()["step_ms"].toDouble() / rows[1].toObject()["step_ms"].toDouble());
}

// Continuous batching end to end: every stream gets exactly its tokens, with a pool that fits
// them all and with one (6 blocks: all three prompts fit, their replies do not) that forces
// preemption.
void CliTest::batch_bench_json() {
  REQUIRE_MODEL();
  for (const QString& blocks : {QString("0"), QString("6")}) {
    const QJsonObject j = run_json({"batch-bench", "--streams", "3", "--prompt-tokens", "20",
                                    "--gen-tokens", "30", "--kv-blocks", blocks, "--threads", "2"});
    RETURN_IF_FAILED();
    QCOMPARE(j["output_tokens"].toInt(), 90);
    QVERIFY(j["throughput_tok_s"].toDouble() > 0.0);
    QVERIFY(j["steps"].toInt() >= 30);
    if (blocks == "6") QVERIFY(j["preemptions"].toInt() > 0);
  }
}

void CliTest::perplexity_json() {
  REQUIRE_MODEL();
  const QJsonObject j = run_json({"perplexity", "--file", kPerplexityText, "--threads", "2"});
  RETURN_IF_FAILED();
  // One window of 366 tokens (tests/data/forward_golden.json); the CLI counts the 365 it scores.
  QCOMPARE(j["tokens"].toInt(), 365);
  QCOMPARE(j["windows"].toInt(), 1);
  // The reference gives 36.96 (tools/reference_forward.py); test_model bounds it tightly.
  QVERIFY2(j["ppl"].toDouble() > 30.0 && j["ppl"].toDouble() < 45.0,
           qPrintable(QString::number(j["ppl"].toDouble())));
  QCOMPARE(j["convention"].toString(), QString("tokenfab"));
}

// --convention llama.cpp scores as llama-perplexity does: floor(text_tokens / ctx) full chunks,
// the tail dropped, and in each only the second half: positions ctx/2 … ctx−2 predict the next
// token, so chunks × (ctx − 1 − ⌊ctx/2⌋) scored tokens. The text has 365 tokens once its trailing
// '\n' is dropped (perplexity_json's 366-token window less that newline).
void CliTest::perplexity_llama_cpp_convention() {
  REQUIRE_MODEL();
  struct Case {
    int ctx, chunks, scored;
  };
  for (const Case c : {Case{128, 2, 2 * 63}, Case{121, 3, 3 * 60}}) {
    const QJsonObject j = run_json({"perplexity", "--file", kPerplexityText, "--threads", "2",
                                    "--convention", "llama.cpp", "--ctx", QString::number(c.ctx)});
    RETURN_IF_FAILED();
    QCOMPARE(j["convention"].toString(), QString("llama.cpp"));
    QCOMPARE(j["ctx"].toInt(), c.ctx);
    QCOMPARE(j["text_tokens"].toInt(), 365);
    QCOMPARE(j["chunks"].toInt(), c.chunks);
    QCOMPARE(j["tokens"].toInt(), c.scored);
    QVERIFY(j["ppl"].toDouble() > 1.0);
    QVERIFY(j["ppl_stderr"].toDouble() > 0.0 && j["ppl_stderr"].toDouble() < j["ppl"].toDouble());
  }
  // llama-perplexity refuses a text shorter than two windows; so does this convention.
  const CliRun r = run_cli(
      {"perplexity", "--file", kPerplexityText, "--convention", "llama.cpp", "--ctx", "512"});
  QVERIFY2(r.exit_code != 0 && r.err.contains("2 × --ctx = 1024"), qPrintable(describe({}, r)));
}

// `synth` writes a model that loads, runs and says it is synthetic.
void CliTest::synth_json() {
  const QString out = dir_.filePath("synth.gguf");
  const QJsonObject j =
      run_json({"synth", "--shape", "smollm2-135m", "--type", "q4_0", "--seed", "3", "--out", out});
  RETURN_IF_FAILED();
  QCOMPARE(j["path"].toString(), out);
  QCOMPARE(j["shape"].toString(), QString("smollm2-135m"));
  QCOMPARE(j["type"].toString(), QString("q4_0"));
  QCOMPARE(static_cast<qint64>(j["bytes"].toDouble()), QFileInfo(out).size());

  const QJsonObject info = run_json({"info", "--model", out});
  RETURN_IF_FAILED();
  QCOMPARE(info["name"].toString(), QString("synthetic smollm2-135m (random weights)"));
  QCOMPARE(info["n_layer"].toInt(), 30);
  QCOMPARE(info["n_vocab"].toInt(), 49152);
  QCOMPARE(info["tensor_types"].toObject()["Q4_0"].toInt(), 1 + 30 * 7);
  QCOMPARE(j["tensor_types"].toObject()["Q4_0"].toInt(), 1 + 30 * 7);

  const QJsonObject gen = run_json({"generate", "--model", out, "--chat", "hi", "--temperature",
                                    "0", "--max-tokens", "3", "--threads", "2"});
  RETURN_IF_FAILED();
  QVERIFY(gen["prompt_tokens"].toInt() > 0);

  // A super-block type: llama-mini's rows all divide into 256, so every matrix is Q4_K (on the
  // 576-wide smollm2-135m most would fall back to Q5_0, as llama-quantize does).
  const QJsonObject k = run_json(
      {"synth", "--shape", "llama-mini", "--type", "q4_k", "--out", dir_.filePath("mini.gguf")});
  RETURN_IF_FAILED();
  QCOMPARE(k["tensor_types"].toObject()["Q4_K"].toInt(), 2 + 16 * 7);
}

// `quantize` gives each tensor the type llama-quantize would (the mix module's choice, which
// test_quant_mix checks against llama-quantize's own), keeps every tensor's name and shape and
// every metadata key but the file type, and writes a model that runs.
void CliTest::quantize_json() {
  REQUIRE_MODEL();
  const auto in_path = tokenfab::default_model_path();
  const tokenfab::gguf::GgufFile in = tokenfab::gguf::GgufFile::open(in_path);
  const tokenfab::MixModel mix_model = tokenfab::MixModel::from_gguf(in);
  uint64_t in_bytes = 0, elements = 0;
  for (const auto& t : in.tensors()) in_bytes += t.n_bytes, elements += t.n_elements;
  for (const auto& [type, file_type] : {std::pair{"q4_k_m", 15u}, std::pair{"q8_0", 7u}}) {
    const QString out = dir_.filePath(QString("quantized.%1.gguf").arg(type));
    const QJsonObject j = run_json({"quantize", "--type", type, "--threads", "2",
                                    QString::fromStdString(in_path.string()), out});
    RETURN_IF_FAILED();
    QCOMPARE(j["type"].toString(), QString(type).toUpper());
    QCOMPARE(j["file_type"].toInt(), static_cast<int>(file_type));
    QCOMPARE(j["tensors"].toInt(), static_cast<int>(in.tensors().size()));
    QCOMPARE(static_cast<uint64_t>(j["bytes_in"].toDouble()), in_bytes);
    QCOMPARE(static_cast<qint64>(j["file_bytes"].toDouble()), QFileInfo(out).size());
    QCOMPARE(j["bits_per_weight"].toDouble(), 8 * j["bytes_out"].toDouble() / elements);
    QVERIFY(j["seconds"].toDouble() > 0 && j["mb_s"].toDouble() > 0);

    // `info` reads back the mix module's type for every tensor.
    const QJsonObject info = run_json({"info", "--model", out});
    RETURN_IF_FAILED();
    QVERIFY2(info["runnable"].toBool(), qPrintable(info["not_runnable_because"].toString()));
    QCOMPARE(info["file_type"].toString(), QString(type).toUpper());
    const std::vector<tokenfab::gguf::TensorType> want = tokenfab::quant_mix(mix_model, file_type);
    std::map<QString, QString> written;
    for (const QJsonValue& t : info["tensors"].toArray())
      written[t.toObject()["name"].toString()] = t.toObject()["type"].toString();
    QCOMPARE(written.size(), in.tensors().size());
    for (size_t i = 0; i < want.size(); ++i)
      QCOMPARE(written[QString::fromStdString(in.tensors()[i].name)],
               QString(tokenfab::gguf::tensor_type_name(want[i])));

    // Names, shapes and metadata kept; general.file_type states the new mixture.
    const tokenfab::gguf::GgufFile f = tokenfab::gguf::GgufFile::open(out.toStdString());
    for (size_t i = 0; i < in.tensors().size(); ++i) {
      QCOMPARE(f.tensors()[i].name, in.tensors()[i].name);
      QCOMPARE(f.tensors()[i].dims, in.tensors()[i].dims);
    }
    QCOMPARE(f.metadata().size(), in.metadata().size());
    for (const tokenfab::gguf::KeyValue& kv : in.metadata()) {
      const tokenfab::gguf::Value* v = f.find(kv.key);
      QVERIFY2(v != nullptr, kv.key.c_str());
      if (kv.key == "general.file_type")
        QCOMPARE(v->as_int(), static_cast<int64_t>(file_type));
      else
        QVERIFY2(*v == kv.value, kv.key.c_str());
    }

    const QJsonObject gen =
        run_json({"generate", "--model", out, "--prompt", "The capital of France is",
                  "--temperature", "0", "--max-tokens", "4", "--threads", "2"});
    RETURN_IF_FAILED();
    QCOMPARE(gen["output_tokens"].toInt(), 4);
  }
}

// A Q8_0 re-quantization of the Q4_1 file changes its perplexity by a fraction of a percent
// (measured 37.071 → 37.144 on tests/data/perplexity_en.txt, +0.2%): the requantized weights are
// the file's own values to within Q8_0's rounding.
void CliTest::quantize_q8_0_keeps_the_perplexity() {
  REQUIRE_MODEL();
  const QString out = dir_.filePath("perplexity.q8_0.gguf");
  run_json({"quantize", "--type", "Q8_0",
            QString::fromStdString(tokenfab::default_model_path().string()), out});
  RETURN_IF_FAILED();
  const QStringList args = {"perplexity", "--file", kPerplexityText, "--threads", "2"};
  const QJsonObject original = run_json(args);
  RETURN_IF_FAILED();
  const QJsonObject requantized = run_json(args + QStringList{"--model", out});
  RETURN_IF_FAILED();
  const double ratio = requantized["ppl"].toDouble() / original["ppl"].toDouble();
  qInfo("perplexity %.3f (Q4_1 file) → %.3f (Q8_0)", original["ppl"].toDouble(),
        requantized["ppl"].toDouble());
  QVERIFY2(ratio > 0.98 && ratio < 1.02, qPrintable(QString::number(ratio)));
}

// `devices --json`: the CPU and a GPU list, on any machine — with no GPU (or a build without
// CUDA) the list is empty and the cuda object says why.
void CliTest::devices_json() {
  const QJsonObject j = run_json({"devices"});
  RETURN_IF_FAILED();
  const QJsonObject cpu = j["cpu"].toObject();
  QVERIFY2(cpu["logical_cores"].toInt() > 0, "cpu.logical_cores");
  QVERIFY(cpu["simd"].isObject());
  QVERIFY(cpu["memory_total_bytes"].toDouble() > 0);
  QVERIFY(j["gpus"].isArray());
  QVERIFY(j["peer_access"].isArray());
  const QJsonArray gpus = j["gpus"].toArray();
  QCOMPARE(j["peer_access"].toArray().size(), gpus.size());
  const QJsonObject cuda = j["cuda"].toObject();
  QVERIFY(cuda["built"].isBool());
  if (gpus.isEmpty()) {
    QVERIFY2(!cuda["reason"].toString().isEmpty(), "an empty GPU list must say why");
  } else {
    for (const QJsonValue& g : gpus) {
      QVERIFY(g.toObject()["memory_total_bytes"].toDouble() > 0);
      QVERIFY(g.toObject()["sm_count"].toInt() > 0);
    }
  }
}

// heads eval generates on the devices it is given (the engine's options) and says which: here
// the context lookup alone, on two partitions of cpu:0.
void CliTest::heads_eval_names_its_devices() {
  REQUIRE_MODEL();
  const QJsonObject j =
      run_json({"heads", "eval", "--head", "none", "--lookup", "3", "--prompt-set", "code",
                "--max-prompts", "1", "--max-tokens", "8", "--threads", "2", "--prefill", "cpu:0",
                "--decode", "cpu:0", "--no-record"});
  RETURN_IF_FAILED();
  QCOMPARE(j["devices"].toString(), QStringLiteral("prefill cpu:0, decode cpu:0"));
  QCOMPARE(j["prompts"].toInt(), 1);
  QVERIFY(j["lossless"].toBool());
  QVERIFY(j["decode_tok_s"].toDouble() > 0.0);
}

// `fetch --dest DIR` and `$TOKENFAB_HOME` reach the fetcher as one argument, whatever they hold:
// a directory named with quotes and a command substitution is used as it is, and nothing in its
// name runs. The model is already there (a link to the cached file), so nothing is downloaded.
void CliTest::fetch_takes_any_destination() {
  REQUIRE_MODEL();
  const std::filesystem::path work = dir_.filePath("fetch").toStdString();
  const std::string hostile = "it's \"$(touch injected)\"'; touch injected; '";
  const std::filesystem::path dest = work / hostile;
  const std::filesystem::path home = work / ("home " + hostile);
  for (const auto& models : {dest, home / "models"}) {
    std::filesystem::create_directories(models);
    std::filesystem::create_symlink(tokenfab::default_model_path(),
                                    models / tokenfab::EmbeddedModel::kFileName);
  }
  const auto fetch = [&](const QStringList& args, const std::filesystem::path& tokenfab_home) {
    QProcess p;
    QProcessEnvironment env = QProcessEnvironment::systemEnvironment();
    env.insert("TOKENFAB_HOME", QString::fromStdString(tokenfab_home.string()));
    p.setProcessEnvironment(env);
    p.setWorkingDirectory(QString::fromStdString(work.string()));
    p.start(kCli, args);
    CliRun r;
    r.finished = p.waitForFinished(kTimeoutMs) && p.exitStatus() == QProcess::NormalExit;
    r.exit_code = p.exitCode();
    r.out = p.readAllStandardOutput();
    r.err = p.readAllStandardError();
    return r;
  };
  const QStringList with_dest = {"fetch", "--dest", QString::fromStdString(dest.string())};
  CliRun r = fetch(with_dest, work);
  QVERIFY2(r.finished && r.exit_code == 0, qPrintable(describe(with_dest, r)));
  QCOMPARE(QString::fromUtf8(r.out).trimmed(),
           QString::fromStdString((dest / tokenfab::EmbeddedModel::kFileName).string()));
  r = fetch({"fetch"}, home);
  QVERIFY2(r.finished && r.exit_code == 0, qPrintable(describe({"fetch"}, r)));
  QCOMPARE(QString::fromUtf8(r.out).trimmed(),
           QString::fromStdString((home / "models" / tokenfab::EmbeddedModel::kFileName).string()));
  QVERIFY2(!std::filesystem::exists(work / "injected"), "a destination's name ran as a command");
}

// tokenfab-cli with `env` over the system environment (a name mapped to "" is removed), in `cwd`.
static CliRun run_cli_env(const QStringList& args, const std::map<QString, QString>& env) {
  QProcess p;
  QProcessEnvironment e = QProcessEnvironment::systemEnvironment();
  for (const auto& [name, value] : env) {
    if (value.isEmpty())
      e.remove(name);
    else
      e.insert(name, value);
  }
  p.setProcessEnvironment(e);
  p.start(kCli, args);
  CliRun r;
  r.finished = p.waitForFinished(kTimeoutMs) && p.exitStatus() == QProcess::NormalExit;
  if (!r.finished) p.kill();
  r.exit_code = p.exitCode();
  r.out = p.readAllStandardOutput();
  r.err = p.readAllStandardError();
  return r;
}

// `fetch --list`: every model fetch knows, with its file, size and license.
void CliTest::fetch_list() {
  const CliRun r = run_cli({"fetch", "--list"});
  QVERIFY2(r.finished && r.exit_code == 0, qPrintable(describe({"fetch", "--list"}, r)));
  const QString out = QString::fromUtf8(r.out);
  for (const QString& part :
       {QStringLiteral("smollm2-135m (default)"), QString(tokenfab::EmbeddedModel::kFileName),
        QStringLiteral("Apache-2.0"), QStringLiteral("gemma3-270m"),
        QString(tokenfab::Gemma3Model::kFileName), QStringLiteral("Gemma Terms of Use"),
        QStringLiteral("https://ai.google.dev/gemma/terms")})
    QVERIFY2(out.contains(part), qPrintable("missing '" + part + "': " + out));
}

// Gemma without --accept-license, off a terminal: refused before anything is downloaded (pip has
// no index here, so a download attempt would fail with another message), saying how to accept.
void CliTest::fetch_gemma_needs_the_license() {
  const QString dest = dir_.filePath("gemma-not-accepted");
  const QStringList args = {"fetch", "gemma3-270m", "--dest", dest};
  const CliRun r = run_cli_env(args, {{"PIP_NO_INDEX", "1"}, {"PIP_FIND_LINKS", ""}});
  QVERIFY2(r.finished && r.exit_code != 0, qPrintable(describe(args, r)));
  QVERIFY2(r.out.isEmpty(), qPrintable(describe(args, r)));
  const QString err = QString::fromUtf8(r.err.trimmed());
  QVERIFY2(!err.contains('\n'), qPrintable("not one line: " + describe(args, r)));
  for (const QString& part :
       {QStringLiteral("Gemma Terms of Use"), QStringLiteral("https://ai.google.dev/gemma/terms"),
        QStringLiteral("tokenfab-cli fetch gemma3-270m --accept-license"),
        QStringLiteral("Nothing was downloaded")})
    QVERIFY2(err.contains(part), qPrintable("missing '" + part + "': " + describe(args, r)));
  QVERIFY2(!QFileInfo::exists(dest), "the refused fetch created its destination");
}

// A download that fails (pip has no index) says so in one line and leaves no file behind.
void CliTest::fetch_failure_leaves_nothing() {
  const QString dest = dir_.filePath("gemma-offline");
  const QStringList args = {"fetch", "gemma3-270m", "--accept-license", "--dest", dest};
  const CliRun r = run_cli_env(args, {{"PIP_NO_INDEX", "1"}, {"PIP_FIND_LINKS", ""}});
  QVERIFY2(r.finished && r.exit_code == 2, qPrintable(describe(args, r)));
  QVERIFY2(r.out.isEmpty(), qPrintable(describe(args, r)));
  QVERIFY2(r.err.contains("accepted by --accept-license"), qPrintable(describe(args, r)));
  QVERIFY2(r.err.trimmed().split('\n').last().contains("could not download"),
           qPrintable(describe(args, r)));
  QVERIFY2(QDir(dest).entryList(QDir::AllEntries | QDir::Hidden | QDir::NoDotAndDotDot).isEmpty(),
           qPrintable(dest + " is not empty"));
}

// tools/fetch_model.py (compiled into fetch) pins the hashes core/model/model_files.h checks.
void CliTest::fetch_pins_the_hashes_of_model_files() {
  QFile script(QStringLiteral(TOKENFAB_SOURCE_DIR "/tools/fetch_model.py"));
  QVERIFY(script.open(QIODevice::ReadOnly));
  const QByteArray text = script.readAll();
  for (const char* pinned : {tokenfab::EmbeddedModel::kSha256, tokenfab::Gemma3Model::kSha256,
                             tokenfab::EmbeddedModel::kFileName, tokenfab::Gemma3Model::kFileName})
    QVERIFY2(text.contains(pinned), pinned);
}

// `models --json`: one JSON object listing the GGUF files of a fake home (here one of an
// architecture Tokenfab does not run, in the Tokenfab cache, and a file that is not GGUF); the
// listed name works as --model.
void CliTest::models_json() {
  const QString home = dir_.filePath("models-home");
  const QString models = home + "/tokenfab/models";
  QVERIFY(QDir().mkpath(models));
  QVERIFY(QFile::copy(gpt2_, models + "/tiny-gpt2.gguf"));
  QVERIFY(QFile::copy(garbage_, models + "/garbage.gguf"));
  const std::map<QString, QString> env = {{"HOME", home},
                                          {"TOKENFAB_HOME", home + "/tokenfab"},
                                          {"XDG_DATA_HOME", ""},
                                          {"XDG_CACHE_HOME", ""},
                                          {"OLLAMA_MODELS", ""}};
  const QStringList args = {"models", "--json", "--context", "100"};
  const CliRun r = run_cli_env(args, env);
  QVERIFY2(r.finished && r.exit_code == 0, qPrintable(describe(args, r)));
  QVERIFY2(r.out.endsWith('\n') && r.out.count('\n') == 1, qPrintable(describe(args, r)));
  const QJsonObject j = QJsonDocument::fromJson(r.out).object();
  QCOMPARE(j["context"].toInt(), 100);
  QCOMPARE(j["memory"].toArray().first().toObject()["name"].toString(), QStringLiteral("cpu"));
  QVERIFY(j["memory"].toArray().first().toObject()["total_bytes"].toDouble() > 0);
  QJsonObject model;
  for (const QJsonValue& m : j["models"].toArray())
    if (m.toObject()["path"].toString() == models + "/tiny-gpt2.gguf") model = m.toObject();
  QVERIFY2(!model.isEmpty(), qPrintable(describe(args, r)));
  QCOMPARE(model["name"].toString(), QStringLiteral("tiny-gpt2"));  // no general.name: the stem
  QCOMPARE(model["source"].toString(), QStringLiteral("tokenfab"));
  QCOMPARE(model["family"].toString(), QStringLiteral("gpt2"));
  QCOMPARE(model["parameters"].toInteger(), 64);  // token_embd [32, 2]
  QCOMPARE(model["runnable"].toBool(), false);
  QVERIFY(model["not_runnable_because"].toString().contains("gpt2"));
  const QJsonObject memory = model["memory"].toObject();
  QCOMPARE(memory["context"].toInteger(), 100);
  QCOMPARE(memory["weight_bytes"].toInteger(), 256);  // 64 F32
  QCOMPARE(memory["total_bytes"].toInteger(),
           memory["weight_bytes"].toInteger() + memory["kv_bytes"].toInteger());
  QVERIFY(QStringList({"fits", "fits on one device only", "does not fit"})
              .contains(model["verdict"].toString()));
  bool garbage_noted = false;
  for (const QJsonValue& s : j["skipped"].toArray())
    garbage_noted = garbage_noted || s.toObject()["path"].toString() == models + "/garbage.gguf";
  QVERIFY2(garbage_noted, qPrintable(describe(args, r)));

  const QStringList info = {"info", "--model", "tiny-gpt2", "--json"};
  const CliRun by_name = run_cli_env(info, env);
  QVERIFY2(by_name.finished && by_name.exit_code == 0, qPrintable(describe(info, by_name)));
  QCOMPARE(QJsonDocument::fromJson(by_name.out).object()["path"].toString(),
           models + "/tiny-gpt2.gguf");
}

void CliTest::bad_input_data() {
  QTest::addColumn<QStringList>("args");
  QTest::addColumn<QString>("message");  // a substring the one stderr line must contain
  QTest::addColumn<bool>("needs_model");

  QTest::newRow("no command") << QStringList{} << "tokenfab-cli needs a command: fetch, info"
                              << false;
  QTest::newRow("unknown command")
      << QStringList{"frobnicate"}
      << "unknown command 'frobnicate' for tokenfab-cli (commands: fetch, info" << false;
  QTest::newRow("unknown heads command")
      << QStringList{"heads", "retrain"}
      << "unknown command 'retrain' for heads (commands: train, eval, list" << false;
  QTest::newRow("unknown option where a command is needed")
      << QStringList{"heads", "--verbose"}
      << "unknown option '--verbose' for heads, which needs a command: train" << false;
  QTest::newRow("unknown flag") << QStringList{"generate", "--prompt", "hi", "--temprature", "0.5"}
                                << "arguments were not expected" << false;
  QTest::newRow("flag value of the wrong type")
      << QStringList{"generate", "--prompt", "hi", "--max-tokens", "many"}
      << "Could not convert: --max-tokens = many" << false;
  QTest::newRow("negative top-k") << QStringList{"generate", "--prompt", "hi", "--top-k", "-5"}
                                  << "--top-k: Value -5 not in range 0 to" << false;
  QTest::newRow("missing model file")
      << QStringList{"generate", "--model", "/nonexistent.gguf", "--prompt", "hi"}
      << "model file not found: /nonexistent.gguf" << false;
  QTest::newRow("not a GGUF file")
      << QStringList{"info", "--model", garbage_} << "this is not a GGUF file" << false;
  QTest::newRow("unsupported architecture")
      << QStringList{"generate", "--model", gpt2_, "--prompt", "hi"}
      << "unsupported architecture 'gpt2'" << false;
  QTest::newRow("unsupported tensor type")
      << QStringList{"generate", "--model", iq2_xxs_, "--prompt", "hi"}
      << "blk.0.ffn_down.weight has type IQ2_XXS, which tokenfab cannot compute on" << false;
  QTest::newRow("K-quant rows not a multiple of 256")
      << QStringList{"generate", "--model", k_rows_, "--prompt", "hi"}
      << "'blk.0.attn_q.weight': dims[0] = 288 is not a multiple of the Q4_K block size 256"
      << false;
  QTest::newRow("NaN scale")
      << QStringList{"generate", "--model", nan_scale_, "--prompt", "hi"}
      << "tensor blk.0.ffn_down.weight row 1: block 0 of Q4_K: d is nan (fp16 0x7e00)" << false;
  QTest::newRow("truncated super-block") << QStringList{"info", "--model", truncated_}
                                         << "tensor data 'output.weight': data at offset" << false;
  QTest::newRow("quantize to an unknown type")
      << QStringList{"quantize", "--type", "q4_k", garbage_, dir_.filePath("never.gguf")}
      << "--type q4_k: expected one of F16, BF16, Q8_0, Q6_K, Q5_1, Q5_K_M" << false;
  QTest::newRow("quantize onto the input")
      << QStringList{"quantize", "--type", "q8_0", gpt2_, gpt2_} << "is the input file" << false;
  QTest::newRow("quantize a missing file")
      << QStringList{"quantize", "--type", "q8_0", "/nonexistent.gguf", dir_.filePath("n.gguf")}
      << "cannot read /nonexistent.gguf: no such file" << false;
  QTest::newRow("quantize a model Tokenfab cannot run")
      << QStringList{"quantize", "--type", "q8_0", gpt2_, dir_.filePath("never.gguf")}
      << "unsupported architecture 'gpt2'" << false;
  QTest::newRow("prompt longer than the context")
      << QStringList{"generate", "--ctx", "8", "--prompt",
                     "one two three four five six seven eight nine ten eleven twelve"}
      << "does not fit the context of 8 tokens" << true;
  QTest::newRow("max-tokens 0") << QStringList{"generate", "--prompt", "hi", "--max-tokens", "0"}
                                << "--max-tokens must be at least 1" << true;
  QTest::newRow("negative temperature")
      << QStringList{"generate", "--prompt", "hi", "--temperature", "-1"} << "temperature" << true;
  QTest::newRow("context lookup while sampling")
      << QStringList{"generate", "--prompt", "hi", "--lookup", "3", "--temperature", "0.7"}
      << "context lookup drafts are verified greedily; use temperature 0" << true;
  QTest::newRow("head training without data")
      << QStringList{"heads", "train", "--name", "h", "--domain", "code"}
      << "give --prompt-set NAME, --corpus PATH…, or both" << false;
  QTest::newRow("sampled continuations of a corpus")
      << QStringList{"heads", "train",    "--name", "h",         "--domain",
                     "code",  "--corpus", "notes",  "--samples", "2"}
      << "--samples continues the prompts of --prompt-set" << false;
  QTest::newRow("layer taps on a medusa head")
      << QStringList{"heads",  "train",  "--name", "h",  "--domain",     "code",
                     "--type", "medusa", "--taps", "on", "--prompt-set", "code"}
      << "--taps on is for mtp heads (--type mtp)" << false;
  QTest::newRow("unknown target quantization")
      << QStringList{"heads", "eval",         "--head", "none",           "--lookup",
                     "3",     "--prompt-set", "code",   "--target-quant", "q3_k"}
      << "--target-quant q3_k: expected native, f16, q8_0, q6_k, q5_1, q5_k_m" << false;
  QTest::newRow("heads eval on an unknown device")
      << QStringList{"heads", "eval",         "--head", "none",      "--lookup",
                     "3",     "--prompt-set", "code",   "--devices", "tpu:0"}
      << "unknown device kind \"tpu\"" << true;
  QTest::newRow("adaptive tree")
      << QStringList{"heads",        "eval", "--head", "none", "--lookup",  "3",
                     "--prompt-set", "code", "--spec", "tree", "--adaptive"}
      << "--adaptive chooses a chain's length; a tree (--spec tree) has a fixed shape" << false;
  QTest::newRow("prefill without decode")
      << QStringList{"generate", "--prompt", "hi", "--prefill", "cpu:0"}
      << "disaggregated mode needs both --prefill and --decode" << true;
  QTest::newRow("unknown device kind")
      << QStringList{"generate", "--prompt", "hi", "--devices", "tpu:0"}
      << "unknown device kind \"tpu\"" << true;
  QTest::newRow("same device for prefill and long prefill")
      << QStringList{"serve-bench", "--prefill",      "cpu:0", "--decode",
                     "cpu:1",       "--long-prefill", "cpu:0", "--long-prompt-tokens",
                     "64"}
      << "the device lists must be disjoint" << true;
  QTest::newRow("fewer threads than devices")
      << QStringList{"generate", "--prompt", "hi", "--devices", "cpu:0,cpu:1", "--threads", "1"}
      << "cannot give each of the 2 devices a thread" << true;
  QTest::newRow("bench on two devices")
      << QStringList{"bench", "--device", "cpu:0,cpu:1", "--gen-tokens", "2"}
      << "bench runs on one device" << true;
  QTest::newRow("verifying step of no rows")
      << QStringList{"bench", "--verify-rows", "2,0"} << "--verify-rows: 0 rows" << false;
  QTest::newRow("verifying step past the context")
      << QStringList{"bench", "--prompt-tokens", "8190", "--gen-tokens", "2", "--verify-rows", "8"}
      << "--prompt-tokens 8190 + --verify-rows 8 exceed the model's context" << true;
  QTest::newRow("batch-bench on two devices")
      << QStringList{"batch-bench", "--device", "cpu:0,cpu:1", "--streams", "1"}
      << "a benchmark runs on one device" << true;
  // Refused before the synthetic model is written (one line on stderr, nothing written first).
  QTest::newRow("bench on a GPU that is not there")
      << QStringList{"bench", "--device", "cuda:7", "--synthetic", "smollm2-135m"} << "cuda:7"
      << false;
  QTest::newRow("GPU connector without a GPU")
      << QStringList{"generate", "--prompt", "hi",          "--prefill",  "cpu:0",
                     "--decode", "cpu:1",    "--connector", "host_staged"}
      << "every device is a CPU (use loopback)" << true;
  QTest::newRow("bad prompt length range")
      << QStringList{"serve-bench", "--prompt-len", "90:40"} << "expected MIN:MAX" << true;
  QTest::newRow("serve-bench prompts file missing")
      << QStringList{"serve-bench", "--prompts", "/nonexistent/prompts.json"}
      << "--prompts /nonexistent/prompts.json: cannot open it" << true;
  QTest::newRow("ids not integers")
      << QStringList{"detokenize", "--ids", "1,x,3"} << "'x' is not an integer" << true;
  QTest::newRow("perplexity of a missing file")
      << QStringList{"perplexity", "--file", "/nonexistent/text.txt"}
      << "cannot read /nonexistent/text.txt" << true;
}

// Each bad input: non-zero exit, nothing on stdout, one line on stderr naming the problem.
void CliTest::bad_input() {
  QFETCH(QStringList, args);
  QFETCH(QString, message);
  QFETCH(bool, needs_model);
  if (needs_model) REQUIRE_MODEL();
  const CliRun r = run_cli(args);
  const QString what = describe(args, r);
  QVERIFY2(r.finished, qPrintable(what));
  QVERIFY2(r.exit_code != 0, qPrintable(what));
  QVERIFY2(r.out.isEmpty(), qPrintable(what));
  const QByteArray err = r.err.trimmed();
  QVERIFY2(!err.isEmpty() && !err.contains('\n'), qPrintable("not one line: " + what));
  QVERIFY2(QString::fromUtf8(err).contains(message),
           qPrintable("expected '" + message + "': " + what));
}

QTEST_GUILESS_MAIN(CliTest)
#include "test_cli.moc"
