#include "head_options.h"

namespace tokenfab::cli {

void add_head_options(CLI::App& cmd, HeadOptions& o) {
  cmd.add_option("--head", o.head,
                 "draft head for speculative decoding: ID, NAME, PATH, auto or none")
      ->capture_default_str();
  cmd.add_option("--spec", o.spec, "speculation shape: chain")->capture_default_str();
  cmd.add_option("--draft-len", o.draft_len, "tokens proposed per step")
      ->capture_default_str()
      ->check(CLI::Range(1, 16));
}

}  // namespace tokenfab::cli
