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
#include "core/training/training_traces.h"

namespace tokenfab {

namespace {

namespace fs = std::filesystem;

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
