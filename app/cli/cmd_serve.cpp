// serve: a local OpenAI-compatible HTTP server (core/api/api_server.h) on the engine, until
// SIGINT or SIGTERM. Every engine mode works behind it (--devices, --prefill/--decode, --head).

#include <pthread.h>

#include <csignal>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <thread>

#include "cli_common.h"
#include "core/api/api_server.h"
#include "core/common/error.h"
#include "core/serving/engine.h"
#include "head_options.h"

namespace tokenfab::cli {

namespace {

struct ServeCommand {
  CommonOptions common;
  api::ApiServerConfig server;
  std::optional<std::string> api_key_file;
  int64_t ctx = 4096;
  EngineConfig engine;
};

std::string read_key_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw Error("--api-key-file " + path + ": cannot be read");
  std::string key;
  std::getline(in, key);
  while (!key.empty() && (key.back() == '\r' || key.back() == ' ' || key.back() == '\t'))
    key.pop_back();
  if (key.empty()) throw Error("--api-key-file " + path + ": the first line is empty");
  return key;
}

// SIGINT and SIGTERM, blocked in every thread (the engine's and the server's inherit the mask),
// are taken by one thread that stops the server.
sigset_t stop_signals() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  return set;
}

void run_serve(ServeCommand& c) {
  if (c.api_key_file) c.server.api_key = read_key_file(*c.api_key_file);
  c.server.validate();  // before the model loads: a refused --host fails at once
  std::signal(SIGPIPE, SIG_IGN);
  const sigset_t signals = stop_signals();
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  // The port answers at once: /health says 503 (loading) until the model and engine are ready.
  LoadedModel m;
  std::unique_ptr<Engine> engine;  // outlives the server's use of it (detach() below)
  api::ApiServer server(c.server);
  const int port = server.bind();
  const std::string& host = c.server.host;
  const bool v6 = host.find(':') != std::string::npos;
  std::cerr << "listening on http://" << (v6 ? "[" + host + "]" : host) << ":" << port
            << " (loading the model)" << std::endl;
  std::exception_ptr serve_error;
  std::thread serving([&] {
    try {
      server.serve();
    } catch (...) {
      serve_error = std::current_exception();
    }
  });
  std::thread waiter([&server, signals] {
    int sig = 0;
    sigwait(&signals, &sig);
    server.stop();
  });
  auto shut_down = [&] {
    server.stop();
    serving.join();
    server.detach();                                // before the engine goes
    pthread_kill(waiter.native_handle(), SIGTERM);  // wakes the waiter if no signal came
    waiter.join();
  };
  try {
    m = load_model(c.common);
    EngineConfig config = c.engine;
    config.threads = c.common.threads;
    config.max_context = std::min(c.ctx, m.model->hparams().n_ctx_train);
    engine = std::make_unique<Engine>(
        *m.model, config, [&tok = *m.tokenizer](TokenId t) { return tok.is_end_of_generation(t); });
    const std::string model_id = std::filesystem::path(m.model->file().name()).stem().string();
    server.attach(*engine, *m.model, *m.tokenizer, model_id,
                  config.context_limit(m.model->hparams()));
    std::cerr << "ready: model " << model_id << ", " << config.devices_text() << std::endl;
  } catch (...) {
    shut_down();
    throw;
  }
  serving.join();  // until a signal stops the server, or the listener ends by itself
  server.stop();
  server.detach();
  pthread_kill(waiter.native_handle(), SIGTERM);
  waiter.join();
  if (serve_error) std::rethrow_exception(serve_error);
  std::cerr << "stopped" << std::endl;
}

}  // namespace

void register_serve(CLI::App& app) {
  auto c = std::make_shared<ServeCommand>();
  auto* cmd = app.add_subcommand(
      "serve", "a local OpenAI-compatible HTTP server (/v1/chat/completions, /v1/completions, …)");
  add_model_option(*cmd, c->common);
  add_threads_option(*cmd, c->common);
  cmd->add_option("--host", c->server.host,
                  "address to listen on (any other than loopback needs an API key)")
      ->capture_default_str();
  cmd->add_option("--port", c->server.port, "TCP port (0: any free port)")
      ->capture_default_str()
      ->check(CLI::Range(0, 65535));
  auto* key = cmd->add_option("--api-key", c->server.api_key,
                              "require this key (Authorization: Bearer KEY or X-Api-Key)");
  cmd->add_option("--api-key-file", c->api_key_file, "require the key on this file's first line")
      ->excludes(key);
  cmd->add_option("--ctx", c->ctx, "context length in tokens (prompt + reply)")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{2}, int64_t{1} << 24));
  cmd->add_option("--max-body-bytes", c->server.max_body_bytes,
                  "largest request body; larger gets 413")
      ->capture_default_str();
  cmd->add_option("--max-queued", c->server.max_in_flight,
                  "generation requests in flight (running or queued); more get 429")
      ->capture_default_str()
      ->check(CLI::Range(1, 4096));
  cmd->add_option("--read-timeout", c->server.read_timeout_s, "seconds to wait for a request")
      ->capture_default_str()
      ->check(CLI::Range(1, 3600));
  cmd->add_option("--write-timeout", c->server.write_timeout_s,
                  "seconds a response write may block")
      ->capture_default_str()
      ->check(CLI::Range(1, 3600));
  cmd->add_option("--cors-origin", c->server.cors_origins,
                  "let browser pages from this origin call the API (repeatable; * for any); "
                  "default: none");
  add_engine_options(*cmd, c->engine);
  add_head_options(*cmd, c->server.head);
  cmd->callback([c] { run_serve(*c); });
}

}  // namespace tokenfab::cli
