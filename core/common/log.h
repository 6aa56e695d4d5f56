#pragma once
// One spdlog logger per subsystem ("gguf", "model", "runtime", ...), created on first use and
// writing to stderr so that stdout stays clean for --json output.

#include <memory>
#include <string>

#include <spdlog/spdlog.h>

namespace tokenfab {

std::shared_ptr<spdlog::logger> logger(const std::string& subsystem);
// Applies to every logger, present and future ("trace" … "off").
void set_log_level(const std::string& level);

}  // namespace tokenfab
