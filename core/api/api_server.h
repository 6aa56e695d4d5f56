#pragma once
// ApiServer: a local OpenAI-compatible HTTP server (cpp-httplib) on an Engine — what
// `tokenfab-cli serve` runs. Routes: GET /health, GET /v1/models, POST /v1/chat/completions,
// POST /v1/completions (both streamed as server-sent events when asked), POST /tokenize,
// POST /detokenize. Errors in OpenAI's shape {"error":{"message","type","param","code"}}.
//
// Safety: loopback by default; any other address needs an API key (checked in constant time
// from `Authorization: Bearer KEY` or `X-Api-Key`; /health is open). Limits: body size (413),
// generation requests in flight (429 beyond), read and write timeouts.
//
// Threads: httplib's pool runs the handlers; a generation request holds its handler thread until
// it ends (a stream writes from it), so the pool has max_in_flight threads and a few more for
// the cheap routes.

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

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
  // prompt + max_tokens limit (the engine's context_limit); 0: none.
  int64_t context = 0;
  HeadOptions head;  // the default head (a request's tokenfab.head overrides head.head)

  // Throws Error naming the flag: a non-loopback host without a key, a limit out of range.
  void validate() const;
};

bool is_loopback_host(const std::string& host);

class ApiServer {
 public:
  // `engine`, `model` and `tokenizer` outlive the server; `model_id` is the id /v1/models lists
  // and requests may name.
  ApiServer(Engine& engine, const LlamaModel& model, const Tokenizer& tokenizer,
            std::string model_id, ApiServerConfig config);
  ~ApiServer();
  ApiServer(const ApiServer&) = delete;
  ApiServer& operator=(const ApiServer&) = delete;

  // Binds the listening socket; returns the port. Throws Error when it cannot.
  int bind();
  // Serves until stop() (from another thread). Throws Error when bind() was not called.
  void serve();
  void stop();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace tokenfab::api
