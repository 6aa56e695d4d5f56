// fetch: download a model Tokenfab knows by name (the embedded default when none is named) into the
// user cache, once, verified by SHA-256 — tools/fetch_model.py, compiled in, does the work; this
// command runs it and passes its exit status on.

#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "cli_common.h"
#include "core/common/error.h"
#include "core/model/model_files.h"
#include "fetch_script.h"

namespace tokenfab::cli {

namespace {
struct FetchOptions {
  std::string name;  // empty: the script's default model
  std::string dest;
  bool accept_license = false;
  bool list = false;
};
}  // namespace

// Runs `python3 -I -c SCRIPT ARGS...` without a shell and without a file for the script (nothing
// is left behind when this process is killed), isolated (-I: no module is imported from the
// working directory or PYTHONPATH): each argument reaches the script as it is, whatever characters
// it holds. The script's standard output (the model's path, or the list) is ours; its
// messages go to standard error. Returns the script's exit status; throws Error when python3
// cannot be started.
static int run_python(const std::vector<std::string>& script_args) {
  std::vector<std::string> args = {"python3", "-I", "-c", kFetchScript};
  args.insert(args.end(), script_args.begin(), script_args.end());
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  std::cout.flush();
  pid_t pid = 0;
  const int spawned = posix_spawnp(&pid, "python3", nullptr, nullptr, argv.data(), environ);
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

// The script's arguments for `o`: [NAME] --dest DIR [--accept-license] [--list].
static std::vector<std::string> script_args(const FetchOptions& o) {
  std::vector<std::string> args;
  if (!o.name.empty()) args.push_back(o.name);
  args.insert(args.end(), {"--dest", o.dest});
  if (o.accept_license) args.push_back("--accept-license");
  if (o.list) args.push_back("--list");
  return args;
}

static void run_fetch(const FetchOptions& o) {
  const int status = run_python(script_args(o));
  // The script has said why on standard error, in one line; its status (2) is ours.
  if (status != 0) {
    std::cout.flush();
    std::exit(status);
  }
}

void register_fetch(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "fetch", "download a model by name into the cache, once, verified by SHA-256 (default: " +
                   std::string(EmbeddedModel::kFileName) + "); prints its path");
  auto o = std::make_shared<FetchOptions>();
  o->dest = models_dir().string();
  cmd->add_option("name", o->name,
                  "smollm2-135m (the default) or gemma3-270m; --list shows them all");
  cmd->add_option("--dest", o->dest, "directory to store it in")->capture_default_str();
  cmd->add_flag("--accept-license", o->accept_license,
                "accept the model's license (Gemma: the Gemma Terms of Use, "
                "https://ai.google.dev/gemma/terms) without being asked");
  cmd->add_flag("--list", o->list, "list the models fetch knows: name, file, size, license");
  cmd->callback([o] { run_fetch(*o); });
}

}  // namespace tokenfab::cli
