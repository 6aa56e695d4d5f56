#include "core/common/log.h"

#include <mutex>

#include <spdlog/sinks/stdout_color_sinks.h>

namespace tokenfab {

static std::mutex g_log_mutex;
static spdlog::level::level_enum g_level = spdlog::level::warn;

std::shared_ptr<spdlog::logger> logger(const std::string& subsystem) {
  std::lock_guard lock(g_log_mutex);
  if (auto existing = spdlog::get(subsystem)) return existing;
  auto created = spdlog::stderr_color_mt(subsystem);
  created->set_level(g_level);
  return created;
}

void set_log_level(const std::string& level) {
  std::lock_guard lock(g_log_mutex);
  g_level = spdlog::level::from_str(level);
  spdlog::set_level(g_level);
}

}  // namespace tokenfab
