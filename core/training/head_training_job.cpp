#include "core/training/head_training_job.h"

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <sstream>

#include "core/common/atomic_file.h"
#include "core/common/error.h"
#include "core/common/log.h"
#include "core/common/sha256.h"
#include "core/model/transformer_pass.h"
#include "core/serving/prompt_sets.h"
#include "core/speculative/draft_head.h"
#include "core/storage/database.h"
#include "core/storage/registry.h"
#include "core/storage/training_runs.h"
#include "core/tokenizer/chat_template.h"
#include "core/training/prompt_writer.h"
#include "core/training/trace_recorder.h"
#include "core/training/trainer.h"

namespace tokenfab {

namespace {

namespace fs = std::filesystem;

constexpr double kTracingShare = 0.3;  // of the overall fraction

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
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

}  // namespace

void validate_head_training(const HeadTrainingRequest& r) {
  if (r.name.empty() || r.name.find_first_not_of("0123456789") == std::string::npos)
    throw Error("--name must be a non-empty name that is not all digits");
  if (r.type != "medusa" && r.type != "mtp")
    throw Error("--type " + r.type + ": expected medusa or mtp");
  if (!r.prompt_set && r.corpus.empty())
    throw Error("give --prompt-set NAME, --corpus PATH…, or both");
  if (r.samples < 0 || r.samples > 16) throw Error("--samples must be 0..16");
  if (r.samples > 0 && !r.prompt_set)
    throw Error("--samples continues the prompts of --prompt-set; a corpus is read as it is");
  if (r.self_prompts < 0 || r.self_prompts > 20000) throw Error("--self-prompts must be 0..20000");
  if (r.self_prompts > 0 && !r.prompt_set)
    throw Error("--self-prompts writes more prompts like those of --prompt-set; give one");
  if (!(r.sample_temperature > 0.0f && r.sample_temperature <= 2.0f))
    throw Error("--sample-temperature must be in (0, 2]");
  if (r.heads < 1 || r.heads > 16) throw Error("--heads must be 1..16");
  if (r.rollout < -1 || r.rollout > 16) throw Error("--rollout must be 0..16 (or −1: heads − 1)");
  if (r.taps && r.type != "mtp") throw Error("--taps on is for mtp heads (--type mtp)");
}

void DecodeTotals::add(const RequestInfo& info) {
  const SpeculationStats& st = info.speculation;
  proposed_at.resize(std::max(proposed_at.size(), st.proposed_at.size()));
  accepted_at.resize(proposed_at.size());
  for (size_t p = 0; p < st.proposed_at.size(); ++p) {
    proposed_at[p] += st.proposed_at[p];
    accepted_at[p] += st.accepted_at[p];
  }
  verify_steps += st.verify_steps;
  length_steps.resize(std::max(length_steps.size(), st.length_steps.size()));
  for (size_t k = 0; k < st.length_steps.size(); ++k) length_steps[k] += st.length_steps[k];
  draft_s += st.draft_s;
  verify_s += st.verify_s;
  if (!info.metrics) return;
  tokens += info.metrics->output_tokens;
  for (const int32_t n : info.metrics->tokens_per_step) {
    decode_tokens += n;
    ++steps;
  }
  if (info.metrics->e2e_s && info.metrics->ttft_s)
    decode_s += *info.metrics->e2e_s - *info.metrics->ttft_s;
}

std::vector<double> DecodeTotals::per_position() const {
  std::vector<double> rates;
  for (size_t p = 0; p < proposed_at.size(); ++p)
    rates.push_back(proposed_at[p]
                        ? static_cast<double>(accepted_at[p]) / static_cast<double>(proposed_at[p])
                        : 0.0);
  return rates;
}

namespace {

struct Traces {
  TraceSet set;
  bool cached = false;
  double seconds = 0.0;
  std::string source;
  int64_t written_prompts = 0;  // kept of those the target wrote (request.self_prompts)
};

constexpr int32_t kWrittenTurnTokens = 96;  // a written request not ended by then is dropped

// The requests the target writes after the set's prompts `texts` (prompt_writer.h), cached as a
// JSON array beside the traces under a key of the model, the examples and the options; `cached`
// tells whether they came from that file. `message` is a line for the log, or empty.
std::vector<std::string> written_prompts(const LlamaModel& model, const Tokenizer& tokenizer,
                                         const ChatTemplate& tmpl,
                                         const std::vector<std::string>& texts,
                                         const HeadTrainingRequest& r, const std::string& sha,
                                         const TraceProgress& progress, std::string& message,
                                         bool& cached) {
  PromptWriting w;
  w.count = r.self_prompts;
  w.max_tokens = kWrittenTurnTokens;
  w.seed = r.seed;
  w.threads = r.threads;
  std::string key = "written-prompts-v1;model=" + sha + ";count=" + std::to_string(w.count) +
                    ";max_tokens=" + std::to_string(w.max_tokens) +
                    ";temperature=" + std::to_string(w.temperature) +
                    ";seed=" + std::to_string(w.seed) + ";";
  for (const std::string& t : texts) key += t + "\x1f";
  const fs::path file =
      user_data_dir() / "traces" / (sha256_hex(key).substr(0, 24) + ".prompts.json");
  cached = false;
  std::string unusable;  // reported once the prompts are written, not with every progress line
  if (!r.no_cache && fs::exists(file)) {
    try {
      std::ifstream in(file);
      const auto texts_read = nlohmann::json::parse(in).get<std::vector<std::string>>();
      message = "written prompts: " + std::to_string(texts_read.size()) + " from the cache (" +
                file.string() + ")";
      cached = true;
      return texts_read;
    } catch (const std::exception& e) {
      unusable = std::string("written prompts: the cached file is unusable (") + e.what() +
                 "); written again";
    }
  }
  bool cancelled = false;
  std::vector<std::string> out =
      write_prompts(model, tokenizer, tmpl, texts, w, progress, &cancelled);
  if (cancelled) throw Error("cancelled while writing prompts; no head was saved");
  create_folders_for(file);
  // A temporary file of its own, renamed into place whole: a CLI and the app may write at once.
  write_file_atomically(file, nlohmann::json(out).dump(1));
  message = unusable;
  return out;
}

// The request's data → traces. The data come in parts — the greedy continuations of the prompts,
// each sampled pass over them, the same for the prompts the target wrote, the corpus — and each
// part is cached on its own under a key of the model, its data and its options, so that adding
// sampled passes, written prompts or files to a run traced before records only what is new.
Traces trace_data(const LlamaModel& model, const Tokenizer& tokenizer, const HeadTrainingRequest& r,
                  const std::string& sha,
                  const std::function<bool(const HeadTrainingProgress&)>& progress) {
  TraceOptions options;
  options.continuation_tokens = r.continuation;
  options.threads = r.threads;
  options.taps = r.taps && r.type == "mtp";
  std::string model_key = "model=" + sha + ";continuation=" + std::to_string(r.continuation) +
                          ";top_k=" + std::to_string(options.top_k) + ";";
  if (options.taps) {
    model_key += "taps=";
    for (const int32_t layer : draft_tap_layers(model.hparams().n_layer))
      model_key += std::to_string(layer) + ",";
    model_key += ";";
  }
  struct Part {
    std::string key;
    int group = 0;         // prompts: 0 the set's, 1 those the target wrote
    int sampled_pass = 0;  // prompts: 0 greedy, p > 0 the p-th sampled pass
    bool corpus = false;
    int64_t tokens = 0;  // positions to record (for progress)
  };
  std::vector<Part> parts;
  std::vector<std::vector<TokenId>> prompts[2];
  std::vector<std::string> texts;
  std::vector<TokenId> corpus_tokens;
  Traces out;
  // Greedy and sampled parts of a group of prompts; the written ones' key says so.
  const auto add_group = [&](int group, const std::vector<std::string>& group_texts,
                             const ChatTemplate& tmpl) {
    std::string key = model_key + (group == 1 ? "written;" : "");
    for (const std::string& t : group_texts) {
      prompts[group].push_back(
          tokenizer.encode(tmpl.apply({{"user", t}}, true), tokenizer.add_bos_token(), true));
      key += t + "\x1f";
    }
    const int64_t tokens = static_cast<int64_t>(group_texts.size()) * r.continuation;
    parts.push_back({key, group, 0, false, tokens});
    for (int pass = 1; pass <= r.samples; ++pass)
      parts.push_back({key + "sampled pass=" + std::to_string(pass) +
                           ";temperature=" + std::to_string(r.sample_temperature) +
                           ";seed=" + std::to_string(r.seed) + ";",
                       group, pass, false, tokens});
  };
  std::optional<ChatTemplate> tmpl;
  if (r.prompt_set) {
    texts = named_prompts(*r.prompt_set, "train");
    if (r.max_prompts > 0 && static_cast<int>(texts.size()) > r.max_prompts)
      texts.resize(r.max_prompts);
    tmpl = ChatTemplate::from_gguf(model.file());
    add_group(0, texts, *tmpl);
    out.source = "prompt-set:" + *r.prompt_set;
  }
  if (!r.corpus.empty()) {
    const std::string text = read_corpus(r.corpus);
    corpus_tokens = tokenizer.encode(text, false, false);
    // v2: the traces keep the text's own next tokens (earlier corpus traces lack them).
    parts.push_back({model_key + "corpus-v2:" + sha256_hex(text), 0, 0, true,
                     static_cast<int64_t>(corpus_tokens.size())});
  }

  const auto start = std::chrono::steady_clock::now();
  int64_t total = 0, before = 0;  // positions of every part, and of the parts done
  const int64_t write_positions =
      r.prompt_set ? static_cast<int64_t>(r.self_prompts) * kWrittenTurnTokens : 0;
  for (const Part& part : parts) total += part.tokens;
  total += write_positions +
           (r.prompt_set ? static_cast<int64_t>(r.self_prompts) * r.continuation * (1 + r.samples)
                         : 0);  // the written prompts' parts, at most
  HeadTrainingProgress p;
  p.phase = "tracing";
  bool cancelled = false, all_cached = true;
  const auto report = [&](int64_t done) {
    done += before;
    const double s = seconds_since(start);
    p.step = static_cast<int32_t>(done);
    p.steps = static_cast<int32_t>(total);
    p.fraction = total > 0 ? kTracingShare * static_cast<double>(done) / total : 0.0;
    p.eta_s = done > 0 ? s * static_cast<double>(total - done) / static_cast<double>(done) : 0.0;
    cancelled = cancelled || !progress(p);
    return !cancelled;
  };
  if (write_positions > 0) {
    const std::vector<std::string> written = written_prompts(
        model, tokenizer, *tmpl, texts, r, sha, [&](int64_t done, int64_t) { return report(done); },
        p.message, all_cached);
    if (!p.message.empty()) {
      report(write_positions);
      p.message.clear();
    }
    if (cancelled) throw Error("cancelled while writing prompts; no head was saved");
    out.written_prompts = static_cast<int64_t>(written.size());
    // The written prompts' parts go after the set's own, before the corpus.
    std::vector<Part> corpus_part;
    if (!parts.empty() && parts.back().corpus) {
      corpus_part.push_back(parts.back());
      parts.pop_back();
    }
    if (!written.empty()) add_group(1, written, *tmpl);
    parts.insert(parts.end(), corpus_part.begin(), corpus_part.end());
    before = write_positions;
    total = write_positions;
    for (const Part& part : parts) total += part.tokens;
    out.source += " (+" + std::to_string(written.size()) + " written)";
  }
  if (r.samples > 0) out.source += " (+" + std::to_string(r.samples) + " sampled)";
  if (!r.corpus.empty()) out.source += out.source.empty() ? "corpus" : "+corpus";
  out.set.seq_begin = {0};
  for (const Part& part : parts) {
    const fs::path file =
        user_data_dir() / "traces" / (sha256_hex(part.key).substr(0, 24) + ".trace");
    std::optional<TraceSet> set;
    if (!r.no_cache && fs::exists(file)) {
      try {
        set = TraceSet::load(file);
        p.message = "traces: " + std::to_string(set->n_pos()) + " positions from the cache (" +
                    file.string() + ")";
      } catch (const Error& e) {
        p.message =
            std::string("traces: the cached file is unusable (") + e.what() + "); recording again";
      }
      report(set ? part.tokens : 0);
      p.message.clear();
      if (cancelled) throw Error("cancelled while tracing; no head was saved");
    }
    if (!set) {
      all_cached = false;
      const auto on_trace = [&](int64_t done, int64_t) { return report(done); };
      if (part.corpus) {
        set = record_corpus(model, corpus_tokens, 256, options, on_trace);
      } else {
        const auto& group = prompts[part.group];
        TraceOptions o = options;
        if (part.sampled_pass > 0) {
          o.sampling = SamplingParams{};
          o.sampling.temperature = r.sample_temperature;
          o.sampling.seed = r.seed + static_cast<uint64_t>(part.sampled_pass) * group.size();
        }
        set = record_continuations(
            model, group, o, [&](TokenId t) { return tokenizer.is_end_of_generation(t); },
            on_trace);
      }
      if (cancelled) throw Error("cancelled while tracing; no head was saved");
      create_folders_for(file);
      set->save(file);
    }
    out.set.append(*set);
    before += part.tokens;
  }
  out.cached = all_cached;
  out.seconds = seconds_since(start);
  return out;
}

// Writes the head to a fresh file under the heads folder and registers it; on a registry error
// the file is removed again.
int64_t save_and_register(const LlamaModel& model, const DraftHead& head,
                          const HeadTrainingRequest& r, const std::string& sha, int64_t run_id,
                          int32_t steps_run, fs::path& file) {
  file = user_data_dir() / "heads" / (r.name + ".gguf");
  for (int i = 2; fs::exists(file); ++i)
    file = user_data_dir() / "heads" / (r.name + "-" + std::to_string(i) + ".gguf");
  create_folders_for(file);
  save_draft_head(head, file);
  HeadRecord record;
  record.name = r.name;
  record.domain = r.domain;
  record.type = head.info.type;
  record.base_model_sha256 = sha;
  record.file = file.string();
  record.training_config_json = head.info.training_config_json;
  record.summary_json = head.info.summary_json;
  try {
    const auto db = Database::open_default();
    Registry registry(*db);
    // The head's row and its run's end commit together: a kill leaves the run running (then
    // cancelled by the next open) with no head, or finished with its head.
    sqlite::Transaction transaction(db->connection());
    registry.add_model(
        {0, sha, fs::path(model.file().name()).filename().string(), model.file().name(), 0});
    registry.add_domain({0, r.domain, "", "user"});
    const int64_t head_id = registry.add_head(record);
    TrainingRuns runs(*db);
    runs.set_step(run_id, steps_run);
    runs.end(run_id, "finished", "", head_id);
    transaction.commit();
    return head_id;
  } catch (...) {
    std::error_code ec;
    fs::remove(file, ec);  // not registered: leave nothing behind
    throw;
  }
}

}  // namespace

std::string model_file_sha256(const LlamaModel& model) {
  static std::mutex mutex;
  static std::map<std::string, std::string> known;
  const std::string path = model.file().name();
  std::lock_guard lock(mutex);
  auto it = known.find(path);
  if (it == known.end()) it = known.emplace(path, sha256_file(path)).first;
  return it->second;
}

std::vector<std::string> named_prompts(const std::string& name, const std::string& split) {
  std::vector<std::string> out;
  auto add = [&](const PromptSet& set) {
    out.insert(out.end(), set.entries.begin(), set.entries.end());
  };
  const std::vector<std::string> domains = builtin_domains();
  if (name == "all") {
    // Round robin over the domains, so that the first N prompts (--max-prompts) hold every
    // domain evenly.
    std::vector<std::vector<std::string>> sets;
    size_t longest = 0;
    for (const std::string& d : domains) {
      sets.push_back(domain_prompt_set(d, split).entries);
      longest = std::max(longest, sets.back().size());
    }
    for (size_t i = 0; i < longest; ++i)
      for (const auto& set : sets)
        if (i < set.size()) out.push_back(set[i]);
  } else if (std::find(domains.begin(), domains.end(), name) != domains.end()) {
    add(domain_prompt_set(name, split));
  } else {
    add(builtin_prompt_set(name));
  }
  return out;
}

namespace {

// The run's row from begin to end: its step every few seconds while it trains, and how it ended
// when it did not finish (finishing commits with the head's row, in save_and_register).
class RunRow {
 public:
  RunRow(const HeadTrainingRequest& r, const std::string& sha)
      : db_(Database::open_default()), runs_(*db_) {
    TrainingRunRecord run;
    run.head_name = r.name;
    run.domain = r.domain;
    run.type = r.type;
    run.base_model_sha256 = sha;
    run.config_json = nlohmann::json{
        {"steps", r.steps},
        {"heads", r.heads},
        {"batch", r.batch},
        {"lr", r.lr},
        {"continuation", r.continuation},
        {"max_prompts", r.max_prompts},
        {"prompt_set", r.prompt_set.value_or("")},
        {"corpus", r.corpus},
        {"seed", r.seed}}.dump();
    run.steps = r.steps;
    id_ = runs_.begin(run);
  }
  int64_t id() const { return id_; }

  void progress(const HeadTrainingProgress& p) {
    const auto now = std::chrono::steady_clock::now();
    if (p.phase != "training" || now - saved_ < std::chrono::seconds(kSaveEverySeconds)) return;
    saved_ = now;
    try {
      runs_.set_step(id_, p.step);
    } catch (const std::exception& e) {  // a busy database must not stop the training
      logger("training")->warn("training run {}: cannot record step {}: {}", id_, p.step, e.what());
    }
  }
  void end(const char* state, const std::string& note) noexcept {
    try {
      runs_.end(id_, state, note);
    } catch (const std::exception& e) {  // the next open marks it cancelled
      logger("training")->warn("training run {}: cannot record its end: {}", id_, e.what());
    }
  }

 private:
  static constexpr int kSaveEverySeconds = 2;
  std::unique_ptr<Database> db_;
  TrainingRuns runs_;
  int64_t id_ = 0;
  std::chrono::steady_clock::time_point saved_{};
};

HeadTrainingResult train_and_save(
    const LlamaModel& model, const Tokenizer& tokenizer, const HeadTrainingRequest& r,
    const std::string& sha, int64_t run_id,
    const std::function<bool(const HeadTrainingProgress&)>& progress) {
  const HParams& hp = model.hparams();
  const Traces traces = trace_data(model, tokenizer, r, sha, progress);

  DraftHeadInfo info;
  info.type = r.type;
  info.name = r.name;
  info.domain = r.domain;
  info.base_model_sha256 = sha;
  info.n_heads = r.heads;
  info.n_embd = static_cast<int32_t>(hp.n_embd);
  info.n_vocab = static_cast<int32_t>(hp.n_vocab);
  TrainOptions options;
  options.steps = r.steps;
  options.batch = r.batch;
  options.lr = r.lr;
  options.threads = r.threads;
  options.seed = r.seed;
  options.rollout = r.rollout;
  nlohmann::json config = {{"source", traces.source},
                           {"continuation_tokens", r.continuation},
                           {"samples", r.samples},
                           {"self_prompts", r.self_prompts},
                           {"steps", r.steps},
                           {"batch", r.batch},
                           {"lr", r.lr},
                           {"heads", r.heads},
                           {"type", r.type},
                           {"trace_positions", traces.set.n_pos()},
                           {"seed", r.seed}};
  if (r.type == "mtp") {
    config["rollout"] = r.rollout < 0 ? r.heads - 1 : r.rollout;
    if (r.taps) info.taps = draft_tap_layers(hp.n_layer);
    config["taps"] = info.taps;
  }
  info.training_config_json = config.dump();
  DraftHead initial = r.type == "mtp" ? make_mtp_head(info, draft_vocabulary(traces.set, options))
                                      : make_medusa_head(info);
  TrainingCurve curve;
  double loss_sum = 0.0;  // training losses since the last evaluation
  int32_t loss_steps = 0;
  const TrainResult t =
      train_head(model, std::move(initial), traces.set, options, [&](const TrainProgress& tp) {
        if (tp.step > 0) {
          loss_sum += tp.loss;
          ++loss_steps;
        }
        if (tp.val_loss && tp.simulated_accept_per_step) {
          curve.step.push_back(tp.step);
          curve.train_loss.push_back(loss_steps > 0 ? loss_sum / loss_steps : tp.loss);
          curve.val_loss.push_back(*tp.val_loss);
          curve.accept.push_back(*tp.simulated_accept_per_step);
          loss_sum = 0.0;
          loss_steps = 0;
        }
        HeadTrainingProgress p;
        p.phase = "training";
        p.step = tp.step;
        p.steps = tp.steps;
        p.fraction =
            kTracingShare + (1.0 - kTracingShare) * 0.999 *
                                (tp.steps > 0 ? static_cast<double>(tp.step) / tp.steps : 0.0);
        p.loss = tp.loss;
        p.val_loss = tp.val_loss;
        p.val_top1 = tp.val_top1;
        p.sim_accept_per_step = tp.simulated_accept_per_step;
        p.positions_per_s = tp.positions_per_s;
        p.eta_s = tp.eta_s;
        return progress(p);
      });
  if (t.cancelled)
    throw Error("training cancelled at step " + std::to_string(t.steps_run) +
                "; no head was saved");

  DraftHead head = t.head;
  const nlohmann::json summary = {{"val_loss", t.final_val_loss},
                                  {"initial_val_loss", t.initial_val_loss},
                                  {"val_top1", t.val_top1},
                                  {"simulated_accept_per_step", t.simulated_accept_per_step},
                                  {"initial_accept_per_step", t.initial_accept_per_step},
                                  {"steps_run", t.steps_run},
                                  {"stopped_early", t.stopped_early},
                                  {"train_positions", t.train_positions},
                                  {"val_positions", t.val_positions},
                                  {"shortlist", t.shortlist_size},
                                  {"train_seconds", t.seconds},
                                  {"trace_seconds", traces.seconds},
                                  {"trace_cached", traces.cached},
                                  {"written_prompts", traces.written_prompts},
                                  {"curve", curve.to_json()}};
  head.info.summary_json = summary.dump();
  fs::path file;
  HeadTrainingResult result;
  result.head_id = save_and_register(model, head, r, sha, run_id, t.steps_run, file);
  result.file = file.string();
  result.report = summary;
  result.report["head_id"] = result.head_id;
  result.report["name"] = r.name;
  result.report["domain"] = r.domain;
  result.report["file"] = result.file;
  result.report["type"] = head.info.type;
  result.report["heads"] = r.heads;
  result.report["trace_positions"] = traces.set.n_pos();
  result.report["seconds"] = traces.seconds + t.seconds;
  HeadTrainingProgress done;
  done.phase = "saving";
  done.fraction = 1.0;
  done.step = done.steps = t.steps_run;
  done.sim_accept_per_step = t.simulated_accept_per_step;
  done.val_loss = t.final_val_loss;
  done.message = "saved head " + std::to_string(result.head_id) + " to " + result.file;
  progress(done);
  return result;
}

}  // namespace

HeadTrainingResult run_head_training(
    const LlamaModel& model, const Tokenizer& tokenizer, const HeadTrainingRequest& r,
    const std::function<bool(const HeadTrainingProgress&)>& progress) {
  validate_head_training(r);
  const std::string sha = model_file_sha256(model);
  {
    const auto db = Database::open_default();
    Registry registry(*db);
    if (const auto taken = registry.find_head(r.name))
      throw Error("a head named '" + r.name + "' already exists (id " + std::to_string(taken->id) +
                  "); pick another --name or delete it first");
  }
  RunRow row(r, sha);
  bool cancelled = false;
  try {
    return train_and_save(model, tokenizer, r, sha, row.id(), [&](const HeadTrainingProgress& p) {
      row.progress(p);
      cancelled = !progress(p);
      return !cancelled;
    });
  } catch (const std::exception& e) {
    row.end(cancelled ? "cancelled" : "failed", e.what());
    throw;
  }
}

nlohmann::json TrainingCurve::to_json() const {
  return {{"step", step}, {"train_loss", train_loss}, {"val_loss", val_loss}, {"accept", accept}};
}

TrainingCurve TrainingCurve::from_summary(const std::string& summary_json) {
  TrainingCurve c;
  const nlohmann::json summary = nlohmann::json::parse(summary_json, nullptr, false);
  if (!summary.is_object() || !summary.contains("curve")) return c;
  const nlohmann::json& j = summary["curve"];
  if (!j.is_object()) return c;
  try {
    c.step = j.at("step").get<std::vector<int32_t>>();
    c.train_loss = j.at("train_loss").get<std::vector<double>>();
    c.val_loss = j.at("val_loss").get<std::vector<double>>();
    c.accept = j.at("accept").get<std::vector<double>>();
  } catch (const nlohmann::json::exception&) {
    return {};
  }
  const size_t n = c.step.size();
  if (c.train_loss.size() != n || c.val_loss.size() != n || c.accept.size() != n) return {};
  return c;
}

}  // namespace tokenfab
