#include "head_options.h"

#include "core/serving/engine.h"

namespace tokenfab::cli {

void add_head_options(CLI::App& cmd, HeadOptions& o, bool length_choice) {
  cmd.add_option("--head", o.head,
                 "draft head for speculative decoding: ID, NAME, PATH, auto or none")
      ->capture_default_str();
  cmd.add_option(
         "--spec", o.spec,
         "speculation shape: chain (--draft-len tokens) or tree (--tree-shape; greedy only)")
      ->capture_default_str()
      ->check(CLI::IsMember({"chain", "tree"}));
  cmd.add_option("--tree-shape", o.tree_shape,
                 "tree: children per node at each depth, e.g. 3,2,2,1 (at most 64 nodes are kept)")
      ->delimiter(',')
      ->capture_default_str()
      ->check(CLI::Range(1, 16));
  cmd.add_option("--tree-nodes", o.tree_nodes,
                 "tree, mtp heads: draft a dynamic tree of at most N nodes, the most probable of "
                 "the --tree-shape tree by the head's path probability (0: the whole tree)")
      ->capture_default_str()
      ->check(CLI::Range(0, 64));
  cmd.add_option("--lookup", o.lookup,
                 "also draft the tokens that followed the latest earlier occurrence of the "
                 "context's last 1..N tokens (greedy only; with --head none, these drafts alone; "
                 "0: off)")
      ->capture_default_str()
      ->check(CLI::Range(0, GenerationRequest::kMaxLookup));
  if (!length_choice) {
    cmd.add_option("--draft-len", o.draft_len, "tokens proposed per step")
        ->capture_default_str()
        ->check(CLI::Range(1, 16));
    return;
  }
  cmd.add_option("--draft-len", o.draft_len,
                 "chain: most tokens proposed per step (each step's length is chosen from the "
                 "measured step costs and acceptance, 0 when drafting does not pay)")
      ->capture_default_str()
      ->check(CLI::Range(1, 16));
  cmd.add_flag("--fixed-draft", o.fixed_draft,
               "chain: propose exactly --draft-len tokens every step");
}

}  // namespace tokenfab::cli
