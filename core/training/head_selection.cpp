#include "core/training/head_selection.h"

#include <filesystem>
#include <map>

#include "core/common/error.h"
#include "core/common/log.h"
#include "core/serving/engine.h"
#include "core/serving/prompt_sets.h"
#include "core/speculative/domain_classifier.h"
#include "core/storage/database.h"
#include "core/storage/registry.h"
#include "core/training/head_training_job.h"

namespace tokenfab {

void HeadOptions::validate() const {
  if (spec != "chain" && spec != "tree") throw Error("--spec " + spec + ": expected chain or tree");
  if (spec == "tree") {
    if (tree_shape.empty()) throw Error("--tree-shape: give at least one level, e.g. 3,2,2,1");
    for (int32_t b : tree_shape)
      if (b < 1 || b > 16)
        throw Error("--tree-shape: " + std::to_string(b) + " children per node is outside 1..16");
  }
  if (lookup < 0 || lookup > GenerationRequest::kMaxLookup)
    throw Error("--lookup " + std::to_string(lookup) + " is outside 0.." +
                std::to_string(GenerationRequest::kMaxLookup));
  if (tree_nodes < 0 || tree_nodes > GenerationRequest::kMaxTreeNodes)
    throw Error("--tree-nodes " + std::to_string(tree_nodes) + " is outside 0.." +
                std::to_string(GenerationRequest::kMaxTreeNodes));
}

std::string model_sha256(const LlamaModel& model) {
  return model_file_sha256(model);
}

std::shared_ptr<const DraftHead> resolve_head(const HeadOptions& o, const LlamaModel& model) {
  if (o.head == "none" || o.head.empty()) return nullptr;
  o.validate();
  if (o.head == "auto")
    throw Error(
        "--head auto picks a head per request; this needs one head: give a head ID, NAME or "
        "PATH");
  std::filesystem::path file;
  if (std::filesystem::is_regular_file(o.head)) {
    file = o.head;
  } else {
    const auto db = Database::open_default();
    Registry registry(*db);
    const std::optional<HeadRecord> record = registry.find_head(o.head);
    if (!record)
      throw Error("--head " + o.head + ": no such head in " + db->path().string() +
                  " and no such file (see `tokenfab-cli heads list`)");
    file = registry.head_file(*record);
  }
  DraftHead head = load_draft_head(file);
  check_head_matches(head.info, model_sha256(model), model.hparams().n_embd,
                     model.hparams().n_vocab, model.file().name());
  return std::make_shared<const DraftHead>(std::move(head));
}

struct HeadChooser::Auto {
  const LlamaModel& model;
  std::string sha;
  DomainClassifier classifier;
  std::map<std::string, std::vector<HeadCandidate>> by_domain;  // resolved once per domain
};

HeadChooser::HeadChooser(const HeadOptions& o, const LlamaModel& model,
                         const Tokenizer& tokenizer) {
  if (o.head != "auto") {
    fixed_ = resolve_head(o, model);
    return;
  }
  o.validate();
  automatic_ = true;
  std::vector<DomainClassifier::Example> examples;
  for (const std::string& domain : builtin_domains())
    for (const std::string& text : domain_prompt_set(domain, "train").entries)
      examples.push_back({domain, tokenizer.encode(text, false, false)});
  auto_ =
      std::make_unique<Auto>(Auto{model, model_sha256(model), DomainClassifier::fit(examples), {}});
}

HeadChooser::~HeadChooser() = default;

HeadChoice HeadChooser::choose(std::span<const TokenId> prompt) {
  if (!automatic_) return {fixed_, {}};
  const DomainClassifier::Result c = auto_->classifier.classify(prompt);
  auto it = auto_->by_domain.find(c.domain);
  if (it == auto_->by_domain.end()) {
    std::vector<HeadCandidate> candidates;
    const auto db = Database::open_default();
    Registry registry(*db);
    for (const auto& [record, evaluation] : registry.heads_for(c.domain, auto_->sha, "chain")) {
      DraftHead h = load_draft_head(registry.head_file(record));
      check_head_matches(h.info, auto_->sha, auto_->model.hparams().n_embd,
                         auto_->model.hparams().n_vocab, auto_->model.file().name());
      candidates.push_back(
          {std::make_shared<const DraftHead>(std::move(h)), evaluation.accept_per_step});
      logger("heads")->info("auto: domain {} candidate '{}' (ACCEPT/STEP {:.2f} recorded on {})",
                            c.domain, record.name, evaluation.accept_per_step, c.domain);
    }
    if (candidates.empty())
      logger("heads")->info("auto: domain {} → no head (none evaluated on {} for this model)",
                            c.domain, c.domain);
    it = auto_->by_domain.emplace(c.domain, std::move(candidates)).first;
  }
  HeadChoice choice;
  if (!it->second.empty()) {
    choice.head = it->second.front().head;
    choice.candidates = it->second;
  }
  logger("heads")->info("auto: prompt of {} tokens classified as {} (margin {:.2f}) → {}",
                        prompt.size(), c.domain, c.margin,
                        choice.head ? choice.head->info.name : std::string("no head"));
  return choice;
}

}  // namespace tokenfab
