// tokenfab-cli: headless front end of Tokenfab. Every failure prints one line naming what was
// wrong on stderr and exits non-zero.

#include <iostream>

#include <CLI/CLI.hpp>

#include "cli_common.h"
#include "core/common/error.h"
#include "core/common/log.h"
#include "kernels/cpu/cpu_features.h"

int main(int argc, char** argv) {
  CLI::App app{"tokenfab-cli: a token factory on one workstation (headless front end)"};
  app.require_subcommand(1);
  std::string log_level = "warn";
  app.add_option("--log-level", log_level, "trace, debug, info, warn, error or off")
      ->check(CLI::IsMember({"trace", "debug", "info", "warn", "error", "off"}));
  app.parse_complete_callback([&] {
    tokenfab::set_log_level(log_level);
    tokenfab::kernels::cpu_features();  // a bad TOKENFAB_CPU_KERNELS fails here, with its message
  });

  tokenfab::cli::register_fetch(app);
  tokenfab::cli::register_info(app);
  tokenfab::cli::register_tokenize(app);
  tokenfab::cli::register_generate(app);
  tokenfab::cli::register_chat(app);
  tokenfab::cli::register_bench(app);
  tokenfab::cli::register_perplexity(app);
  tokenfab::cli::register_batch_bench(app);
  tokenfab::cli::register_serve_bench(app);
  tokenfab::cli::register_heads(app);
  tokenfab::cli::register_synth(app);
  tokenfab::cli::register_devices(app);

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const tokenfab::Error& e) {
    std::cerr << "error: " << e.what() << std::endl;
    return 1;
  } catch (const std::exception& e) {
    std::cerr << "error: " << e.what() << std::endl;
    return 1;
  }
  return 0;
}
