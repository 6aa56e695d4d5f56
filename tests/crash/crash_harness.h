#pragma once
// The killing half of test_crash / test_crash_model: starts a process in its own process group
// with a given TOKENFAB_HOME, reads the lines it prints (each one a commit it has made), kills it
// with SIGKILL after a delay, and waits until nothing of the group runs; then the checks of what
// the next open finds.

#include <QtTest>

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "core/storage/database.h"

namespace tokenfab::crash {

struct KilledRun {
  std::vector<std::string> lines;  // standard output, all of it (lines printed before the kill)
  bool exited_early = false;       // the process ended by itself before the delay
  int exit_status = 0;             // its waitpid status when it did
};

enum class KillWhat {
  kGroup,    // the whole process group: the process and everything it started die at once
  kProcess,  // only the process; what it started sees it die (fetch's script: its pdeathsig)
};

// Runs `argv` (argv[0] a path) with the environment plus `env` ("NAME=value"), its standard error
// appended to `stderr_log`, and kills it `delay` after the start.
KilledRun run_and_kill(const std::vector<std::string>& argv, const std::vector<std::string>& env,
                       const std::filesystem::path& stderr_log, std::chrono::milliseconds delay,
                       KillWhat what = KillWhat::kGroup);

// Runs `argv` to its end (no kill) and returns its waitpid status and the seconds it took.
std::pair<int, double> run_to_end(const std::vector<std::string>& argv,
                                  const std::vector<std::string>& env,
                                  const std::filesystem::path& stderr_log);

// The words of a line split at spaces.
std::vector<std::string> words(const std::string& line);

// "PRAGMA integrity_check" of an open database: "ok" when it is sound.
std::string integrity(Database& db);

// Uniform delays from a seeded generator: TOKENFAB_CRASH_SEED when set, else the test's own.
class Delays {
 public:
  explicit Delays(uint64_t default_seed);
  std::chrono::milliseconds next(int min_ms, int max_ms);
  uint64_t seed() const { return seed_; }

 private:
  uint64_t seed_;
  std::mt19937_64 random_;
};

// TOKENFAB_CRASH_KILLS (a number) when set, else `default_kills`: how many kills a scenario runs.
int kills(int default_kills);

// The tail of a log file, for a failure message.
std::string tail_of(const std::filesystem::path& file, size_t bytes = 2000);

}  // namespace tokenfab::crash
