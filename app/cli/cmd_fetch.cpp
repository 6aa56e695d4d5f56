// fetch: download the embedded default model into the user cache (once; verified by SHA-256).

#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "cli_common.h"
#include "core/common/error.h"
#include "core/model/model_files.h"
#include "fetch_script.h"

namespace tokenfab::cli {

namespace fs = std::filesystem;

// Runs `python3 SCRIPT DEST` with the script's standard output sent to standard error, without a
// shell: DEST reaches the script as one argument whatever characters it holds. Returns the
// script's exit status; throws Error when python3 cannot be started.
static int run_python(const fs::path& script, const std::string& dest) {
  std::vector<std::string> args = {"python3", script.string(), dest};
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, STDERR_FILENO, STDOUT_FILENO);
  pid_t pid = 0;
  const int spawned = posix_spawnp(&pid, "python3", &actions, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  if (spawned != 0)
    throw Error("fetch: cannot run python3 (" + std::string(std::strerror(spawned)) +
                "); install it, or pass --model PATH to use a GGUF file you already have");
  int status = 0;
  while (waitpid(pid, &status, 0) < 0) {
    if (errno != EINTR)
      throw Error("fetch: lost track of python3: " + std::string(std::strerror(errno)));
  }
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  return 128 + (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
}

static void run_fetch(const std::string& dest) {
  char pattern[] = "/tmp/tokenfab-fetch-XXXXXX.py";
  const int fd = mkstemps(pattern, 3);
  if (fd < 0) throw Error("fetch: cannot create a temporary file in /tmp");
  close(fd);
  const fs::path script(pattern);
  std::unique_ptr<const fs::path, void (*)(const fs::path*)> cleanup(&script,
                                                                     [](const fs::path* p) {
                                                                       std::error_code ec;
                                                                       fs::remove(*p, ec);
                                                                     });
  {
    std::ofstream out(script);
    out << kFetchScript;
    if (!out.flush()) throw Error("fetch: cannot write " + script.string());
  }
  if (run_python(script, dest) != 0)
    throw Error(
        "fetching the default model failed (see the message above); pass --model PATH "
        "to use a GGUF file you already have");
  std::cout << (fs::path(dest) / EmbeddedModel::kFileName).string() << std::endl;
}

void register_fetch(CLI::App& app) {
  auto* cmd =
      app.add_subcommand("fetch", "download the default model (" +
                                      std::string(EmbeddedModel::kFileName) + ") into the cache");
  auto dest = std::make_shared<std::string>(models_dir().string());
  cmd->add_option("--dest", *dest, "directory to store it in")->capture_default_str();
  cmd->callback([dest] { run_fetch(*dest); });
}

}  // namespace tokenfab::cli
