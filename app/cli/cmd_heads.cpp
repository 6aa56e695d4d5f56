// heads: draft heads for speculative decoding — train one on a domain by self-distillation,
// evaluate it by really generating, and manage the registry (list, show, delete, export).
//
//   heads train --name NAME --domain D (--prompt-set NAME | --corpus PATH…) [--heads K] [--steps N]
//   heads eval --head ID|NAME|PATH (--prompt-set NAME | --prompts FILE) [--max-tokens N]
//   heads list | show ID|NAME | delete ID|NAME | export ID|NAME --out PATH
//
// Training data: a built-in domain's train split (the target's own continuations of its prompts),
// "all" for every domain's train split, any built-in prompt set, or the user's files and folders
// (text, code, JSONL with "text"/"prompt" fields) read at run time. Traces are cached in the user
// data directory under a key of the model, the data and the options. Progress goes to stderr;
// Ctrl-C cancels, and nothing half-written is left behind.

#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <sstream>

#include "cli_common.h"
#include "core/common/error.h"
#include "core/common/sha256.h"
#include "core/serving/engine.h"
#include "core/serving/prompt_sets.h"
#include "core/storage/database.h"
#include "core/storage/registry.h"
#include "core/tokenizer/chat_template.h"
#include "core/training/trace_recorder.h"
#include "core/training/trainer.h"
#include "head_options.h"
#include "kernels/cpu/quant_types.h"

namespace tokenfab::cli {

namespace {

namespace fs = std::filesystem;

std::atomic<bool> g_cancel{false};
void on_sigint(int) {
  g_cancel.store(true);
}

std::string duration_text(double s) {
  const auto t = static_cast<int64_t>(s + 0.5);
  char buf[32];
  if (t >= 3600) {
    std::snprintf(buf, sizeof buf, "%lldh%02lldm", static_cast<long long>(t / 3600),
                  static_cast<long long>(t / 60 % 60));
  } else {
    std::snprintf(buf, sizeof buf, "%lldm%02llds", static_cast<long long>(t / 60),
                  static_cast<long long>(t % 60));
  }
  return buf;
}

// Prompts of a named set: a built-in domain's split, "all" (every domain's split), or a built-in
// prompt set.
std::vector<std::string> named_prompts(const std::string& name, const std::string& split) {
  std::vector<std::string> out;
  auto add = [&](const PromptSet& set) {
    out.insert(out.end(), set.entries.begin(), set.entries.end());
  };
  const std::vector<std::string> domains = builtin_domains();
  if (name == "all") {
    for (const std::string& d : domains) add(domain_prompt_set(d, split));
  } else if (std::find(domains.begin(), domains.end(), name) != domains.end()) {
    add(domain_prompt_set(name, split));
  } else {
    add(builtin_prompt_set(name));
  }
  return out;
}

// One prompt per line, or JSONL with a "prompt" field.
std::vector<std::string> prompts_from_file(const fs::path& file) {
  std::ifstream in(file);
  if (!in) throw Error("cannot read " + file.string());
  std::vector<std::string> out;
  std::string line;
  for (int64_t n = 1; std::getline(in, line); ++n) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.find_first_not_of(" \t") == std::string::npos) continue;
    if (line.front() == '{') {
      nlohmann::json j;
      try {
        j = nlohmann::json::parse(line);
      } catch (const std::exception& e) {
        throw Error(file.string() + ":" + std::to_string(n) + ": not valid JSON: " + e.what());
      }
      if (!j.contains("prompt") || !j["prompt"].is_string())
        throw Error(file.string() + ":" + std::to_string(n) + ": no string field \"prompt\"");
      out.push_back(j["prompt"].get<std::string>());
    } else {
      out.push_back(line);
    }
  }
  if (out.empty()) throw Error(file.string() + " holds no prompts");
  return out;
}

// Text of the user's corpus: files, and folders read recursively; JSONL lines contribute their
// "text", "prompt", "completion" and "content" strings; files with NUL bytes are skipped.
std::string read_corpus(const std::vector<std::string>& paths) {
  std::string text;
  auto add_file = [&](const fs::path& file) {
    std::ifstream in(file, std::ios::binary);
    if (!in) throw Error("cannot read " + file.string());
    std::stringstream ss;
    ss << in.rdbuf();
    std::string body = ss.str();
    if (body.find('\0') != std::string::npos) return;  // binary
    if (file.extension() == ".jsonl") {
      std::istringstream lines(body);
      std::string line;
      body.clear();
      while (std::getline(lines, line)) {
        try {
          const nlohmann::json j = nlohmann::json::parse(line);
          for (const char* key : {"text", "prompt", "completion", "content"})
            if (j.contains(key) && j[key].is_string()) body += j[key].get<std::string>() + "\n\n";
        } catch (const std::exception&) {
        }
      }
    }
    text += body;
    text += "\n\n";
  };
  for (const std::string& p : paths) {
    if (fs::is_directory(p)) {
      std::vector<fs::path> files;
      for (const auto& e : fs::recursive_directory_iterator(p))
        if (e.is_regular_file()) files.push_back(e.path());
      std::sort(files.begin(), files.end());
      for (const fs::path& f : files) add_file(f);
    } else if (fs::is_regular_file(p)) {
      add_file(p);
    } else {
      throw Error("--corpus " + p + ": no such file or folder");
    }
  }
  if (text.find_first_not_of(" \n\t\r") == std::string::npos)
    throw Error("the corpus holds no text");
  return text;
}

std::vector<TokenId> chat_prompt(const LoadedModel& m, const ChatTemplate& tmpl,
                                 const std::string& text) {
  return m.tokenizer->encode(tmpl.apply({{"user", text}}, true), m.tokenizer->add_bos_token(),
                             true);
}

// ---- heads train ----------------------------------------------------------------------------

struct TrainCommand {
  CommonOptions common;
  std::string name, domain;
  std::optional<std::string> prompt_set;
  std::vector<std::string> corpus;
  std::string type = "medusa";
  int heads = 4;
  int steps = 600;
  int continuation = 96;
  int max_prompts = 0;
  int batch = 256;
  float lr = 3e-3f;
  bool no_cache = false;
  uint64_t seed = 0;
};

void run_train(const TrainCommand& c) {
  if (c.name.empty() || c.name.find_first_not_of("0123456789") == std::string::npos)
    throw Error("--name must be a non-empty name that is not all digits");
  if (c.type == "mtp") throw Error("--type mtp: MTP draft heads are not available yet; use medusa");
  if (c.type != "medusa") throw Error("--type " + c.type + ": expected medusa");
  if (c.prompt_set.has_value() == !c.corpus.empty())
    throw Error("give exactly one of --prompt-set NAME or --corpus PATH…");
  if (c.heads < 1 || c.heads > 16) throw Error("--heads must be 1..16");
  LoadedModel m = load_model(c.common);
  const HParams& hp = m.model->hparams();
  const std::string sha = model_sha256(*m.model);
  const auto db = Database::open_default();
  Registry registry(*db);
  if (const auto taken = registry.find_head(c.name))
    throw Error("a head named '" + c.name + "' already exists (id " + std::to_string(taken->id) +
                "); pick another --name or delete it first");
  std::signal(SIGINT, on_sigint);
  auto log = [&](const std::string& line) { std::cerr << line << std::endl; };

  // Training data → traces (cached).
  TraceOptions trace_options;
  trace_options.continuation_tokens = c.continuation;
  trace_options.threads = c.common.threads;
  std::vector<std::vector<TokenId>> prompts;
  std::vector<TokenId> corpus_tokens;
  std::string data_key = "model=" + sha + ";continuation=" + std::to_string(c.continuation) +
                         ";top_k=" + std::to_string(trace_options.top_k) + ";";
  std::string source;
  if (c.prompt_set) {
    std::vector<std::string> texts = named_prompts(*c.prompt_set, "train");
    if (c.max_prompts > 0 && static_cast<int>(texts.size()) > c.max_prompts)
      texts.resize(c.max_prompts);
    const ChatTemplate tmpl = ChatTemplate::from_gguf(m.model->file());
    for (const std::string& t : texts) {
      prompts.push_back(chat_prompt(m, tmpl, t));
      data_key += t + "\x1f";
    }
    source = "prompt-set:" + *c.prompt_set;
  } else {
    const std::string text = read_corpus(c.corpus);
    corpus_tokens = m.tokenizer->encode(text, false, false);
    data_key += "corpus:" + sha256_hex(text);
    source = "corpus";
  }
  const fs::path trace_file =
      user_data_dir() / "traces" / (sha256_hex(data_key).substr(0, 24) + ".trace");
  const auto trace_start = std::chrono::steady_clock::now();
  TraceSet traces;
  bool cached = false;
  if (!c.no_cache && fs::exists(trace_file)) {
    try {
      traces = TraceSet::load(trace_file);
      cached = true;
      log("traces: " + std::to_string(traces.n_pos()) + " positions from the cache (" +
          trace_file.string() + ")");
    } catch (const Error& e) {
      log(std::string("traces: the cached file is unusable (") + e.what() + "); recording again");
    }
  }
  if (!cached) {
    auto progress = [&](int64_t done, int64_t total) {
      const double s =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - trace_start).count();
      const double eta =
          done > 0 ? s * static_cast<double>(total - done) / static_cast<double>(done) : 0.0;
      std::cerr << "\rtracing " << done << " / " << total << " tokens ("
                << (total ? 100 * done / total : 0) << "%), ETA " << duration_text(eta) << "   "
                << std::flush;
      return !g_cancel.load();
    };
    if (c.prompt_set) {
      traces = record_continuations(
          *m.model, prompts, trace_options,
          [&](TokenId t) { return m.tokenizer->is_end_of_generation(t); }, progress);
    } else {
      traces = record_corpus(*m.model, corpus_tokens, 256, trace_options, progress);
    }
    std::cerr << std::endl;
    if (g_cancel.load()) throw Error("cancelled while tracing; no head was saved");
    fs::create_directories(trace_file.parent_path());
    traces.save(trace_file);
  }
  const double trace_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - trace_start).count();

  // Training.
  DraftHeadInfo info;
  info.name = c.name;
  info.domain = c.domain;
  info.base_model_sha256 = sha;
  info.n_heads = c.heads;
  info.n_embd = static_cast<int32_t>(hp.n_embd);
  info.n_vocab = static_cast<int32_t>(hp.n_vocab);
  TrainOptions options;
  options.steps = c.steps;
  options.batch = c.batch;
  options.lr = c.lr;
  options.threads = c.common.threads;
  options.seed = c.seed;
  const nlohmann::json config = {{"source", source},
                                 {"continuation_tokens", c.continuation},
                                 {"steps", c.steps},
                                 {"batch", c.batch},
                                 {"lr", c.lr},
                                 {"heads", c.heads},
                                 {"trace_positions", traces.n_pos()},
                                 {"seed", c.seed}};
  info.training_config_json = config.dump();
  const TrainResult r =
      train_medusa(*m.model, make_medusa_head(info), traces, options, [&](const TrainProgress& p) {
        if (p.val_loss) {
          std::ostringstream line;
          line.precision(4);
          line << "step " << p.step << "/" << p.steps << "  loss " << p.loss << "  val "
               << *p.val_loss;
          if (!p.val_top1.empty()) {
            line << "  top1";
            for (const double t : p.val_top1) line << " " << t;
          }
          if (p.simulated_accept_per_step)
            line << "  sim ACCEPT/STEP " << *p.simulated_accept_per_step;
          line << "  " << static_cast<int64_t>(p.positions_per_s) << " pos/s  ETA "
               << duration_text(p.eta_s);
          log(line.str());
        }
        return !g_cancel.load();
      });
  if (r.cancelled)
    throw Error("training cancelled at step " + std::to_string(r.steps_run) +
                "; no head was saved");

  MedusaHead head = r.head;
  const nlohmann::json summary = {{"val_loss", r.final_val_loss},
                                  {"initial_val_loss", r.initial_val_loss},
                                  {"val_top1", r.val_top1},
                                  {"simulated_accept_per_step", r.simulated_accept_per_step},
                                  {"initial_accept_per_step", r.initial_accept_per_step},
                                  {"steps_run", r.steps_run},
                                  {"stopped_early", r.stopped_early},
                                  {"train_positions", r.train_positions},
                                  {"val_positions", r.val_positions},
                                  {"shortlist", r.shortlist_size},
                                  {"train_seconds", r.seconds},
                                  {"trace_seconds", trace_s},
                                  {"trace_cached", cached}};
  head.info.summary_json = summary.dump();
  fs::path file = user_data_dir() / "heads" / (c.name + ".gguf");
  for (int i = 2; fs::exists(file); ++i)
    file = user_data_dir() / "heads" / (c.name + "-" + std::to_string(i) + ".gguf");
  fs::create_directories(file.parent_path());
  save_draft_head(head, file);
  HeadRecord record;
  record.name = c.name;
  record.domain = c.domain;
  record.type = "medusa";
  record.base_model_sha256 = sha;
  record.file = file.string();
  record.training_config_json = info.training_config_json;
  record.summary_json = head.info.summary_json;
  int64_t id = 0;
  try {
    registry.add_model(
        {0, sha, fs::path(m.model->file().name()).filename().string(), m.model->file().name(), 0});
    registry.add_domain({0, c.domain, "", "user"});
    id = registry.add_head(record);
  } catch (...) {
    fs::remove(file);  // not registered: leave nothing behind
    throw;
  }
  nlohmann::json out = summary;
  out["head_id"] = id;
  out["name"] = c.name;
  out["domain"] = c.domain;
  out["file"] = file.string();
  out["type"] = "medusa";
  out["heads"] = c.heads;
  out["trace_positions"] = traces.n_pos();
  out["seconds"] = trace_s + r.seconds;
  print_report(out, c.common.json);
}

// ---- heads eval -----------------------------------------------------------------------------

struct EvalCommand {
  CommonOptions common;
  HeadOptions head;
  std::optional<std::string> prompt_set;
  std::optional<std::string> prompts_file;
  int max_tokens = 128;
  int max_prompts = 0;
  bool no_record = false;
  std::string target_quant = "native";
};

struct Totals {
  int64_t decode_tokens = 0, steps = 0, tokens = 0;
  double decode_s = 0;
  void add(const RequestInfo& info) {
    if (!info.metrics) return;
    tokens += info.metrics->output_tokens;
    for (const int32_t n : info.metrics->tokens_per_step) {
      decode_tokens += n;
      ++steps;
    }
    if (info.metrics->e2e_s && info.metrics->ttft_s)
      decode_s += *info.metrics->e2e_s - *info.metrics->ttft_s;
  }
  double tok_s() const {
    return decode_s > 0 ? static_cast<double>(decode_tokens) / decode_s : 0.0;
  }
};

void run_eval(const EvalCommand& c) {
  if (c.prompt_set.has_value() == c.prompts_file.has_value())
    throw Error("give exactly one of --prompt-set NAME or --prompts FILE");
  if (c.head.head == "none") throw Error("--head is required (ID, NAME or PATH)");
  static const std::map<std::string, kernels::WeightType> kQuants = {
      {"f16", kernels::WeightType::F16},
      {"q8_0", kernels::WeightType::Q8_0},
      {"q4_1", kernels::WeightType::Q4_1},
      {"q4_0", kernels::WeightType::Q4_0}};
  if (c.target_quant != "native" && !kQuants.count(c.target_quant))
    throw Error("--target-quant " + c.target_quant + ": expected native, f16, q8_0, q4_1 or q4_0");
  LoadedModel m = load_model(c.common);
  const std::shared_ptr<const MedusaHead> head = resolve_head(c.head, *m.model);
  // The quantization study: the target re-quantized in memory; the native file's speed without a
  // head is measured too, so the net effect of the cheaper (or richer) target shows.
  std::unique_ptr<LlamaModel> requantized;
  if (c.target_quant != "native") {
    requantized = LlamaModel::load(m.model->file().name());
    requantized->requantize(kQuants.at(c.target_quant));
  }
  const LlamaModel& target = requantized ? *requantized : *m.model;
  std::vector<std::string> texts = c.prompt_set ? named_prompts(*c.prompt_set, "validation")
                                                : prompts_from_file(*c.prompts_file);
  if (c.max_prompts > 0 && static_cast<int>(texts.size()) > c.max_prompts)
    texts.resize(c.max_prompts);
  const ChatTemplate tmpl = ChatTemplate::from_gguf(m.model->file());
  EngineConfig config;
  config.threads = c.common.threads;
  auto is_end = [&tok = *m.tokenizer](TokenId t) { return tok.is_end_of_generation(t); };
  Engine engine(target, config, is_end);
  std::unique_ptr<Engine> native;
  if (requantized) native = std::make_unique<Engine>(*m.model, config, is_end);
  std::signal(SIGINT, on_sigint);
  Totals with, without, native_totals;
  std::vector<int64_t> proposed, accepted;
  bool lossless = true;
  const auto start = std::chrono::steady_clock::now();
  for (size_t i = 0; i < texts.size() && !g_cancel.load(); ++i) {
    GenerationRequest r{chat_prompt(m, tmpl, texts[i]), c.max_tokens};
    const RequestInfo base = engine.wait(engine.submit(r));
    r.head = head;
    r.draft_len = c.head.draft_len;
    const RequestInfo spec = engine.wait(engine.submit(r));
    if (base.state != RequestState::kFinished || spec.state != RequestState::kFinished)
      throw Error("prompt " + std::to_string(i + 1) +
                  " failed: " + (base.error.empty() ? spec.error : base.error));
    lossless = lossless && base.output == spec.output;
    if (native) {
      r.head = nullptr;
      native_totals.add(native->wait(native->submit(r)));
    }
    without.add(base);
    with.add(spec);
    const SpeculationStats& st = spec.speculation;
    proposed.resize(std::max(proposed.size(), st.proposed_at.size()));
    accepted.resize(proposed.size());
    for (size_t p = 0; p < st.proposed_at.size(); ++p) {
      proposed[p] += st.proposed_at[p];
      accepted[p] += st.accepted_at[p];
    }
    const double s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::cerr << "\rprompt " << i + 1 << "/" << texts.size() << "  ACCEPT/STEP "
              << (with.steps ? static_cast<double>(with.decode_tokens) / with.steps : 0.0)
              << "  ETA "
              << duration_text(s / static_cast<double>(i + 1) *
                               static_cast<double>(texts.size() - i - 1))
              << "   " << std::flush;
  }
  std::cerr << std::endl;
  if (g_cancel.load()) throw Error("evaluation cancelled; nothing was recorded");
  std::vector<double> per_position;
  for (size_t p = 0; p < proposed.size(); ++p)
    per_position.push_back(proposed[p] ? static_cast<double>(accepted[p]) / proposed[p] : 0.0);
  const double accept = with.steps ? static_cast<double>(with.decode_tokens) / with.steps : 1.0;
  nlohmann::json out = {{"accept_per_step", accept},
                        {"per_position", per_position},
                        {"decode_tok_s", with.tok_s()},
                        {"baseline_decode_tok_s", without.tok_s()},
                        {"speedup", without.tok_s() > 0 ? with.tok_s() / without.tok_s() : 0.0},
                        {"prompts", texts.size()},
                        {"tokens", with.tokens},
                        {"lossless", lossless},
                        {"head", head->info.name},
                        {"spec", c.head.spec},
                        {"draft_len", std::min(c.head.draft_len, head->n_heads())},
                        {"domain", c.prompt_set ? *c.prompt_set : "file:" + *c.prompts_file},
                        {"target_quant", c.target_quant}};
  if (native) {
    out["native_decode_tok_s"] = native_totals.tok_s();
    out["net_speedup_vs_native"] =
        native_totals.tok_s() > 0 ? with.tok_s() / native_totals.tok_s() : 0.0;
  }
  if (!lossless) throw Error("speculative output differed from the target's own: " + out.dump());
  if (!c.no_record) {
    const auto db = Database::open_default();
    Registry registry(*db);
    if (const auto record = registry.find_head(head->info.name);
        record && record->base_model_sha256 == head->info.base_model_sha256) {
      EvaluationRecord e;
      e.head_id = record->id;
      e.domain = out["domain"];
      e.spec = c.head.spec;
      e.accept_per_step = accept;
      e.per_position = per_position;
      e.decode_tok_s = with.tok_s();
      e.baseline_decode_tok_s = without.tok_s();
      e.target_quant = c.target_quant;
      e.prompts = static_cast<int64_t>(texts.size());
      e.tokens = with.tokens;
      out["evaluation_id"] = registry.add_evaluation(e);
    }
  }
  print_report(out, c.common.json);
}

// ---- heads list / show / delete / export ------------------------------------------------------

nlohmann::json head_json(const HeadRecord& h) {
  auto parse = [](const std::string& s) {
    try {
      return nlohmann::json::parse(s.empty() ? "{}" : s);
    } catch (const std::exception&) {
      return nlohmann::json(s);
    }
  };
  return {{"id", h.id},
          {"name", h.name},
          {"domain", h.domain},
          {"type", h.type},
          {"base_model_sha256", h.base_model_sha256},
          {"file", h.file},
          {"created_unix", h.created_unix},
          {"training_config", parse(h.training_config_json)},
          {"summary", parse(h.summary_json)}};
}

HeadRecord find_or_throw(Registry& registry, const std::string& id_or_name) {
  const auto h = registry.find_head(id_or_name);
  if (!h) throw Error("no head '" + id_or_name + "' (see `tokenfab-cli heads list`)");
  return *h;
}

}  // namespace

void register_heads(CLI::App& app) {
  auto* heads = app.add_subcommand("heads", "draft heads for speculative decoding");
  heads->require_subcommand(1);

  auto t = std::make_shared<TrainCommand>();
  auto* train =
      heads->add_subcommand("train", "train a Medusa head on a domain (self-distillation)");
  add_run_options(*train, t->common);
  train->add_option("--name", t->name, "name of the new head")->required();
  train->add_option("--domain", t->domain, "the domain it is for (e.g. code)")->required();
  train->add_option("--prompt-set", t->prompt_set,
                    "built-in domain (train split), all, or prompt set");
  train->add_option("--corpus", t->corpus, "files or folders of text, code or JSONL");
  train->add_option("--type", t->type, "head type: medusa")->capture_default_str();
  train->add_option("--heads", t->heads, "number of heads (tokens proposed)")
      ->capture_default_str();
  train->add_option("--steps", t->steps, "optimisation steps")->capture_default_str();
  train->add_option("--continuation", t->continuation, "tokens the target writes per prompt")
      ->capture_default_str();
  train->add_option("--max-prompts", t->max_prompts, "use at most this many prompts (0: all)");
  train->add_option("--batch", t->batch, "positions per mini-batch")->capture_default_str();
  train->add_option("--lr", t->lr, "peak learning rate")->capture_default_str();
  train->add_option("--seed", t->seed, "seed")->capture_default_str();
  train->add_flag("--no-cache", t->no_cache, "record traces again even when cached");
  train->callback([t] { run_train(*t); });

  auto e = std::make_shared<EvalCommand>();
  auto* eval = heads->add_subcommand("eval", "measure a head by generating (ACCEPT/STEP, speedup)");
  add_run_options(*eval, e->common);
  add_head_options(*eval, e->head);
  eval->add_option("--prompt-set", e->prompt_set,
                   "built-in domain (validation split) or prompt set");
  eval->add_option("--prompts", e->prompts_file,
                   "file: one prompt per line, or JSONL with \"prompt\"");
  eval->add_option("--max-tokens", e->max_tokens, "tokens per prompt")->capture_default_str();
  eval->add_option("--max-prompts", e->max_prompts, "use at most this many prompts (0: all)");
  eval->add_flag("--no-record", e->no_record, "do not record the evaluation in the registry");
  eval->add_option("--target-quant", e->target_quant,
                   "re-quantize the target in memory first: native, f16, q8_0, q4_1, q4_0")
      ->capture_default_str();
  eval->callback([e] { run_eval(*e); });

  auto json = std::make_shared<bool>(false);
  auto* list = heads->add_subcommand("list", "registered heads, newest first");
  list->add_flag("--json", *json, "one JSON object on stdout");
  list->callback([json] {
    const auto db = Database::open_default();
    Registry registry(*db);
    nlohmann::json out = nlohmann::json::array();
    for (const HeadRecord& h : registry.heads()) out.push_back(head_json(h));
    if (*json) {
      print_json({{"heads", out}});
      return;
    }
    if (out.empty()) std::cout << "no heads yet; train one with `tokenfab-cli heads train`\n";
    for (const auto& h : out)
      std::cout << h["id"] << "  " << h["name"].get<std::string>() << "  ("
                << h["type"].get<std::string>() << ", " << h["domain"].get<std::string>() << ")  "
                << h["file"].get<std::string>() << "\n";
  });

  auto target = std::make_shared<std::string>();
  auto out_path = std::make_shared<std::string>();
  auto* show = heads->add_subcommand("show", "one head with its evaluations");
  show->add_option("head", *target, "ID or NAME")->required();
  show->add_flag("--json", *json, "one JSON object on stdout");
  show->callback([target, json] {
    const auto db = Database::open_default();
    Registry registry(*db);
    const HeadRecord h = find_or_throw(registry, *target);
    nlohmann::json out = head_json(h);
    nlohmann::json evals = nlohmann::json::array();
    for (const EvaluationRecord& ev : registry.evaluations(h.id))
      evals.push_back({{"id", ev.id},
                       {"domain", ev.domain},
                       {"spec", ev.spec},
                       {"accept_per_step", ev.accept_per_step},
                       {"per_position", ev.per_position},
                       {"decode_tok_s", ev.decode_tok_s},
                       {"baseline_decode_tok_s", ev.baseline_decode_tok_s},
                       {"target_quant", ev.target_quant},
                       {"prompts", ev.prompts},
                       {"tokens", ev.tokens},
                       {"created_unix", ev.created_unix}});
    out["evaluations"] = evals;
    print_report(out, *json);
  });

  auto* del = heads->add_subcommand("delete", "remove a head and its file");
  del->add_option("head", *target, "ID or NAME")->required();
  del->callback([target] {
    const auto db = Database::open_default();
    Registry registry(*db);
    const HeadRecord h = find_or_throw(registry, *target);
    registry.remove_head(h.id);
    std::error_code ec;
    fs::remove(h.file, ec);
    std::cerr << "deleted head " << h.id << " (" << h.name << ")" << std::endl;
  });

  auto* exp = heads->add_subcommand("export", "copy a head's GGUF file");
  exp->add_option("head", *target, "ID or NAME")->required();
  exp->add_option("--out", *out_path, "destination file")->required();
  exp->callback([target, out_path] {
    const auto db = Database::open_default();
    Registry registry(*db);
    const HeadRecord h = find_or_throw(registry, *target);
    const MedusaHead head = load_draft_head(registry.head_file(h));  // validated before copying
    save_draft_head(head, *out_path);
    std::cerr << "exported head " << h.id << " (" << h.name << ") to " << *out_path << std::endl;
  });
}

}  // namespace tokenfab::cli
