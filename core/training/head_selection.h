#pragma once
// Which draft head a request uses: a fixed head by registry id, name or file path, none, or
// `auto`. Shared by the command line (--head) and the desktop app (the chat's head picker).

#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/model/llama_model.h"
#include "core/speculative/draft_head.h"
#include "core/speculative/head_switch.h"
#include "core/tokenizer/tokenizer.h"

namespace tokenfab {

struct HeadOptions {
  std::string head = "none";   // ID | NAME | PATH | none | auto
  std::string spec = "chain";  // chain | tree
  int draft_len = 4;           // chain: tokens proposed per step
  // tree: children per node at each depth (head d's top tree_shape[d] tokens); 3+6+12+12 = 33
  // nodes by default.
  std::vector<int32_t> tree_shape = {3, 2, 2, 1};
  // tree: > 0 drafts a dynamic tree of this many nodes, the most probable of the tree_shape tree
  // (mtp heads; GenerationRequest::tree_nodes); 0: the whole static tree.
  int32_t tree_nodes = 0;
  // chain: always draft_len tokens, instead of each step's length chosen from measured costs and
  // acceptance (GenerationRequest::adaptive_draft). Evaluations always use a fixed length.
  bool fixed_draft = false;
  // > 0: also draft from context lookup, matching the context's last 1..lookup tokens
  // (GenerationRequest::lookup); with head none, the lookup drafts alone. Greedy only.
  int32_t lookup = 0;

  // The request's tree_shape: this shape for --spec tree, empty (a chain) otherwise.
  std::vector<int32_t> request_tree() const {
    return spec == "tree" ? tree_shape : std::vector<int32_t>{};
  }
  int32_t request_tree_nodes() const { return spec == "tree" ? tree_nodes : 0; }
  bool adaptive_draft() const { return spec != "tree" && !fixed_draft; }
  // Throws Error for an unknown spec, an empty / out-of-range tree shape or node count.
  void validate() const;
};

// The model file's sha256 (computed once per process and path).
std::string model_sha256(const LlamaModel& model);

// A draft head by registry id or name (the registry in the user data directory) or by file path,
// checked against `model`; nullptr for "none". Throws Error naming what was wrong: an unknown head,
// a missing file, a head for another model, an unsupported --spec. "auto" is HeadChooser's.
std::shared_ptr<const DraftHead> resolve_head(const HeadOptions& o, const LlamaModel& model);

// The head for each request. A fixed head (or none) is resolved once. `auto` — the policy:
//   1. the prompt's domain is the DomainClassifier's answer (naive Bayes over token ids, fitted on
//      the built-in domains' train prompts);
//   2. the head is the registered one for this model with the best recorded chain ACCEPT/STEP on
//      that domain (`heads eval --prompt-set DOMAIN` records it); with no evaluation for the
//      domain, no head is used;
//   3. every head evaluated on that domain is a candidate (best recorded first): the engine
//      switches to another mid-generation when the head's live ACCEPT/STEP falls below its record
//      (the policy in head_switch.h; every switch is logged).
// Every choice is logged (logger "heads", info level). choose() may be called from one thread at
// a time.
struct HeadChoice {
  std::shared_ptr<const DraftHead> head;  // nullptr: no head
  std::vector<HeadCandidate> candidates;  // auto: for switching (GenerationRequest); else empty
};

class HeadChooser {
 public:
  HeadChooser(const HeadOptions& o, const LlamaModel& model, const Tokenizer& tokenizer);
  ~HeadChooser();
  HeadChoice choose(std::span<const TokenId> prompt);
  bool automatic() const { return automatic_; }

 private:
  struct Auto;
  bool automatic_ = false;
  std::shared_ptr<const DraftHead> fixed_;
  std::unique_ptr<Auto> auto_;
};

}  // namespace tokenfab
