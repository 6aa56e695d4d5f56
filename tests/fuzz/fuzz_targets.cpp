#include "tests/fuzz/fuzz_targets.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <tuple>
#include <typeinfo>
#include <vector>

#include "core/api/api_error.h"
#include "core/api/openai_request.h"
#include "core/api/openai_response.h"
#include "core/common/error.h"
#include "core/gguf/gguf_reader.h"
#include "core/model/llama_model.h"
#include "core/model/model_files.h"
#include "core/model/synthetic_model.h"
#include "core/runtime/generator.h"
#include "core/runtime/sampler.h"
#include "core/speculative/draft_head.h"
#include "core/storage/conversations.h"
#include "core/storage/database.h"
#include "core/storage/registry.h"
#include "core/storage/runs.h"
#include "core/tokenizer/chat_template.h"
#include "core/tokenizer/tokenizer.h"
#include "core/tokenizer/utf8.h"
#include "kernels/cpu/candidates.h"
#include "kernels/cpu/quant_types.h"
#include "tests/fuzz/fuzz_support.h"

namespace tokenfab::fuzz {

void finding(const std::string& what) {
  std::fprintf(stderr, "fuzz finding: %s\n", what.c_str());
  std::fflush(stderr);
  std::abort();
}

namespace {

namespace fs = std::filesystem;

// The loaders take paths: each input goes to one file of this process, rewritten per input.
fs::path scratch_file(const char* suffix) {
  const fs::path dir = fs::temp_directory_path();
  return dir / ("tokenfab-fuzz-" + std::to_string(::getpid()) + suffix);
}

// One input as a scratch file, removed again when the target is done with it.
class ScratchFile {
 public:
  ScratchFile(const char* suffix, std::span<const uint8_t> bytes) : path_(scratch_file(suffix)) {
    std::ofstream out(path_, std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char*>(bytes.data()),
              static_cast<std::streamsize>(bytes.size()));
    if (!out) finding("could not write the scratch file " + path_.string());
  }
  ~ScratchFile() {
    std::error_code ec;
    fs::remove(path_, ec);
  }
  ScratchFile(const ScratchFile&) = delete;
  ScratchFile& operator=(const ScratchFile&) = delete;
  const fs::path& path() const { return path_; }

 private:
  fs::path path_;
};

// Runs `body`; tokenfab::Error is the expected refusal, any other exception is a finding.
template <typename F>
void refused_or_done(const char* what, F&& body) {
  try {
    body();
  } catch (const Error&) {
  } catch (const std::exception& e) {
    finding(std::string(what) + ": " + typeid(e).name() +
            " instead of tokenfab::Error: " + e.what());
  }
}

SyntheticShape small_shape() {
  SyntheticShape shape;
  shape.name = "fuzz-small";
  shape.n_vocab = kSyntheticMinVocab;
  shape.n_embd = 64;
  shape.n_ff = 64;
  shape.n_layer = 2;
  shape.n_head = 2;
  shape.n_kv_head = 1;
  shape.n_ctx = 64;
  return shape;
}

// The small model heads are tried against: the smallest synthetic shape the writer allows (its
// vocabulary is the byte-level minimum), written once per process. (Its file is removed at once:
// the loaded model keeps its mapping.)
const LlamaModel& small_model() {
  static std::once_flag once;
  static std::unique_ptr<LlamaModel> model;
  std::call_once(once, [] {
    const fs::path path = scratch_file("-small-model.gguf");
    write_synthetic_llama(path, small_shape(), kernels::WeightType::Q8_0, 7);
    model = LlamaModel::load(path);
    fs::remove(path);
  });
  return *model;
}

// The embedded model's tokenizer, when its file is here (null otherwise).
const Tokenizer* embedded_tokenizer() {
  static std::once_flag once;
  static std::unique_ptr<Tokenizer> tokenizer;
  std::call_once(once, [] {
    const fs::path path = default_model_path();
    if (!fs::exists(path)) return;
    const gguf::GgufFile file = gguf::GgufFile::open(path);
    tokenizer = std::make_unique<Tokenizer>(Tokenizer::from_gguf(file));
  });
  return tokenizer.get();
}

void read_value(const gguf::Value& v) {
  // Every accessor of a value must either answer or refuse with Error.
  refused_or_done("Value::as_string", [&] { (void)v.as_string(); });
  refused_or_done("Value::as_int", [&] { (void)v.as_int(); });
  refused_or_done("Value::as_uint", [&] { (void)v.as_uint(); });
  refused_or_done("Value::as_float", [&] { (void)v.as_float(); });
  refused_or_done("Value::as_bool", [&] { (void)v.as_bool(); });
  refused_or_done("Value::as_string_array", [&] { (void)v.as_string_array(); });
  refused_or_done("Value::as_int_array", [&] { (void)v.as_int_array(); });
  refused_or_done("Value::as_float_array", [&] { (void)v.as_float_array(); });
}

// A database with a row in every table, its WAL folded into the file (closed last).
void write_database_seed(const fs::path& path) {
  {
    const std::unique_ptr<Database> db = Database::open(path);
    Registry registry(*db);
    ModelRecord model;
    model.sha256 = std::string(64, 'a');
    model.name = "small";
    model.path = "models/small.gguf";
    registry.add_model(model);
    DomainRecord domain;
    domain.name = "code";
    domain.description = "source code";
    domain.source = "builtin";
    registry.add_domain(domain);
    HeadRecord head;
    head.name = "code-mtp";
    head.domain = "code";
    head.type = "mtp";
    head.base_model_sha256 = model.sha256;
    head.file = "heads/code-mtp.gguf";
    head.summary_json = R"({"simulated_accept_per_step": 2.1, "curve": {"step": [1]}})";
    EvaluationRecord evaluation;
    evaluation.head_id = registry.add_head(head);
    evaluation.domain = "code";
    evaluation.spec = "chain";
    evaluation.accept_per_step = 2.1;
    evaluation.per_position = {0.6, 0.4};
    evaluation.decode_tok_s = 300;
    evaluation.baseline_decode_tok_s = 250;
    evaluation.target_quant = "native";
    evaluation.prompts = 3;
    evaluation.tokens = 96;
    registry.add_evaluation(evaluation);
    Conversations conversations(*db);
    MessageRecord message;
    message.conversation_id = conversations.create("seed", R"({"temperature": 0})");
    message.role = "user";
    message.content = "Hello";
    conversations.add_message(message);
    message.role = "assistant";
    message.content = "Hi.";
    message.stats_json = R"({"decode_tok_s": 88.5})";
    conversations.add_message(message);
    RunRecord run;
    run.kind = "serve-bench";
    run.title = "seed";
    run.model = "small.gguf";
    run.config_json = R"({"requests": 4})";
    run.summary_json = R"({"throughput_tok_s": 512})";
    RunStore(*db).add(run);
  }
  std::error_code ec;
  for (const char* side : {"-wal", "-shm"}) fs::remove(path.string() + side, ec);
}

}  // namespace

void gguf_file(std::span<const uint8_t> bytes) {
  refused_or_done("GgufFile::parse", [&] {
    const gguf::GgufFile file = gguf::GgufFile::parse(bytes, "fuzz.gguf");
    for (const gguf::KeyValue& kv : file.metadata()) {
      if (file.find(kv.key) == nullptr) finding("metadata key '" + kv.key + "' not found again");
      read_value(kv.value);
    }
    for (const gguf::TensorInfo& t : file.tensors()) {
      if (file.find_tensor(t.name) != &t) finding("tensor '" + t.name + "' not found again");
      // A tensor's bytes lie inside the file: touch the first and the last.
      if (t.n_bytes > 0) {
        const uint8_t* begin = file.bytes().data();
        const uint8_t* end = begin + file.bytes().size();
        if (t.data < begin || t.data + t.n_bytes > end)
          finding("tensor '" + t.name + "' reaches outside the file");
        volatile uint8_t sink = t.data[0];
        sink = t.data[t.n_bytes - 1];
        (void)sink;
      }
    }
  });
}

void model_file(std::span<const uint8_t> bytes) {
  const ScratchFile file("-model.gguf", bytes);
  refused_or_done("model load", [&] {
    const std::unique_ptr<LlamaModel> model = LlamaModel::load(file.path());
    const Tokenizer tokenizer = Tokenizer::from_gguf(model->file());
    const ChatTemplate chat = ChatTemplate::from_gguf(model->file());
    const std::string prompt = chat.apply({{"user", "Say hi."}}, true);
    const std::vector<TokenId> ids = tokenizer.encode(prompt, tokenizer.add_bos_token(), true);
    (void)tokenizer.decode(ids);
    // A model that loads must also run: a short greedy generation on one thread.
    if (ids.empty()) return;
    Generator generator(*model, tokenizer, 1, 64);
    GenerateOptions options;
    options.max_tokens = 2;
    options.sampling.temperature = 0.0f;
    (void)generator.generate(ids, options);
  });
}

void head_file(std::span<const uint8_t> bytes) {
  const ScratchFile file("-head.gguf", bytes);
  refused_or_done("draft head load", [&] {
    const DraftHead head = load_draft_head(file.path());
    const LlamaModel& small = small_model();
    const HParams& hp = small.hparams();
    // A head of the small model's shape is put to work as the engine would.
    check_head_matches(head.info, head.info.base_model_sha256, hp.n_embd, hp.n_vocab, "fuzz-small");
    const int64_t d = hp.n_embd;
    std::vector<float> h(static_cast<size_t>(head.feature_width()), 0.25f);
    if (head.is_mtp()) {
      std::vector<TokenId> draft;
      std::vector<int32_t> parent;
      const std::vector<int32_t> chain(static_cast<size_t>(head.n_heads()), 1);
      head.mtp_propose(small, h.data(), 5, chain, head.n_heads(), draft, parent);
      const std::vector<int32_t> tree{2, 2};
      head.mtp_propose_best_first(small, h.data(), 5, tree, 6, draft, parent);
    } else {
      std::vector<float> z(static_cast<size_t>(d));
      for (int k = 0; k < head.n_heads(); ++k) head.residual(k, h.data(), 1, z.data());
    }
  });
}

void tokenizer_text(std::span<const uint8_t> bytes) {
  const Tokenizer* tokenizer = embedded_tokenizer();
  if (tokenizer == nullptr) return;
  const std::string text(reinterpret_cast<const char*>(bytes.data()), bytes.size());
  std::vector<TokenId> ids;
  refused_or_done("encode", [&] { ids = tokenizer->encode(text, false, false); });
  // Byte-level BPE gives back every byte it has a token for.
  static const std::vector<bool> has_token = [&] {
    std::vector<bool> has(256);
    for (int b = 0; b < 256; ++b)
      has[static_cast<size_t>(b)] =
          !tokenizer->encode(std::string(1, static_cast<char>(b)), false, false).empty();
    return has;
  }();
  std::string kept;
  for (const char c : text)
    if (has_token[static_cast<uint8_t>(c)]) kept.push_back(c);
  const std::string decoded = tokenizer->decode(ids, true);
  if (decoded != kept) finding("decode(encode(text)) differs from the text");
  // The incremental detokenizer emits the same bytes for valid UTF-8 (it only ever holds back
  // incomplete characters, replaced at the end).
  IncrementalDetokenizer detok(*tokenizer, true);
  std::string streamed;
  for (const TokenId id : ids) streamed += detok.push(id);
  streamed += detok.flush();
  if (utf8::is_valid(decoded) && streamed != decoded)
    finding("the incremental detokenizer differs from decode");
  // Special tokens parsed from the text must also decode back to it when rendered.
  refused_or_done("encode special", [&] {
    const std::vector<TokenId> special = tokenizer->encode(text, false, true);
    if (tokenizer->decode(special, true) != kept)
      finding("decode(encode(text, parse_special)) differs from the text");
  });
}

void chat_template(std::span<const uint8_t> bytes) {
  const std::string text(bytes.begin(), bytes.end());
  refused_or_done("chat template", [&] {
    const ChatTemplate t = ChatTemplate::from_template_text(text, "fuzz input");
    const std::vector<ChatMessage> turns = {{"system", "Be brief."},
                                            {"user", "Hi \xF0\x9F\x91\x8B"},
                                            {"assistant", "Hello."},
                                            {"user", "{{ not a template }}"}};
    (void)t.apply(turns, true);
    (void)t.apply(turns, false);
  });
}

void openai_request(std::span<const uint8_t> bytes) {
  if (bytes.empty()) return;
  const api::Endpoint endpoint =
      bytes[0] % 2 == 0 ? api::Endpoint::kChat : api::Endpoint::kCompletion;
  const std::string body(bytes.begin() + 1, bytes.end());
  api::OpenAiRequest r;
  try {
    r = api::parse_openai_request(body, endpoint);
  } catch (const api::ApiError& e) {
    if (e.status != 400) finding("a refusal with status " + std::to_string(e.status));
    if (std::string(e.what()).empty()) finding("a refusal without a message");
    return;
  }
  try {
    r.sampling.validate();
  } catch (const Error& e) {
    finding(std::string("an accepted request whose sampling does not validate: ") + e.what());
  }
  if (r.stop.size() > api::OpenAiRequest::kMaxStop) finding("more stop strings than allowed");
  for (const std::string& stop : r.stop)
    if (stop.empty()) finding("an empty stop string was kept");
  if (r.logprobs && (*r.logprobs < 0 || *r.logprobs > api::OpenAiRequest::kMaxTopLogprobs))
    finding("logprobs out of range");
  if (r.max_tokens && *r.max_tokens < 1) finding("max_tokens below 1");
  if (endpoint == api::Endpoint::kChat ? r.messages.empty() : r.prompt.empty())
    finding("an accepted request without input");
  // The response shapes over what came in (the prompt as the text: any bytes).
  const api::ResponseIdentity who = api::new_identity(endpoint, r.model);
  const std::vector<api::LogprobEntry> entries = {{r.prompt, -0.5f, {{r.model, -1.0f}}}};
  (void)api::sse_event(
      api::chunk_json(who, r.prompt, true, "", api::logprobs_json(endpoint, true, entries)));
  (void)api::dump(api::completion_json(who, r.prompt, "stop", {1, 2}, {}));
}

void write_seeds(const fs::path& dir) {
  for (const char* target :
       {"gguf_file", "model_file", "head_file", "tokenizer_text", "sampler_rows", "database_file",
        "quant_blocks", "chat_template", "openai_request"})
    fs::create_directories(dir / target);
  {
    const std::pair<const char*, std::string> bodies[] = {
        {"chat_full",
         std::string(1, '\0') +
             R"({"model":"m","messages":[{"role":"system","content":"Be brief."},{"role":"user","content":[{"type":"text","text":"Hi"}]}],"max_tokens":16,"temperature":0.7,"top_p":0.9,"top_k":40,"min_p":0.05,"seed":7,"stop":["\n\n","END"],"stream":true,"stream_options":{"include_usage":true},"logprobs":true,"top_logprobs":5,"n":1,"user":"u","tokenfab":{"head":"auto","spec":"tree","lookup":3,"draft_len":4}})"},
        {"completion_full",
         std::string(1, '\1') +
             R"({"model":"m","prompt":"Once upon a time","max_tokens":8,"logprobs":2,"stop":"\n","seed":1,"echo":false})"},
        {"chat_refused", std::string(1, '\0') + R"({"messages":[],"tools":[{"type":"function"}]})"},
    };
    for (const auto& [name, body] : bodies) {
      std::ofstream out(dir / "openai_request" / name, std::ios::binary);
      out << body;
    }
  }
  // Templates we wrote in each family's style (tests/data/jinja_*.jinja).
  for (const fs::directory_entry& e :
       fs::directory_iterator(fs::path(TOKENFAB_SOURCE_DIR) / "tests" / "data")) {
    const std::string name = e.path().filename().string();
    if (name.rfind("jinja_", 0) == 0 && e.path().extension() == ".jinja")
      fs::copy_file(e.path(), dir / "chat_template" / name, fs::copy_options::overwrite_existing);
  }
  const SyntheticShape shape = small_shape();
  // Q4_K on a shape whose FFN rows (n_ff = 256) are whole super-blocks: ffn_down is Q4_K, the
  // matrices of 64-element rows take llama-quantize's fallback type.
  const SyntheticShape k_shape = [&] {
    SyntheticShape k = shape;
    k.n_ff = kernels::kQK_K;
    return k;
  }();
  for (const auto& [type, name, model_shape] :
       {std::tuple{kernels::WeightType::Q4_1, "small-q4_1.gguf", &shape},
        std::tuple{kernels::WeightType::Q8_0, "small-q8_0.gguf", &shape},
        std::tuple{kernels::WeightType::Q4_K, "small-q4_k.gguf", &k_shape}}) {
    write_synthetic_llama(dir / "model_file" / name, *model_shape, type, 7);
    fs::copy_file(dir / "model_file" / name, dir / "gguf_file" / name,
                  fs::copy_options::overwrite_existing);
  }
  write_quant_block_seeds(dir / "quant_blocks");
  DraftHeadInfo info;
  info.name = "fuzz-medusa";
  info.domain = "code";
  info.base_model_sha256 = std::string(64, 'a');
  info.n_heads = 2;
  info.n_embd = static_cast<int32_t>(shape.n_embd);
  info.n_vocab = static_cast<int32_t>(shape.n_vocab);
  save_draft_head(make_medusa_head(info), dir / "head_file" / "medusa.gguf");
  info.type = "mtp";
  info.name = "fuzz-mtp";
  info.n_heads = 3;
  info.taps = {0};
  std::vector<TokenId> vocab;
  for (TokenId t = 0; t < 40; ++t) vocab.push_back(t * 5);
  save_draft_head(make_mtp_head(info, vocab), dir / "head_file" / "mtp-taps.gguf");
  const char* prompts[] = {
      "def add(a, b):\n    return a + b\n",
      "<|im_start|>user\nHello there<|im_end|>\n<|im_start|>assistant\n",
      ("Caf\xC3\xA9 na\xC3\xAFve \xED\x95\x9C\xEA\xB5\xAD\xEC\x96\xB4 \xF0\x9F\x98\x80  "
       "tabs\tand   spaces"),
      "{\"key\": [1, 2.5e3, null], \"s\": \"\\u00e9\"}",
  };
  int i = 0;
  for (const char* p : prompts) {
    std::ofstream out(dir / "tokenizer_text" / ("prompt-" + std::to_string(i++) + ".txt"),
                      std::ios::binary);
    out << p;
    if (!out) throw Error("could not write a tokenizer seed into " + dir.string());
  }
  // Rows of 300 logits on a 1/4 grid (ties) with a -inf and a NaN, for the default parameters,
  // greedy, and top-p alone.
  std::mt19937_64 rng(11);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  for (const auto& [name, params] :
       {std::pair{"default", SamplingParams{}}, std::pair{"greedy", SamplingParams{0.0f}},
        std::pair{"top-p", SamplingParams{1.0f, 0, 0.5f, 0.0f, 3}}}) {
    std::string bytes(24, '\0');
    std::memcpy(bytes.data(), &params.temperature, 4);
    std::memcpy(bytes.data() + 4, &params.top_p, 4);
    std::memcpy(bytes.data() + 8, &params.min_p, 4);
    std::memcpy(bytes.data() + 12, &params.top_k, 4);
    std::memcpy(bytes.data() + 16, &params.seed, 8);
    for (int i = 0; i < 300; ++i) {
      float v = std::round(normal(rng) * 4.0f) / 4.0f;
      if (i == 17) v = -std::numeric_limits<float>::infinity();
      if (i == 42) v = std::nanf("");
      bytes.append(reinterpret_cast<const char*>(&v), sizeof v);
    }
    std::ofstream out(dir / "sampler_rows" / (std::string(name) + ".bin"), std::ios::binary);
    out << bytes;
    if (!out) throw Error("could not write a sampler seed into " + dir.string());
  }
  write_database_seed(dir / "database_file" / "registry.db");
}

void sampler_rows(std::span<const uint8_t> bytes) {
  // temperature, top_p, min_p (f32), top_k (i32), seed (u64), then the row's logits (f32).
  constexpr size_t kHeader = 4 * 4 + 8;
  if (bytes.size() < kHeader + sizeof(float)) return;
  const auto read = [&](size_t at, auto& v) { std::memcpy(&v, bytes.data() + at, sizeof v); };
  SamplingParams p;
  read(0, p.temperature);
  read(4, p.top_p);
  read(8, p.min_p);
  read(12, p.top_k);
  read(16, p.seed);
  try {
    p.validate();
  } catch (const Error&) {
    return;  // refused with one message: what the CLI and the app do with such flags
  }
  const size_t n = std::min<size_t>((bytes.size() - kHeader) / sizeof(float), 4096);
  std::vector<float> logits(n);
  std::memcpy(logits.data(), bytes.data() + kHeader, n * sizeof(float));

  const kernels::CandidateFilter filter = candidate_filter(p);
  std::vector<float> cand_logits;
  std::vector<int32_t> cand_ids;
  const auto vocab = static_cast<int64_t>(n);
  const int32_t count = kernels::filter_candidates(
      logits.data(), vocab, filter, kernels::candidate_slots(filter, vocab), cand_logits, cand_ids);
  Sampler whole(p);
  Sampler filtered(p);
  const LogitRow whole_row(logits);
  const LogitRow row = count < 0 ? whole_row
                                 : LogitRow(std::span<const float>(cand_logits.data(), count),
                                            std::span<const int32_t>(cand_ids.data(), count),
                                            kernels::top_k_limits(filter, vocab));
  for (int32_t c = 0; c < std::max(count, 0); ++c)
    if (cand_ids[static_cast<size_t>(c)] < 0 || cand_ids[static_cast<size_t>(c)] >= vocab)
      finding("a candidate id outside the row");
  std::mt19937_64 drafts(p.seed);
  for (int draw = 0; draw < 4; ++draw) {
    int32_t a = -1, b = -1;
    refused_or_done("sample (whole row)", [&] { a = whole.sample(whole_row); });
    refused_or_done("sample (candidates)", [&] { b = filtered.sample(row); });
    if (a != b) finding("candidates drew another token than the whole row");
    if (a != -1 && (a < 0 || a >= vocab)) finding("a sampled token outside the row");
    const auto draft = static_cast<int32_t>(drafts() % n);
    bool accepted_whole = false, accepted_filtered = false;
    refused_or_done("accept_draft", [&] {
      accepted_whole = whole.accept_draft(whole_row, draft);
      accepted_filtered = filtered.accept_draft(row, draft);
    });
    if (accepted_whole != accepted_filtered)
      finding("candidates accepted a draft differently from the whole row");
    if (!accepted_whole) {
      refused_or_done("sample_rejected", [&] {
        a = whole.sample_rejected(whole_row, draft);
        b = filtered.sample_rejected(row, draft);
      });
      if (a != b) finding("candidates resampled a rejection differently from the whole row");
    }
  }
}

void database_file(std::span<const uint8_t> bytes) {
  const ScratchFile file("-tokenfab.db", bytes);
  refused_or_done("database", [&] {
    const std::unique_ptr<Database> db = Database::open(file.path());
    Registry registry(*db);
    (void)registry.domains();
    for (const HeadRecord& head : registry.heads()) {
      refused_or_done("evaluations", [&] { (void)registry.evaluations(head.id); });
      refused_or_done("head file", [&] { (void)registry.head_file(head); });
      (void)registry.find_head(std::to_string(head.id));
      (void)registry.find_head(head.name);
      (void)registry.find_model(head.base_model_sha256);
      refused_or_done("best head", [&] {
        (void)registry.best_head_for(head.domain, head.base_model_sha256, "chain");
      });
    }
    Conversations conversations(*db);
    for (const ConversationRecord& c : conversations.list())
      refused_or_done("messages", [&] { (void)conversations.messages(c.id); });
    (void)conversations.search("a");
    RunStore runs(*db);
    for (const RunRecord& run : runs.list()) (void)runs.get(run.id);
  });
  std::error_code ec;
  for (const char* side : {"-wal", "-shm", "-journal"}) fs::remove(file.path().string() + side, ec);
}

bool embedded_tokenizer_available() {
  return embedded_tokenizer() != nullptr;
}

Target target_named(std::string_view name) {
  if (name == "gguf_file") return gguf_file;
  if (name == "model_file") return model_file;
  if (name == "head_file") return head_file;
  if (name == "tokenizer_text") return tokenizer_text;
  if (name == "sampler_rows") return sampler_rows;
  if (name == "database_file") return database_file;
  if (name == "quant_blocks") return quant_blocks;
  if (name == "chat_template") return chat_template;
  if (name == "openai_request") return openai_request;
  return nullptr;
}

}  // namespace tokenfab::fuzz
