#pragma once
// --head / --spec / --draft-len: speculative decoding for generate, chat and serve-bench, and the
// lookup of a head by registry id, name or file path shared with `heads`.

#include <memory>
#include <string>

#include <CLI/CLI.hpp>

#include "core/model/llama_model.h"
#include "core/speculative/medusa_head.h"

namespace tokenfab::cli {

struct HeadOptions {
  std::string head = "none";  // ID | NAME | PATH | none
  std::string spec = "chain";
  int draft_len = 4;
};

void add_head_options(CLI::App& cmd, HeadOptions& o);

// The model file's sha256 (computed once per process and path).
std::string model_sha256(const LlamaModel& model);

// A draft head by registry id or name (the registry in the user data directory) or by file path,
// checked against `model`; nullptr for "none". Throws Error naming what was wrong: an unknown head,
// a missing file, a head for another model, an unsupported --spec.
std::shared_ptr<const MedusaHead> resolve_head(const HeadOptions& o, const LlamaModel& model);

}  // namespace tokenfab::cli
