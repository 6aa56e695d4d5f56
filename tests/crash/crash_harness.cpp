#include "tests/crash/crash_harness.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <thread>

#include "core/storage/sqlite.h"

extern char** environ;

namespace tokenfab::crash {

namespace {

using Clock = std::chrono::steady_clock;

struct Child {
  pid_t pid = -1;
  int out = -1;  // read end of its standard output
};

// fork + execve with the pieces prepared before the fork (the child only calls async-signal-safe
// functions). The child leads a new process group.
Child spawn(const std::vector<std::string>& argv, const std::vector<std::string>& env,
            const std::filesystem::path& stderr_log) {
  std::vector<std::string> env_strings;
  for (char** e = environ; *e; ++e) env_strings.emplace_back(*e);
  env_strings.insert(env_strings.end(), env.begin(), env.end());
  std::vector<char*> args, envp;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  for (const std::string& e : env_strings) envp.push_back(const_cast<char*>(e.c_str()));
  envp.push_back(nullptr);
  const int err = ::open(stderr_log.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  int pipe_fds[2];
  if (err < 0 || ::pipe2(pipe_fds, O_CLOEXEC) != 0) return {};
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::setpgid(0, 0);
    ::dup2(pipe_fds[1], 1);
    ::dup2(err, 2);
    ::execve(args[0], args.data(), envp.data());
    ::_exit(127);
  }
  ::setpgid(pid, pid);  // either side may run first
  ::close(pipe_fds[1]);
  ::close(err);
  return {pid, pipe_fds[0]};
}

// Reads what is there (waiting at most `wait_ms`) into `pending`, moving whole lines to `lines`.
// False at the end of the output.
bool read_some(int fd, int wait_ms, std::string& pending, std::vector<std::string>& lines) {
  pollfd p{fd, POLLIN, 0};
  const int ready = ::poll(&p, 1, wait_ms);
  if (ready <= 0) return true;
  char buffer[4096];
  const ssize_t n = ::read(fd, buffer, sizeof buffer);
  if (n < 0) return errno == EINTR || errno == EAGAIN;
  if (n == 0) return false;
  pending.append(buffer, static_cast<size_t>(n));
  for (size_t end; (end = pending.find('\n')) != std::string::npos;) {
    lines.push_back(pending.substr(0, end));
    pending.erase(0, end + 1);
  }
  return true;
}

// Waits until no process of the group `pgid` is left (killing stragglers after 30 s).
void wait_for_group(pid_t pgid) {
  const auto give_up = Clock::now() + std::chrono::seconds(30);
  while (::kill(-pgid, 0) == 0) {
    if (Clock::now() > give_up) ::kill(-pgid, SIGKILL);
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

}  // namespace

KilledRun run_and_kill(const std::vector<std::string>& argv, const std::vector<std::string>& env,
                       const std::filesystem::path& stderr_log, std::chrono::milliseconds delay,
                       KillWhat what) {
  KilledRun run;
  const Child child = spawn(argv, env, stderr_log);
  if (child.pid <= 0) {
    run.exited_early = true;
    return run;
  }
  std::string pending;
  const auto deadline = Clock::now() + delay;
  bool open = true;
  while (open && Clock::now() < deadline) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    open = read_some(child.out, static_cast<int>(std::max<int64_t>(left, 0)), pending, run.lines);
  }
  int status = 0;
  if (::waitpid(child.pid, &status, WNOHANG) == child.pid) {
    run.exited_early = true;
    run.exit_status = status;
  } else {
    ::kill(what == KillWhat::kGroup ? -child.pid : child.pid, SIGKILL);
    ::waitpid(child.pid, &status, 0);
  }
  // Lines printed before the kill may still sit in the pipe; the output ends when every process
  // holding it has gone.
  while (read_some(child.out, 1000, pending, run.lines)) {
  }
  ::close(child.out);
  wait_for_group(child.pid);
  return run;
}

std::pair<int, double> run_to_end(const std::vector<std::string>& argv,
                                  const std::vector<std::string>& env,
                                  const std::filesystem::path& stderr_log) {
  const auto start = Clock::now();
  const Child child = spawn(argv, env, stderr_log);
  if (child.pid <= 0) return {-1, 0.0};
  std::string pending;
  std::vector<std::string> lines;
  while (read_some(child.out, 1000, pending, lines)) {
  }
  ::close(child.out);
  int status = 0;
  ::waitpid(child.pid, &status, 0);
  wait_for_group(child.pid);
  return {status, std::chrono::duration<double>(Clock::now() - start).count()};
}

std::vector<std::string> words(const std::string& line) {
  std::istringstream in(line);
  std::vector<std::string> out;
  for (std::string w; in >> w;) out.push_back(w);
  return out;
}

std::string integrity(Database& db) {
  sqlite::Statement check(db.connection(), "PRAGMA integrity_check");
  std::string out;
  while (check.step()) out += (out.empty() ? "" : "; ") + check.column_text(0);
  return out;
}

Delays::Delays(uint64_t default_seed) : seed_(default_seed) {
  if (const char* s = std::getenv("TOKENFAB_CRASH_SEED"); s && *s)
    seed_ = std::strtoull(s, nullptr, 10);
  random_.seed(seed_);
}

std::chrono::milliseconds Delays::next(int min_ms, int max_ms) {
  return std::chrono::milliseconds(std::uniform_int_distribution<int>(min_ms, max_ms)(random_));
}

int kills(int default_kills) {
  const char* s = std::getenv("TOKENFAB_CRASH_KILLS");
  const int n = s && *s ? std::atoi(s) : 0;
  return n > 0 ? n : default_kills;
}

std::string tail_of(const std::filesystem::path& file, size_t bytes) {
  std::ifstream in(file, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string text = ss.str();
  return text.size() > bytes ? text.substr(text.size() - bytes) : text;
}

}  // namespace tokenfab::crash
