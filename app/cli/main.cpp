// tokenfab-cli: headless front end of Tokenfab. Every failure prints one line naming what was
// wrong on stderr and exits non-zero.

#include <iostream>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "cli_common.h"
#include "core/common/error.h"
#include "core/common/log.h"
#include "kernels/cpu/cpu_features.h"

namespace tokenfab::cli {
void register_models(CLI::App& app);  // cmd_models.cpp
}  // namespace tokenfab::cli

namespace {

// The innermost command the command line chose (the app itself when none).
CLI::App* chosen_command(CLI::App* app) {
  for (CLI::App* sub : app->get_subcommands()) return chosen_command(sub);
  return app;
}

// One line for a command line that names no command, or an unknown one, where one is needed:
// what was given and the commands there are. Empty when the error is of another kind (a
// required option missing), which CLI11 words itself.
std::string missing_command_message(CLI::App& app) {
  CLI::App* at = chosen_command(&app);
  const std::vector<CLI::App*> commands = at->get_subcommands([](CLI::App*) { return true; });
  if (commands.empty() || !at->get_subcommands().empty()) return {};
  std::string names;
  for (const CLI::App* c : commands) names += (names.empty() ? "" : ", ") + c->get_name();
  const std::string where = at == &app ? std::string("tokenfab-cli") : at->get_name();
  const std::vector<std::string> rest = at->remaining();
  if (rest.empty()) return "error: " + where + " needs a command: " + names;
  const std::string& given = rest.front();
  if (given.starts_with('-'))
    return "error: unknown option '" + given + "' for " + where +
           ", which needs a command: " + names;
  return "error: unknown command '" + given + "' for " + where + " (commands: " + names + ")";
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"tokenfab-cli: a token factory on one workstation (headless front end)"};
  app.require_subcommand(1);
  app.set_version_flag("--version", std::string("tokenfab-cli ") + TOKENFAB_VERSION);
  std::string log_level = "warn";
  app.add_option("--log-level", log_level, "trace, debug, info, warn, error or off")
      ->check(CLI::IsMember({"trace", "debug", "info", "warn", "error", "off"}));
  // Parse errors as one line, like every other failure.
  app.failure_message([](const CLI::App*, const CLI::Error& e) {
    return "error: " + std::string(e.what()) + " (see --help)\n";
  });
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
  tokenfab::cli::register_serve(app);
  tokenfab::cli::register_serve_bench(app);
  tokenfab::cli::register_heads(app);
  tokenfab::cli::register_synth(app);
  tokenfab::cli::register_quantize(app);
  tokenfab::cli::register_devices(app);
  tokenfab::cli::register_models(app);

  try {
    app.parse(argc, argv);
  } catch (const CLI::RequiredError& e) {
    const std::string message = missing_command_message(app);
    if (message.empty()) return app.exit(e);
    std::cerr << message << std::endl;
    return e.get_exit_code();
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
