#pragma once
// --head / --spec / --draft-len: speculative decoding for generate, chat and serve-bench. The
// lookup of a head (by registry id, name, file path or `auto`) is core's (head_selection.h).

#include <CLI/CLI.hpp>

#include "core/training/head_selection.h"

namespace tokenfab::cli {

// `length_choice`: also --fixed-draft (generate, chat, serve-bench; not heads eval, whose chains
// are always --draft-len long).
void add_head_options(CLI::App& cmd, HeadOptions& o, bool length_choice = true);

}  // namespace tokenfab::cli
