#pragma once
// What the server's handlers share (api_server.cpp, completions.cpp). Internal to core/api.

#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include <httplib.h>
#include <nlohmann/json.hpp>

#include "core/api/api_error.h"
#include "core/api/api_server.h"
#include "core/api/openai_request.h"
#include "core/tokenizer/chat_template.h"

namespace tokenfab::api {

// The engine the server drives and what belongs to its model: present while a model is loaded
// (ApiServer::attach … detach). A handler holds it by shared_ptr for as long as it uses the engine.
struct Backend {
  Engine& engine;
  const LlamaModel& model;
  const Tokenizer& tokenizer;
  std::string model_id;
  int64_t context = 0;                        // prompt + max_tokens limit; 0: none
  std::optional<ChatTemplate> chat_template;  // loaded on the first chat request
  std::mutex chat_mutex;                      // chat_template
  std::mutex heads_mutex;                     // heads; HeadChooser::choose is one thread at a time
  std::map<std::string, std::unique_ptr<HeadChooser>> heads;  // by tokenfab.head
  std::atomic<bool> detaching{false};  // detach(): running generations are cancelled

  Backend(Engine& e, const LlamaModel& m, const Tokenizer& t, std::string id, int64_t ctx)
      : engine(e), model(m), tokenizer(t), model_id(std::move(id)), context(ctx) {}
};

struct ServerState {
  ApiServerConfig config;
  int64_t started = 0;  // unix seconds, the model's `created`
  std::atomic<int> in_flight{0};
  std::atomic<bool> stopping{false};  // stop(): running generations are cancelled

  explicit ServerState(ApiServerConfig c) : config(std::move(c)) {}

  // The attached backend; throws ApiError 503 while none is (the model loads).
  std::shared_ptr<Backend> backend() const;
  std::shared_ptr<Backend> backend_or_null() const;
  void set_backend(std::shared_ptr<Backend> b);
  // Whether a generation on `b` should go on (the server is not stopping, `b` not detaching).
  bool serving(const Backend& b) const { return !stopping.load() && !b.detaching.load(); }

 private:
  mutable std::mutex mutex_;
  std::shared_ptr<Backend> backend_;
};

// A generation request's place among max_in_flight; released when the last copy goes (a stream's
// content provider holds one until the stream ends).
class InFlightSlot {
 public:
  // Throws ApiError 429 when every slot is taken.
  explicit InFlightSlot(ServerState& state);
  ~InFlightSlot() { state_.in_flight.fetch_sub(1); }
  InFlightSlot(const InFlightSlot&) = delete;
  InFlightSlot& operator=(const InFlightSlot&) = delete;

 private:
  ServerState& state_;
};

void send_json(httplib::Response& res, int status, const nlohmann::json& j);
void send_error(httplib::Response& res, const ApiError& e);

// POST /v1/chat/completions and /v1/completions (completions.cpp).
void handle_completion(ServerState& state, const httplib::Request& req, httplib::Response& res,
                       Endpoint endpoint);

}  // namespace tokenfab::api
