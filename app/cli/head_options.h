#pragma once
// --head / --spec / --draft-len: speculative decoding for generate, chat and serve-bench. The
// lookup of a head (by registry id, name, file path or `auto`) is core's (head_selection.h).

#include <CLI/CLI.hpp>

#include "core/training/head_selection.h"

namespace tokenfab::cli {

void add_head_options(CLI::App& cmd, HeadOptions& o);

}  // namespace tokenfab::cli
