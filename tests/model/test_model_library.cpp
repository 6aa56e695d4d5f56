// The model library (core/model/model_library.h): the GGUF files it finds in Tokenfab's cache, the
// user's folders, LM Studio's, GPT4All's and Ollama's folders — all faked in a temporary HOME —
// what it reads from their headers (architectures Tokenfab cannot run included), the weights and
// KV cache arithmetic against numbers worked out by hand in the comments here, the verdicts, name
// resolution, check_fits refusing with the numbers, and the files it skips with a note. No model
// file needed.

#include <unistd.h>

#include <QTemporaryDir>
#include <QtTest>
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/common/error.h"
#include "core/common/sha256.h"
#include "core/gguf/gguf_writer.h"
#include "core/model/model_files.h"
#include "core/model/model_library.h"
#include "core/model/synthetic_model.h"

namespace fs = std::filesystem;
using tokenfab::FitVerdict;
using tokenfab::MemoryPlace;
using tokenfab::ModelInfo;
using tokenfab::ModelLibrary;
using tokenfab::ModelSource;
using tokenfab::gguf::GgufWriter;
using tokenfab::gguf::TensorType;
using tokenfab::gguf::Value;
using tokenfab::gguf::ValueType;

namespace {

// An F32 tensor of zeros.
void add_f32(GgufWriter& w, const std::string& name, std::vector<uint64_t> dims) {
  uint64_t n = 1;
  for (uint64_t d : dims) n *= d;
  const std::vector<float> zeros(n, 0.0f);
  w.add_tensor(name, TensorType::F32, std::move(dims),
               {reinterpret_cast<const uint8_t*>(zeros.data()), zeros.size() * sizeof(float)});
}

// A GPT-2 header (an architecture Tokenfab does not run): 2 layers, 64 wide, 8 heads, no
// head_count_kv, context 1024, general.file_type 0 (F32); tensors token_embd [64, 32] and
// output_norm [64], F32: 2048 + 64 = 2112 parameters, 4 · 2112 = 8448 bytes.
void write_gpt2(const fs::path& path, const std::string& name) {
  GgufWriter w;
  w.add("general.architecture", Value::string("gpt2"));
  if (!name.empty()) w.add("general.name", Value::string(name));
  w.add("general.file_type", Value::u32(0));
  w.add("gpt2.block_count", Value::u32(2));
  w.add("gpt2.embedding_length", Value::u32(64));
  w.add("gpt2.attention.head_count", Value::u32(8));
  w.add("gpt2.context_length", Value::u32(1024));
  add_f32(w, "token_embd.weight", {64, 32});
  add_f32(w, "output_norm.weight", {64});
  w.write(path);
}

// OpenELM states its head counts per layer: 3 layers with 1, 2 and 3 kv heads of key_length 8.
void write_openelm(const fs::path& path) {
  GgufWriter w;
  w.add("general.architecture", Value::string("openelm"));
  w.add("openelm.block_count", Value::u32(3));
  w.add("openelm.embedding_length", Value::u32(64));
  w.add("openelm.context_length", Value::u32(8192));
  w.add("openelm.attention.head_count",
        Value::array(ValueType::Int32, {Value::i32(4), Value::i32(4), Value::i32(8)}));
  w.add("openelm.attention.head_count_kv",
        Value::array(ValueType::Int32, {Value::i32(1), Value::i32(2), Value::i32(3)}));
  w.add("openelm.attention.key_length", Value::u32(8));
  w.add("openelm.attention.value_length", Value::u32(8));
  add_f32(w, "token_embd.weight", {64, 16});
  w.write(path);
}

// A Gemma-like header whose head size (key_length 32) is not embedding_length / head_count (16):
// 3 layers, 1 kv head.
void write_wide_heads(const fs::path& path, const std::string& name) {
  GgufWriter w;
  w.add("general.architecture", Value::string("gemma3"));
  w.add("general.name", Value::string(name));
  w.add("gemma3.block_count", Value::u32(3));
  w.add("gemma3.embedding_length", Value::u32(64));
  w.add("gemma3.attention.head_count", Value::u32(4));
  w.add("gemma3.attention.head_count_kv", Value::u32(1));
  w.add("gemma3.attention.key_length", Value::u32(32));
  w.add("gemma3.attention.value_length", Value::u32(32));
  w.add("gemma3.context_length", Value::u32(32768));
  add_f32(w, "token_embd.weight", {64, 8});
  w.write(path);
}

void write_text(const fs::path& path, const std::string& text) {
  fs::create_directories(path.parent_path());
  std::ofstream(path, std::ios::binary) << text;
}

const ModelInfo* find(const ModelLibrary& library, const fs::path& path,
                      const std::string& ollama_name = "") {
  for (const ModelInfo& m : library.models)
    if (m.found.path == path && m.found.ollama_name == ollama_name) return &m;
  return nullptr;
}

bool skipped(const ModelLibrary& library, const fs::path& path, const std::string& reason_part) {
  return std::any_of(library.skipped.begin(), library.skipped.end(), [&](const auto& s) {
    return s.path == path && s.reason.find(reason_part) != std::string::npos;
  });
}

QString q(const fs::path& path) {
  return QString::fromStdString(path.string());
}

std::string thrown_by(const std::function<void()>& f) {
  try {
    f();
  } catch (const tokenfab::Error& e) {
    return e.what();
  }
  return {};
}

}  // namespace

class ModelLibraryTest : public QObject {
  Q_OBJECT

 private slots:
  void initTestCase();
  void finds_every_source();
  void skips_what_it_cannot_read_with_a_note();
  void reads_an_architecture_tokenfab_cannot_run();
  void runnable_model_is_runnable();
  void weights_and_kv_arithmetic();
  void verdicts();
  void check_fits_refuses_with_numbers();
  void resolves_names();
  void folder_list();

 private:
  ModelLibrary scan(int64_t context = 0) {
    return tokenfab::scan_library(tokenfab::LibraryRoots::from_environment(), context,
                                  {MemoryPlace{"cpu", 1ull << 40, 1ull << 40, true}});
  }

  QTemporaryDir dir_;
  fs::path home_, cache_, mine_, lmstudio_, lmstudio_old_, gpt4all_, ollama_;
  fs::path blob_;
};

void ModelLibraryTest::initTestCase() {
  QVERIFY(dir_.isValid());
  home_ = dir_.path().toStdString();
  qputenv("HOME", dir_.path().toUtf8());
  qputenv("TOKENFAB_HOME", (dir_.path() + "/tokenfab").toUtf8());
  for (const char* name : {"XDG_DATA_HOME", "XDG_CACHE_HOME", "OLLAMA_MODELS"}) qunsetenv(name);

  cache_ = tokenfab::models_dir();
  QCOMPARE(QString::fromStdString(cache_.string()), dir_.path() + "/tokenfab/models");
  fs::create_directories(cache_);
  write_gpt2(cache_ / "gpt2-small.gguf", "GPT-2 Small Test");
  tokenfab::SyntheticShape shape{"tiny", 512, 64, 256, 1, 2, 1, 128};
  tokenfab::write_synthetic_llama(cache_ / "tiny-llama.gguf", shape,
                                  tokenfab::kernels::WeightType::Q8_0, 1);

  mine_ = home_ / "my models";
  fs::create_directories(mine_ / "sub");
  write_openelm(mine_ / "openelm.gguf");
  write_wide_heads(mine_ / "sub" / "wide-heads.gguf", "Wide Heads");
  write_text(mine_ / "readme.txt", "not a model, not named .gguf: never opened\n");
  // A split model of two parts, listed once; one of three parts whose part 3 is missing.
  write_gpt2(mine_ / "split-00001-of-00002.gguf", "Split Test");
  write_gpt2(mine_ / "split-00002-of-00002.gguf", "");
  write_gpt2(mine_ / "gone-00001-of-00003.gguf", "Gone");
  write_gpt2(mine_ / "gone-00002-of-00003.gguf", "");
  QVERIFY(tokenfab::add_model_folder(mine_));

  lmstudio_ = home_ / ".lmstudio" / "models" / "publisher" / "repo";
  fs::create_directories(lmstudio_);
  write_gpt2(lmstudio_ / "lm-model-q8_0.gguf", "LM Studio Model");
  lmstudio_old_ = home_ / ".cache" / "lm-studio" / "models" / "old-publisher" / "old-repo";
  fs::create_directories(lmstudio_old_);
  write_wide_heads(lmstudio_old_ / "old-model.gguf", "Old LM Studio Model");
  gpt4all_ = home_ / ".local" / "share" / "nomic.ai" / "GPT4All";
  fs::create_directories(gpt4all_);
  write_gpt2(gpt4all_ / "gpt4all-model.gguf", "");

  // Ollama: a library model under two tags, a user's model, and a tag whose blob is missing.
  ollama_ = home_ / ".ollama" / "models";
  fs::create_directories(ollama_ / "blobs");
  const fs::path staged = home_ / "staged.gguf";
  write_gpt2(staged, "Ollama Model");
  std::ifstream in(staged, std::ios::binary);
  const std::string bytes{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  const std::string digest = tokenfab::sha256_hex(bytes);
  blob_ = ollama_ / "blobs" / ("sha256-" + digest);
  fs::rename(staged, blob_);
  // Ollama's manifest: an OCI image manifest whose layers are the template, the model, ….
  const auto manifest = [&](const fs::path& at, const std::string& model_digest) {
    const auto layer = [](const std::string& media_type, const std::string& hex) {
      return nlohmann::json{{"mediaType", media_type}, {"digest", "sha256:" + hex}, {"size", 1}};
    };
    const nlohmann::json j = {
        {"schemaVersion", 2},
        {"mediaType", "application/vnd.docker.distribution.manifest.v2+json"},
        {"config", layer("application/vnd.docker.container.image.v1+json", std::string(64, '0'))},
        {"layers",
         {layer("application/vnd.ollama.image.template", std::string(64, '1')),
          layer("application/vnd.ollama.image.model", model_digest)}}};
    write_text(ollama_ / "manifests" / at, j.dump());
  };
  manifest("registry.ollama.ai/library/tinyollama/latest", digest);
  manifest("registry.ollama.ai/library/tinyollama/q8", digest);
  manifest("registry.ollama.ai/someone/theirs/v1", digest);
  manifest("registry.ollama.ai/library/ghost/latest", std::string(64, 'a'));
  write_text(ollama_ / "manifests" / "registry.ollama.ai" / "library" / "broken" / "latest",
             "{not json");
}

void ModelLibraryTest::finds_every_source() {
  const ModelLibrary library = scan();
  const struct {
    fs::path path;
    ModelSource source;
    std::string name;
  } expected[] = {
      {cache_ / "gpt2-small.gguf", ModelSource::kTokenfab, "GPT-2 Small Test"},
      {cache_ / "tiny-llama.gguf", ModelSource::kTokenfab, "synthetic tiny (random weights)"},
      {mine_ / "openelm.gguf", ModelSource::kUserFolder, "openelm"},  // no general.name: the stem
      {mine_ / "sub" / "wide-heads.gguf", ModelSource::kUserFolder, "Wide Heads"},
      {mine_ / "split-00001-of-00002.gguf", ModelSource::kUserFolder, "Split Test"},
      {lmstudio_ / "lm-model-q8_0.gguf", ModelSource::kLmStudio, "LM Studio Model"},
      {lmstudio_old_ / "old-model.gguf", ModelSource::kLmStudio, "Old LM Studio Model"},
      {gpt4all_ / "gpt4all-model.gguf", ModelSource::kGpt4All, "gpt4all-model"},
  };
  for (const auto& e : expected) {
    const ModelInfo* m = find(library, e.path);
    QVERIFY2(m != nullptr, qPrintable(QString::fromStdString("not found: " + e.path.string())));
    QVERIFY(m->found.source == e.source);
    QCOMPARE(QString::fromStdString(m->name), QString::fromStdString(e.name));
  }
  // Ollama: listed as model:tag (namespace/model:tag outside `library`), one entry per tag.
  for (const std::string name : {"tinyollama:latest", "tinyollama:q8", "someone/theirs:v1"}) {
    const ModelInfo* m = find(library, blob_, name);
    QVERIFY2(m != nullptr, name.c_str());
    QCOMPARE(QString::fromStdString(m->name), QString::fromStdString(name));
    QVERIFY(m->found.source == ModelSource::kOllama);
    QCOMPARE(QString::fromStdString(m->general_name), QStringLiteral("Ollama Model"));
  }
  // A split model is listed once, under its first part, with both parts' tensors and bytes.
  const ModelInfo* split = find(library, mine_ / "split-00001-of-00002.gguf");
  QCOMPARE(split->found.parts.size(), size_t{2});
  QCOMPARE(split->type_mix.elements, uint64_t{2 * 2112});
  QCOMPARE(split->file_size,
           fs::file_size(split->found.parts[0]) + fs::file_size(split->found.parts[1]));
  QVERIFY(find(library, mine_ / "split-00002-of-00002.gguf") == nullptr);
  QCOMPARE(std::count_if(library.models.begin(), library.models.end(),
                         [](const ModelInfo& m) { return m.found.path.extension() == ".txt"; }),
           0l);
  // 2 in the cache, 3 in the user's folder, 2 of LM Studio, 1 of GPT4All, 3 Ollama tags (a
  // machine's own /usr/share/ollama aside).
  QCOMPARE(std::count_if(library.models.begin(), library.models.end(),
                         [&](const ModelInfo& m) {
                           return m.found.path.string().starts_with(home_.string() + "/");
                         }),
           11l);
}

void ModelLibraryTest::skips_what_it_cannot_read_with_a_note() {
  const fs::path bad = home_ / "bad models";
  fs::create_directories(bad);
  write_text(bad / "plain-text.gguf", "this is plain text, not a GGUF model\n");
  write_gpt2(bad / "truncated.gguf", "Truncated");
  fs::resize_file(bad / "truncated.gguf", 40);  // cut inside the metadata
  fs::create_symlink(bad / "nowhere.gguf", bad / "dangling.gguf");
  write_gpt2(bad / "locked.gguf", "Locked");
  fs::permissions(bad / "locked.gguf", fs::perms::none);
  QVERIFY(tokenfab::add_model_folder(bad));
  const fs::path deleted = home_ / "deleted later";  // a folder added, then deleted
  fs::create_directories(deleted);
  QVERIFY(tokenfab::add_model_folder(deleted));
  fs::remove(deleted);
  const ModelLibrary library = scan();
  QVERIFY(tokenfab::remove_model_folder(bad));
  QVERIFY(tokenfab::remove_model_folder(deleted));
  QVERIFY(skipped(library, deleted, "a model folder you added is missing"));

  QVERIFY(find(library, bad / "plain-text.gguf") == nullptr);
  QVERIFY(skipped(library, bad / "plain-text.gguf", "plain-text.gguf"));
  QVERIFY(skipped(library, bad / "truncated.gguf", "truncated.gguf"));
  QVERIFY(skipped(library, bad / "dangling.gguf", "not a regular file"));
  if (geteuid() != 0) {  // root reads a file whatever its permissions
    QVERIFY(skipped(library, bad / "locked.gguf", "locked.gguf"));
  }
  QVERIFY(skipped(library, mine_ / "gone-00001-of-00003.gguf", "part 3 of 3"));
  QVERIFY(skipped(library, ollama_ / "blobs" / ("sha256-" + std::string(64, 'a')),
                  "ghost:latest: its blob is missing"));
  QVERIFY(skipped(library,
                  ollama_ / "manifests" / "registry.ollama.ai" / "library" / "broken" / "latest",
                  "broken:latest"));
  // The rest of the library is there all the same.
  QVERIFY(find(library, cache_ / "gpt2-small.gguf") != nullptr);
}

void ModelLibraryTest::reads_an_architecture_tokenfab_cannot_run() {
  const ModelLibrary library = scan();
  const ModelInfo* m = find(library, cache_ / "gpt2-small.gguf");
  QVERIFY(m != nullptr);
  QCOMPARE(QString::fromStdString(m->family), QStringLiteral("gpt2"));
  QCOMPARE(QString::fromStdString(m->general_name), QStringLiteral("GPT-2 Small Test"));
  QCOMPARE(m->type_mix.elements, uint64_t{2112});  // 64·32 + 64
  QCOMPARE(m->type_mix.bytes, uint64_t{8448});     // 4 bytes each (F32)
  QCOMPARE(m->type_mix.bits_per_weight(), 32.0);
  QCOMPARE(QString::fromStdString(m->file_type.value_or("")), QStringLiteral("F32"));
  QCOMPARE(m->context_length, int64_t{1024});
  QCOMPARE(m->file_size, fs::file_size(m->found.path));
  QVERIFY(!m->runnable);
  QVERIFY2(m->not_runnable_because.find("gpt2") != std::string::npos,
           m->not_runnable_because.c_str());
}

void ModelLibraryTest::runnable_model_is_runnable() {
  const ModelLibrary library = scan();
  const ModelInfo* m = find(library, cache_ / "tiny-llama.gguf");
  QVERIFY(m != nullptr);
  QVERIFY2(m->runnable, m->not_runnable_because.c_str());
  QCOMPARE(QString::fromStdString(m->family), QStringLiteral("llama"));
  QCOMPARE(m->context_length, int64_t{128});
  // 1 layer, 1 kv head, head size 64 / 2 = 32: 1 · 1 · (32 + 32) · 2 bytes = 128 bytes a token,
  // at min(128, 4096) = 128 tokens: 16384 bytes.
  QCOMPARE(m->memory.kv_bytes_per_token, uint64_t{128});
  QCOMPARE(m->memory.context, int64_t{128});
  QCOMPARE(m->memory.kv_bytes(), uint64_t{16384});
}

void ModelLibraryTest::weights_and_kv_arithmetic() {
  // GPT-2, no head_count_kv (one kv head per head): 2 layers · 8 heads · (8 + 8) · 2 bytes = 512
  // bytes a token, head size 64 / 8 = 8; context min(1024, 4096) = 1024: 524288 bytes of KV;
  // with the 8448 bytes of weights, 532736 bytes.
  ModelLibrary library = scan();
  const ModelInfo* gpt2 = find(library, cache_ / "gpt2-small.gguf");
  QCOMPARE(gpt2->memory.kv_bytes_per_token, uint64_t{512});
  QCOMPARE(gpt2->memory.context, int64_t{1024});
  QCOMPARE(gpt2->memory.kv_bytes(), uint64_t{524288});
  QCOMPARE(gpt2->memory.weight_bytes, uint64_t{8448});
  QCOMPARE(gpt2->memory.total_bytes(), uint64_t{532736});
  // OpenELM's per-layer kv heads 1, 2, 3 of key and value length 8: (1 + 2 + 3) · (8 + 8) · 2 =
  // 192 bytes a token; context min(8192, 4096) = 4096: 786432 bytes.
  const ModelInfo* openelm = find(library, mine_ / "openelm.gguf");
  QCOMPARE(openelm->memory.kv_bytes_per_token, uint64_t{192});
  QCOMPARE(openelm->memory.context, int64_t{4096});
  QCOMPARE(openelm->memory.kv_bytes(), uint64_t{786432});
  QCOMPARE(openelm->memory.weight_bytes, uint64_t{64 * 16 * 4});
  // key_length 32 beats 64 / 4 = 16: 3 layers · 1 kv head · (32 + 32) · 2 = 384 bytes a token.
  const ModelInfo* wide = find(library, mine_ / "sub" / "wide-heads.gguf");
  QCOMPARE(wide->memory.kv_bytes_per_token, uint64_t{384});
  QVERIFY(wide->kv_note.empty());

  // An asked context replaces the default: 100 tokens of GPT-2 are 51200 bytes.
  library = scan(100);
  gpt2 = find(library, cache_ / "gpt2-small.gguf");
  QCOMPARE(gpt2->memory.context, int64_t{100});
  QCOMPARE(gpt2->memory.kv_bytes(), uint64_t{51200});
}

void ModelLibraryTest::verdicts() {
  // Needs 1000 bytes of weights + 10 tokens · 10 bytes = 1100 bytes; a host split needs 1200.
  tokenfab::ModelMemory need;
  need.weight_bytes = 1000;
  need.kv_bytes_per_token = 10;
  need.context = 10;
  QCOMPARE(need.total_bytes(), uint64_t{1100});
  const MemoryPlace roomy_host{"cpu", 4000, 1200, true}, tight_host{"cpu", 4000, 1150, true},
      small_host{"cpu", 4000, 500, true}, gpu{"cuda:0", 2000, 1100, false},
      small_gpu{"cuda:1", 2000, 1099, false};
  using tokenfab::assess_fit;
  QVERIFY(assess_fit(need, {roomy_host}).verdict == FitVerdict::kFits);
  QVERIFY(assess_fit(need, {tight_host}).verdict == FitVerdict::kFitsOnOneDeviceOnly);
  QVERIFY(assess_fit(need, {tight_host, gpu}).verdict == FitVerdict::kFits);
  QVERIFY(assess_fit(need, {small_host, gpu}).verdict == FitVerdict::kFitsOnOneDeviceOnly);
  QVERIFY(assess_fit(need, {small_host, gpu, gpu}).verdict == FitVerdict::kFits);
  QVERIFY(assess_fit(need, {small_host, small_gpu}).verdict == FitVerdict::kDoesNotFit);
  const tokenfab::Fit fit = assess_fit(need, {small_host, gpu});
  QVERIFY(fit.fits_on == std::vector<std::string>{"cuda:0"});
  QVERIFY2(fit.explanation.find("needs 1.07 KiB (weights 1000 B + KV cache 100 B for 10 tokens "
                                "at 10 B each)") != std::string::npos,
           fit.explanation.c_str());
  QVERIFY2(fit.explanation.find("cpu: 500 B available of 3.91 KiB") != std::string::npos,
           fit.explanation.c_str());
  QCOMPARE(QString(tokenfab::verdict_text(FitVerdict::kFitsOnOneDeviceOnly)),
           QStringLiteral("fits on one device only"));
}

void ModelLibraryTest::check_fits_refuses_with_numbers() {
  // GPT-2 at 1024 tokens needs 532736 bytes (weights_and_kv_arithmetic) = 520.25 KiB.
  const fs::path file = cache_ / "gpt2-small.gguf";
  const std::string message = thrown_by([&] {
    tokenfab::check_fits(file, 0,
                         {MemoryPlace{"cpu", 1 << 30, 1 << 30, true},
                          MemoryPlace{"cuda:0", 1 << 20, 500'000, false}});
  });
  QVERIFY2(!message.empty(), "a model larger than the GPU's free memory was accepted");
  for (const std::string& part :
       {file.string(), std::string("does not fit in the memory of cuda:0:"),
        std::string("needs 520.2 KiB"), std::string("weights 8.25 KiB"),
        std::string("KV cache 512.0 KiB for 1024 tokens"),
        std::string("cuda:0: 488.3 KiB available of 1.00 MiB")})
    QVERIFY2(message.find(part) != std::string::npos,
             qPrintable(QString::fromStdString("missing '" + part + "' in: " + message)));
  // 100 tokens need 8448 + 51200 = 59648 bytes: they fit.
  tokenfab::check_fits(file, 100, {MemoryPlace{"cuda:0", 1 << 20, 500'000, false}});
  tokenfab::check_fits(file, 0, {MemoryPlace{"cuda:0", 1 << 20, 532736, false}});
  QVERIFY(!thrown_by([&] { tokenfab::check_fits(home_ / "absent.gguf", 0); }).empty());
}

void ModelLibraryTest::resolves_names() {
  using tokenfab::find_model_by_name;
  using tokenfab::resolve_model_path;
  QCOMPARE(q(find_model_by_name("tinyollama:q8")), q(blob_));
  QCOMPARE(q(find_model_by_name("tinyollama")), q(blob_));  // model alone: model:latest
  QCOMPARE(q(find_model_by_name("someone/theirs:v1")), q(blob_));
  QCOMPARE(q(find_model_by_name("openelm")), q(mine_ / "openelm.gguf"));  // the file stem
  QCOMPARE(q(find_model_by_name("lm-model-q8_0.gguf")), q(lmstudio_ / "lm-model-q8_0.gguf"));
  QCOMPARE(q(find_model_by_name("Old LM Studio Model")), q(lmstudio_old_ / "old-model.gguf"));
  QCOMPARE(q(resolve_model_path(std::string("Wide Heads"))), q(mine_ / "sub" / "wide-heads.gguf"));
  // An existing path is taken as it is.
  QCOMPARE(q(resolve_model_path((mine_ / "openelm.gguf").string())), q(mine_ / "openelm.gguf"));

  const std::string missing = thrown_by([] { resolve_model_path(std::string("tinyolama")); });
  QVERIFY2(missing.starts_with("model file not found: tinyolama, "), missing.c_str());
  QVERIFY2(missing.find("nearest: tinyollama:latest") != std::string::npos, missing.c_str());
  QVERIFY2(missing.find('\n') == std::string::npos, missing.c_str());
  // Two files with one general.name: both named, none chosen.
  write_gpt2(mine_ / "twin-a.gguf", "Twin");
  write_gpt2(mine_ / "twin-b.gguf", "Twin");
  const std::string twins = thrown_by([] { find_model_by_name("Twin"); });
  fs::remove(mine_ / "twin-a.gguf");
  fs::remove(mine_ / "twin-b.gguf");
  QVERIFY2(twins.find("matches 2 files") != std::string::npos &&
               twins.find("twin-a.gguf") != std::string::npos &&
               twins.find("twin-b.gguf") != std::string::npos,
           twins.c_str());
}

void ModelLibraryTest::folder_list() {
  const fs::path extra = home_ / "extra";
  fs::create_directories(extra);
  QVERIFY(tokenfab::add_model_folder(extra / ""));  // stored without the trailing separator
  QVERIFY(!tokenfab::add_model_folder(extra));
  const auto folders = tokenfab::user_model_folders();
  QVERIFY(std::find(folders.begin(), folders.end(), extra) != folders.end());
  QCOMPARE(q(tokenfab::model_folders_file()), q(home_ / "tokenfab" / "model_folders.json"));
  QVERIFY(tokenfab::remove_model_folder(extra));
  QVERIFY(!tokenfab::remove_model_folder(extra));
  QVERIFY(!thrown_by([&] { tokenfab::add_model_folder(home_ / "no such folder"); }).empty());
  // The folder added first is still listed; a removed one is missing from the scan too.
  const auto left = tokenfab::user_model_folders();
  QVERIFY(left == std::vector<fs::path>{mine_});
}

QTEST_GUILESS_MAIN(ModelLibraryTest)
#include "test_model_library.moc"
