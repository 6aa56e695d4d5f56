#include "core/storage/live_writer.h"

#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <fstream>
#include <mutex>
#include <sstream>

namespace tokenfab {

namespace {

std::string first_line(const std::string& file) {
  std::ifstream in(file);
  std::string line;
  std::getline(in, line);
  return line;
}

const std::string& boot_id() {
  static const std::string id = first_line("/proc/sys/kernel/random/boot_id");
  return id;
}

struct ProcessStat {
  char state = '?';
  std::string start_ticks;
};

// Fields 3 (state) and 22 (starttime) of /proc/<pid>/stat; an empty start time when the
// process does not exist. The command name (field 2) is in parentheses and may hold spaces.
ProcessStat read_stat(long pid) {
  const std::string line = first_line("/proc/" + std::to_string(pid) + "/stat");
  ProcessStat out;
  const size_t close = line.rfind(')');
  if (close == std::string::npos) return out;
  std::istringstream fields(line.substr(close + 1));
  std::string field;
  for (int n = 3; n <= 22 && fields >> field; ++n) {
    if (n == 3) out.state = field.empty() ? '?' : field[0];
    if (n == 22) out.start_ticks = field;
  }
  return out;
}

}  // namespace

std::string this_writer() {
  static std::mutex mutex;
  static long cached_pid = -1;
  static std::string cached;
  std::lock_guard lock(mutex);
  const long pid = static_cast<long>(::getpid());
  if (pid != cached_pid) {
    const std::string start = read_stat(pid).start_ticks;
    cached = (boot_id().empty() ? "-" : boot_id()) + " " + std::to_string(pid) + " " +
             (start.empty() ? "-" : start);
    cached_pid = pid;
  }
  return cached;
}

bool writer_is_alive(std::string_view writer) {
  std::istringstream in{std::string(writer)};
  std::string boot, start;
  long pid = 0;
  if (!(in >> boot >> pid >> start) || pid <= 0) return false;
  if (boot != "-" && boot != boot_id()) return false;  // written before the last boot
  if (start == "-") {  // no /proc when it was written: the pid alone
    return ::kill(static_cast<pid_t>(pid), 0) == 0 || errno == EPERM;
  }
  const ProcessStat stat = read_stat(pid);
  return stat.start_ticks == start && stat.state != 'Z' && stat.state != 'X';
}

}  // namespace tokenfab
