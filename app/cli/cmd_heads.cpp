// heads: draft heads for speculative decoding — train one on a domain by self-distillation,
// evaluate it by really generating, and manage the registry (list, show, delete, export).
//
//   heads train --name NAME --domain D [--prompt-set NAME] [--corpus PATH…] [--samples N]
//               [--self-prompts N] [--heads K] [--steps N]
//   heads eval --head ID|NAME|PATH (--prompt-set NAME | --prompts FILE) [--max-tokens N]
//              [--lookup N] [--adaptive]   (--head none --lookup N: the context lookup alone)
//   heads list | show ID|NAME | delete ID|NAME
//   heads export ID|NAME --out PATH [--format gguf|medusa-hf] [--model PATH] [--force]
//
// Training data: a built-in domain's train split (the target's own continuations of its prompts),
// "all" for every domain's train split, any built-in prompt set, or the user's files and folders
// (text, code, JSONL with "text"/"prompt" fields) read at run time, or a prompt set and files
// together. --samples N adds N sampled continuations of each prompt to the greedy one, so that the
// head also learns from contexts off the greedy path; --self-prompts N has the target write N more
// requests like the set's (each opened with a prompt's first words) and traces its answers too.
// Traces are cached in the user data directory under a key of the model, the data and the options.
// Progress goes to stderr; Ctrl-C cancels, and nothing half-written is left behind.

#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <memory>
#include <sstream>

#include "cli_common.h"
#include "core/common/error.h"
#include "core/common/sha256.h"
#include "core/model/model_library.h"
#include "core/serving/engine.h"
#include "core/serving/prompt_sets.h"
#include "core/speculative/medusa_export.h"
#include "core/storage/database.h"
#include "core/storage/registry.h"
#include "core/training/generation_eval.h"
#include "core/training/head_training_job.h"
#include "head_options.h"

namespace tokenfab::cli {

namespace {

namespace fs = std::filesystem;

std::atomic<bool> g_cancel{false};
void on_sigint(int) {
  g_cancel.store(true);
}

// A report for reading (without --json): a summary's training curve, which --json prints point by
// point, becomes one line saying what it holds.
nlohmann::json readable(nlohmann::json report) {
  nlohmann::json* summary = report.contains("summary") ? &report["summary"] : &report;
  if (!summary->is_object() || !summary->contains("curve")) return report;
  const TrainingCurve c = TrainingCurve::from_summary(summary->dump());
  std::ostringstream line;
  line.precision(3);
  if (c.empty()) {
    line << "none recorded";
  } else {
    line << c.size() << " evaluations; simulated ACCEPT/STEP " << c.accept.front() << " at step "
         << c.step.front() << ", " << c.accept.back() << " at step " << c.step.back()
         << " (--json for every point)";
  }
  (*summary)["curve"] = line.str();
  return report;
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

// ---- heads train ----------------------------------------------------------------------------

struct TrainCommand {
  CommonOptions common;
  std::string name, domain;
  std::optional<std::string> prompt_set;
  std::vector<std::string> corpus;
  std::string type = HeadTrainingRequest{}.type;
  int heads = HeadTrainingRequest{}.heads;
  int steps = HeadTrainingRequest{}.steps;
  int continuation = HeadTrainingRequest{}.continuation;
  int max_prompts = 0;
  int batch = HeadTrainingRequest{}.batch;
  float lr = HeadTrainingRequest{}.lr;
  int rollout = -1;
  std::string taps;  // on, off, or empty: on for mtp heads (HeadTrainingRequest's default)
  int samples = 0;
  int self_prompts = 0;
  float sample_temperature = HeadTrainingRequest{}.sample_temperature;
  bool no_cache = false;
  uint64_t seed = 0;
};

void run_train(const TrainCommand& c) {
  HeadTrainingRequest r;
  r.name = c.name;
  r.domain = c.domain;
  r.prompt_set = c.prompt_set;
  r.corpus = c.corpus;
  r.type = c.type;
  r.heads = c.heads;
  r.steps = c.steps;
  r.continuation = c.continuation;
  r.max_prompts = c.max_prompts;
  r.batch = c.batch;
  r.lr = c.lr;
  r.rollout = c.rollout;
  r.taps = c.taps.empty() ? c.type == "mtp" && HeadTrainingRequest{}.taps : c.taps == "on";
  r.samples = c.samples;
  r.self_prompts = c.self_prompts;
  r.sample_temperature = c.sample_temperature;
  r.seed = c.seed;
  r.threads = c.common.threads;
  r.no_cache = c.no_cache;
  validate_head_training(r);  // before the model loads, so a bad flag fails at once
  LoadedModel m = load_model(c.common);
  std::signal(SIGINT, on_sigint);
  bool tracing_line = false;
  const HeadTrainingResult result =
      run_head_training(*m.model, *m.tokenizer, r, [&](const HeadTrainingProgress& p) {
        if (p.phase == "tracing" && p.message.empty()) {
          std::cerr << "\rtracing " << p.step << " / " << p.steps << " tokens ("
                    << (p.steps ? 100 * static_cast<int64_t>(p.step) / p.steps : 0) << "%), ETA "
                    << duration_text(p.eta_s) << "   " << std::flush;
          tracing_line = true;
          return !g_cancel.load();
        }
        if (tracing_line) {
          std::cerr << std::endl;
          tracing_line = false;
        }
        if (!p.message.empty() && p.phase != "saving") std::cerr << p.message << std::endl;
        if (p.phase == "training" && p.val_loss) {
          std::ostringstream line;
          line.precision(4);
          line << "step " << p.step << "/" << p.steps << "  loss " << p.loss << "  val "
               << *p.val_loss;
          if (!p.val_top1.empty()) {
            line << "  top1";
            for (const double t : p.val_top1) line << " " << t;
          }
          if (p.sim_accept_per_step) line << "  sim ACCEPT/STEP " << *p.sim_accept_per_step;
          line << "  " << static_cast<int64_t>(p.positions_per_s) << " pos/s  ETA "
               << duration_text(p.eta_s);
          std::cerr << line.str() << std::endl;
        }
        return !g_cancel.load();
      });
  print_report(c.common.json ? result.report : readable(result.report), c.common.json);
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
  bool adaptive = false;
  std::string target_quant = "native";
  EngineConfig engine;  // the devices it generates on (--devices, --prefill/--decode, …)
};

void run_eval(const EvalCommand& c) {
  if (c.prompt_set.has_value() == c.prompts_file.has_value())
    throw Error("give exactly one of --prompt-set NAME or --prompts FILE");
  if (c.head.head == "none" && c.head.lookup == 0)
    throw Error("--head is required (ID, NAME or PATH; none with --lookup N)");
  if (c.adaptive && c.head.spec == "tree")
    throw Error("--adaptive chooses a chain's length; a tree (--spec tree) has a fixed shape");
  check_target_quant(c.target_quant);
  LoadedModel m = load_model(c.common);
  GenerationEvalRequest r;
  r.head = resolve_head(c.head, *m.model);
  r.prompts = c.prompt_set ? named_prompts(*c.prompt_set, "validation")
                           : prompts_from_file(*c.prompts_file);
  if (c.max_prompts > 0 && static_cast<int>(r.prompts.size()) > c.max_prompts)
    r.prompts.resize(c.max_prompts);
  r.max_tokens = c.max_tokens;
  r.draft_len = c.head.draft_len;
  r.tree_shape = c.head.request_tree();
  r.tree_nodes = c.head.request_tree_nodes();
  r.lookup = c.head.lookup;
  r.adaptive = c.adaptive;
  r.target_quant = c.target_quant;
  r.config = c.engine;
  r.config.threads = c.common.threads;
  std::signal(SIGINT, on_sigint);
  const GenerationEvalResult result =
      evaluate_by_generating(*m.model, *m.tokenizer, r, [](const GenerationEvalProgress& p) {
        if (p.phase == "quantizing")
          std::cerr << "re-quantizing the target…" << std::flush;
        else
          std::cerr << "\rprompt " << p.done << "/" << p.total << "  ACCEPT/STEP "
                    << p.accept_per_step << "  ETA " << duration_text(p.eta_s) << "   "
                    << std::flush;
        return !g_cancel.load();
      });
  std::cerr << std::endl;
  const std::vector<double> per_position = result.with.per_position();
  const double accept = result.with.accept_per_step();
  const std::shared_ptr<const DraftHead>& head = r.head;
  nlohmann::json out = {
      {"accept_per_step", accept},
      {"per_position", per_position},
      {"decode_tok_s", result.with.tok_s()},
      {"baseline_decode_tok_s", result.without.tok_s()},
      {"speedup", result.speedup()},
      {"step_ms", result.with.step_ms()},
      {"baseline_step_ms", result.without.step_ms()},
      {"draft_ms_per_step", result.with.draft_ms_per_step()},
      {"verify_ms_per_step", result.with.verify_ms_per_step()},
      {"prompts", result.prompts},
      {"tokens", result.with.tokens},
      {"lossless", result.lossless},
      {"head", head ? nlohmann::json(head->info.name) : nlohmann::json()},
      {"spec", c.head.spec},
      {"draft_len", head ? std::min(c.head.draft_len, head->n_heads()) : c.head.draft_len},
      {"tree_shape", c.head.request_tree()},
      {"tree_nodes", c.head.request_tree_nodes()},
      {"lookup", c.head.lookup},
      {"adaptive", r.adaptive},
      {"length_steps", result.with.length_steps},
      {"domain", c.prompt_set ? *c.prompt_set : "file:" + *c.prompts_file},
      {"target_quant", c.target_quant},
      {"devices", r.config.devices_text()}};
  if (result.native) {
    out["native_decode_tok_s"] = result.native->tok_s();
    out["net_speedup_vs_native"] = result.net_speedup_vs_native();
  }
  if (!result.lossless)
    throw Error("speculative output differed from the target's own: " + out.dump());
  // An evaluation records the head's own acceptance over fixed chains: runs with context lookup
  // drafts, which add tokens no head proposed, and runs with adaptive lengths, whose per-position
  // acceptance is of the drafts the length policy let through, are reported but not recorded.
  if (c.head.lookup > 0 && !c.no_record)
    std::cerr << "not recorded: --lookup adds context lookup drafts to the head's" << std::endl;
  else if (c.adaptive && !c.no_record)
    std::cerr << "not recorded: --adaptive chooses each step's length" << std::endl;
  if (!c.no_record && c.head.lookup == 0 && !c.adaptive) {
    const auto db = Database::open_default();
    Registry registry(*db);
    if (const auto record = registry.find_head(head->info.name);
        record && record->base_model_sha256 == head->info.base_model_sha256) {
      EvaluationRecord e = evaluation_record(r, result);
      e.head_id = record->id;
      e.domain = out["domain"];
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

struct ExportCommand {
  std::string head, out;
  std::string format = "gguf";
  std::optional<std::string> model;
  bool force = false;
};

// medusa-hf: the target's file — --model, else the registered model of the head's sha256 while
// its file is still there, else the embedded default. Either way it must be the head's model.
std::unique_ptr<LlamaModel> export_target(const ExportCommand& c, Registry& registry,
                                          const DraftHead& head) {
  std::optional<std::string> requested = c.model;
  if (!requested)
    if (const auto m = registry.find_model(head.info.base_model_sha256); m && fs::exists(m->path))
      requested = m->path;
  // Only the LM head is read: no repacking.
  auto model = LlamaModel::load(resolve_model_path(requested), false);
  const HParams& hp = model->hparams();
  check_head_matches(head.info, model_file_sha256(*model), hp.n_embd, hp.n_vocab,
                     fs::path(model->file().name()).filename().string());
  return model;
}

void run_export(const ExportCommand& c) {
  const auto db = Database::open_default();
  Registry registry(*db);
  const HeadRecord h = find_or_throw(registry, c.head);
  const DraftHead head = load_draft_head(registry.head_file(h));  // validated before writing
  if (c.format == "gguf") {
    if (c.model || c.force) throw Error("--model and --force go with --format medusa-hf");
    save_draft_head(head, c.out);
    std::cerr << "exported head " << h.id << " (" << h.name << ") to " << c.out << std::endl;
    return;
  }
  check_medusa_exportable(head.info);  // before the model loads
  const std::unique_ptr<LlamaModel> model = export_target(c, registry, head);
  const MedusaExport e = export_medusa_hf(head, *model, c.out, c.force);
  std::cerr << "exported head " << h.id << " (" << h.name << ", " << head.n_heads()
            << " medusa heads, LM head " << safetensors_dtype_name(e.lm_head_dtype) << ", "
            << e.weights_bytes / (1 << 20) << " MiB) to " << c.out
            << "\nvLLM: --speculative-config '{\"method\": \"medusa\", \"model\": \"" << c.out
            << "\", \"num_speculative_tokens\": " << head.n_heads() << "}'" << std::endl;
}

}  // namespace

void register_heads(CLI::App& app) {
  auto* heads = app.add_subcommand("heads", "draft heads for speculative decoding");
  heads->require_subcommand(1);

  auto t = std::make_shared<TrainCommand>();
  auto* train = heads->add_subcommand(
      "train", "train a draft head (medusa or mtp) on a domain (self-distillation)");
  add_run_options(*train, t->common);
  train->add_option("--name", t->name, "name of the new head")->required();
  train->add_option("--domain", t->domain, "the domain it is for (e.g. code)")->required();
  train->add_option("--prompt-set", t->prompt_set,
                    "built-in domain (train split), all, or prompt set");
  train->add_option("--corpus", t->corpus,
                    "files or folders of text, code or JSONL (with or without --prompt-set)");
  train
      ->add_option("--samples", t->samples,
                   "sampled continuations of each prompt besides the greedy one (0..16)")
      ->capture_default_str();
  train
      ->add_option("--self-prompts", t->self_prompts,
                   "more prompts the target writes itself, each opened with the first words of a "
                   "prompt of --prompt-set (0..20000); their continuations are traced too")
      ->capture_default_str();
  train
      ->add_option("--sample-temperature", t->sample_temperature,
                   "temperature of the sampled continuations")
      ->capture_default_str();
  train
      ->add_option("--type", t->type,
                   "head type: medusa (K parallel heads) or mtp (one sequential block, K steps)")
      ->check(CLI::IsMember({"medusa", "mtp"}))
      ->capture_default_str();
  train->add_option("--heads", t->heads, "number of heads (tokens proposed)")
      ->capture_default_str();
  train->add_option("--steps", t->steps, "optimisation steps")->capture_default_str();
  train->add_option("--continuation", t->continuation, "tokens the target writes per prompt")
      ->capture_default_str();
  train->add_option("--max-prompts", t->max_prompts, "use at most this many prompts (0: all)");
  train->add_option("--batch", t->batch, "positions per mini-batch")->capture_default_str();
  train->add_option("--lr", t->lr, "peak learning rate")->capture_default_str();
  train
      ->add_option("--rollout", t->rollout,
                   "mtp: training rows per position that continue from the head's own "
                   "predicted hidden states (default: heads - 1, every step of a chain)")
      ->check(CLI::Range(0, 16));
  train
      ->add_option("--taps", t->taps,
                   std::string("mtp: the first draft step also reads the target's inner layers "
                               "(EAGLE-3 style features; default: ") +
                       (HeadTrainingRequest{}.taps ? "on" : "off") + " for mtp heads)")
      ->check(CLI::IsMember({"on", "off"}));
  train->add_option("--seed", t->seed, "seed")->capture_default_str();
  train->add_flag("--no-cache", t->no_cache, "record traces again even when cached");
  train->callback([t] { run_train(*t); });

  auto e = std::make_shared<EvalCommand>();
  auto* eval = heads->add_subcommand("eval", "measure a head by generating (ACCEPT/STEP, speedup)");
  add_run_options(*eval, e->common);
  add_head_options(*eval, e->head, false);
  eval->add_option("--prompt-set", e->prompt_set,
                   "built-in domain (validation split) or prompt set");
  eval->add_option("--prompts", e->prompts_file,
                   "file: one prompt per line, or JSONL with \"prompt\"");
  eval->add_option("--max-tokens", e->max_tokens, "tokens per prompt")->capture_default_str();
  eval->add_option("--max-prompts", e->max_prompts, "use at most this many prompts (0: all)");
  eval->add_flag("--no-record", e->no_record, "do not record the evaluation in the registry");
  eval->add_flag("--adaptive", e->adaptive,
                 "chain: choose each step's length up to --draft-len as generate and chat do "
                 "(measured costs, acceptance and the head's confidence); reported, not recorded");
  eval->add_option("--target-quant", e->target_quant,
                   "re-quantize the target in memory first: " + target_quant_names_text() +
                       " (the K-quant names: llama-quantize's mixtures of those names)")
      ->capture_default_str();
  add_engine_options(*eval, e->engine);
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
    print_report(*json ? out : readable(out), *json);
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

  auto x = std::make_shared<ExportCommand>();
  auto* exp = heads->add_subcommand(
      "export", "write a head's GGUF file, or a medusa head as a vLLM Medusa checkpoint");
  exp->add_option("head", x->head, "ID or NAME")->required();
  exp->add_option("--out", x->out, "destination: a file (gguf), a directory (medusa-hf)")
      ->required();
  exp->add_option("--format", x->format,
                  "gguf: the head's own file; medusa-hf: config.json and model.safetensors as "
                  "vLLM's Medusa drafter loads them, the target's LM head included (medusa heads)")
      ->check(CLI::IsMember({"gguf", "medusa-hf"}))
      ->capture_default_str();
  exp->add_option("--model", x->model,
                  "medusa-hf: the target GGUF whose LM head goes with the head (default: the "
                  "registered file the head was trained on, else the embedded model)");
  exp->add_flag("--force", x->force, "medusa-hf: replace an earlier export in --out");
  exp->callback([x] { run_export(*x); });
}

}  // namespace tokenfab::cli
