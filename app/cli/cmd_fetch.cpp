// fetch: download the embedded default model into the user cache (once; verified by SHA-256).

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>

#include <unistd.h>

#include "cli_common.h"
#include "core/common/error.h"
#include "core/model/model_files.h"
#include "fetch_script.h"

namespace tokenfab::cli {

namespace fs = std::filesystem;

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
  std::ofstream(script) << kFetchScript;
  const std::string command = "python3 '" + script.string() + "' '" + dest + "' >&2";
  const int status = std::system(command.c_str());
  if (status != 0)
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
  cmd->callback([dest] {
    if (dest->find('\'') != std::string::npos) throw Error("--dest must not contain a quote");
    run_fetch(*dest);
  });
}

}  // namespace tokenfab::cli
