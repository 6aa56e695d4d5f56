#pragma once
// ApiServer: a local OpenAI-compatible HTTP server (cpp-httplib) on an Engine — what
// `tokenfab-cli serve` runs. Routes: GET /health, GET /v1/models, POST /v1/chat/completions,
// POST /v1/completions (both streamed as server-sent events when asked), POST /tokenize,
// POST /detokenize, GET /metrics (Prometheus, prometheus_metrics.h). /health answers 503 while no
// engine is attached (the model loads). Errors in OpenAI's shape
// {"error":{"message","type","param","code"}}.
//
// Safety: loopback by default; any other address needs an API key (checked in constant time
// from `Authorization: Bearer KEY` or `X-Api-Key`; /health is open). Limits: body size (413),
// generation requests in flight (429 beyond), read and write timeouts. CORS only for the origins
// given.
//
// Threads: httplib's pool runs the handlers; a generation request holds its handler thread until
// it ends (a stream writes from it), so the pool has max_in_flight threads and a few more for
// the cheap routes.

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/model/llama_model.h"
#include "core/serving/engine.h"
#include "core/tokenizer/tokenizer.h"
#include "core/training/head_selection.h"

namespace tokenfab::api {

struct ApiServerConfig {
  std::string host = "127.0.0.1";
  int port = 8080;      // 0: any free port (bind() says which)
  std::string api_key;  // empty: no key (loopback only)
  size_t max_body_bytes = size_t{4} << 20;
  int max_in_flight = 64;  // generation requests running or queued in the engine; more get 429
  int read_timeout_s = 30;
  int write_timeout_s = 30;
  // Origins a browser page may call from (CORS: Access-Control-Allow-Origin, preflight OPTIONS);
  // empty: none (no CORS headers at all); "*": any.
  std::vector<std::string> cors_origins;
  HeadOptions head;  // the default head (a request's tokenfab.head overrides head.head)

  // Throws Error naming the flag: a non-loopback host without a key, a limit out of range.
  void validate() const;
};

bool is_loopback_host(const std::string& host);

class ApiServer {
 public:
  // A server with no model yet: /health answers 503 and generation requests 503 until attach().
  explicit ApiServer(ApiServerConfig config);
  // The same, attached at once.
  ApiServer(Engine& engine, const LlamaModel& model, const Tokenizer& tokenizer,
            std::string model_id, int64_t context, ApiServerConfig config);
  ~ApiServer();
  ApiServer(const ApiServer&) = delete;
  ApiServer& operator=(const ApiServer&) = delete;

  // Serves `engine` (with `model` and `tokenizer`, which outlive it) from now on; `model_id` is the
  // id /v1/models lists and requests may name, `context` the prompt + max_tokens limit (the
  // engine's context_limit; 0: none). Throws Error when the server's --head cannot be resolved
  // for this model. Detaches the engine before, if any.
  void attach(Engine& engine, const LlamaModel& model, const Tokenizer& tokenizer,
              std::string model_id, int64_t context);
  // Stops serving the attached engine: its generations in flight are cancelled, and this returns
  // once no handler uses it (the engine may then be destroyed). Thread-safe; no-op when none.
  void detach();
  bool attached() const;

  // Binds the listening socket; returns the port. Throws Error when it cannot.
  int bind();
  // Serves until stop() (from another thread). Throws Error when bind() was not called.
  void serve();
  void stop();
  int port() const;  // after bind()

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace tokenfab::api
