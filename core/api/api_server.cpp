#include "core/api/api_server.h"

#include <arpa/inet.h>
#include <openssl/crypto.h>
#include <openssl/sha.h>

#include <array>
#include <chrono>

#include "core/api/openai_response.h"
#include "core/api/server_state.h"
#include "core/common/log.h"

namespace tokenfab::api {

using nlohmann::json;

void ApiServerConfig::validate() const {
  if (host.empty()) throw Error("--host: give an address, e.g. 127.0.0.1");
  if (!is_loopback_host(host) && api_key.empty())
    throw Error("--host " + host +
                ": serving beyond this machine needs an API key (--api-key or --api-key-file)");
  if (port < 0 || port > 65535)
    throw Error("--port " + std::to_string(port) + ": expected 0–65535");
  if (max_body_bytes < 1024) throw Error("--max-body-bytes: expected at least 1024");
  if (max_in_flight < 1) throw Error("--max-queued: expected at least 1");
  if (read_timeout_s < 1 || write_timeout_s < 1) throw Error("timeouts: expected at least 1 s");
  head.validate();
}

bool is_loopback_host(const std::string& host) {
  if (host == "localhost") return true;
  in_addr v4{};
  if (inet_pton(AF_INET, host.c_str(), &v4) == 1) return (ntohl(v4.s_addr) >> 24) == 127;
  in6_addr v6{};
  if (inet_pton(AF_INET6, host.c_str(), &v6) == 1) return IN6_IS_ADDR_LOOPBACK(&v6);
  return false;
}

InFlightSlot::InFlightSlot(ServerState& state) : state_(state) {
  if (state_.in_flight.fetch_add(1) >= state_.config.max_in_flight) {
    state_.in_flight.fetch_sub(1);
    throw ApiError(429,
                   "The server is busy: " + std::to_string(state_.config.max_in_flight) +
                       " requests are in flight (--max-queued). Retry later.",
                   "", "rate_limit_error", "queue_full");
  }
}

void send_json(httplib::Response& res, int status, const json& j) {
  res.status = status;
  res.set_content(dump(j), "application/json");
}

void send_error(httplib::Response& res, const ApiError& e) {
  send_json(res, e.status, error_json(e.what(), e.type, e.param, e.code));
}

namespace {

std::array<unsigned char, SHA256_DIGEST_LENGTH> sha256(const std::string& s) {
  std::array<unsigned char, SHA256_DIGEST_LENGTH> d{};
  SHA256(reinterpret_cast<const unsigned char*>(s.data()), s.size(), d.data());
  return d;
}

// Constant time in the key: both sides are hashed and the digests compared with CRYPTO_memcmp.
bool key_matches(const std::string& given, const std::string& key) {
  const auto a = sha256(given), b = sha256(key);
  return CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

std::string presented_key(const httplib::Request& req) {
  const std::string auth = req.get_header_value("Authorization");
  constexpr std::string_view kBearer = "Bearer ";
  if (auth.size() > kBearer.size() && auth.compare(0, kBearer.size(), kBearer) == 0)
    return auth.substr(kBearer.size());
  return req.get_header_value("X-Api-Key");
}

json body_object(const httplib::Request& req) {
  json j;
  try {
    j = json::parse(req.body);
  } catch (const json::parse_error& e) {
    throw ApiError(400, std::string("the body is not valid JSON: ") + e.what());
  }
  if (!j.is_object()) throw ApiError(400, "the body must be a JSON object");
  return j;
}

// POST /tokenize {"content", "add_special"?} → {"tokens"} (llama-server's shape).
void handle_tokenize(ServerState& state, const httplib::Request& req, httplib::Response& res) {
  const json j = body_object(req);
  std::string content;
  bool add_special = false, has_content = false;
  for (const auto& [key, v] : j.items()) {
    if (key == "content") {
      if (!v.is_string()) throw ApiError(400, "content: expected a string", "content");
      content = v.get<std::string>();
      has_content = true;
    } else if (key == "add_special") {
      if (!v.is_boolean()) throw ApiError(400, "add_special: expected a boolean", "add_special");
      add_special = v.get<bool>();
    } else {
      throw ApiError(400, key + ": unknown field (content, add_special)", key);
    }
  }
  if (!has_content) throw ApiError(400, "content: missing", "content");
  const auto tokens =
      state.tokenizer.encode(content, add_special && state.tokenizer.add_bos_token(), false);
  send_json(res, 200, {{"tokens", tokens}});
}

// POST /detokenize {"tokens"} → {"content"}.
void handle_detokenize(ServerState& state, const httplib::Request& req, httplib::Response& res) {
  const json j = body_object(req);
  for (const auto& [key, v] : j.items())
    if (key != "tokens") throw ApiError(400, key + ": unknown field (tokens)", key);
  const auto it = j.find("tokens");
  if (it == j.end()) throw ApiError(400, "tokens: missing", "tokens");
  if (!it->is_array()) throw ApiError(400, "tokens: expected an array of token ids", "tokens");
  std::vector<TokenId> ids;
  const int32_t n_vocab = state.tokenizer.n_vocab();
  for (size_t i = 0; i < it->size(); ++i) {
    const json& t = (*it)[i];
    const std::string field = "tokens[" + std::to_string(i) + "]";
    if (!t.is_number_integer()) throw ApiError(400, field + ": expected an integer", field);
    const int64_t id = t.get<int64_t>();
    if (id < 0 || id >= n_vocab)
      throw ApiError(400,
                     field + ": " + std::to_string(id) + " is outside the vocabulary [0, " +
                         std::to_string(n_vocab) + ")",
                     field);
    ids.push_back(static_cast<TokenId>(id));
  }
  send_json(res, 200, {{"content", state.tokenizer.decode(ids, false)}});
}

// Every handler's ApiError (and any other exception, as a 500) becomes an OpenAI error response.
template <typename F>
httplib::Server::Handler guarded(F f) {
  return [f](const httplib::Request& req, httplib::Response& res) {
    try {
      f(req, res);
    } catch (const ApiError& e) {
      send_error(res, e);
    } catch (const std::exception& e) {
      logger("api")->error("{} {}: {}", req.method, req.path, e.what());
      send_error(res, ApiError(500, e.what(), "", "server_error"));
    }
  };
}

}  // namespace

struct ApiServer::Impl {
  ServerState state;
  httplib::Server http;
  bool bound = false;
  int port = 0;

  Impl(Engine& e, const LlamaModel& m, const Tokenizer& t, std::string id, ApiServerConfig c)
      : state(e, m, t, std::move(id), std::move(c)) {}
  void install_limits();
  void install_auth();
  void install_routes();
};

void ApiServer::Impl::install_limits() {
  const ApiServerConfig& c = state.config;
  // Each generation request holds a handler thread until it ends; a few more serve the rest.
  const auto threads = static_cast<size_t>(c.max_in_flight) + 4;
  http.new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
  http.set_payload_max_length(c.max_body_bytes);
  http.set_read_timeout(c.read_timeout_s, 0);
  http.set_write_timeout(c.write_timeout_s, 0);
  http.set_error_handler(httplib::Server::HandlerWithResponse(
      [this](const httplib::Request& req, httplib::Response& res) {
        if (!res.body.empty()) return httplib::Server::HandlerResponse::Unhandled;
        std::string message = "HTTP " + std::to_string(res.status);
        if (res.status == 404) message = "Invalid URL (" + req.method + " " + req.path + ")";
        if (res.status == 413)
          message = req.get_header_value("Content-Type") == "application/x-www-form-urlencoded"
                        ? "A form-encoded body is limited to " +
                              std::to_string(CPPHTTPLIB_FORM_URL_ENCODED_PAYLOAD_MAX_LENGTH) +
                              " bytes; send JSON as application/json."
                        : "The request body is larger than the limit of " +
                              std::to_string(state.config.max_body_bytes) +
                              " bytes (--max-body-bytes).";
        send_json(res, res.status, error_json(message, "invalid_request_error", "", ""));
        return httplib::Server::HandlerResponse::Handled;
      }));
  http.set_exception_handler(
      [](const httplib::Request&, httplib::Response& res, std::exception_ptr) {
        send_error(res, ApiError(500, "internal error", "", "server_error"));
      });
}

void ApiServer::Impl::install_auth() {
  if (state.config.api_key.empty()) return;
  http.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
    if (req.path == "/health" || key_matches(presented_key(req), state.config.api_key))
      return httplib::Server::HandlerResponse::Unhandled;
    send_error(res, ApiError(401,
                             "Incorrect or missing API key: give it as `Authorization: Bearer "
                             "KEY` or `X-Api-Key: KEY`.",
                             "", "authentication_error", "invalid_api_key"));
    return httplib::Server::HandlerResponse::Handled;
  });
}

void ApiServer::Impl::install_routes() {
  ServerState& s = state;
  http.Get("/health", guarded([](const httplib::Request&, httplib::Response& res) {
             send_json(res, 200, {{"status", "ok"}});
           }));
  http.Get("/v1/models", guarded([&s](const httplib::Request&, httplib::Response& res) {
             send_json(res, 200, models_json(s.model_id, s.started));
           }));
  http.Post("/v1/chat/completions",
            guarded([&s](const httplib::Request& req, httplib::Response& res) {
              handle_completion(s, req, res, Endpoint::kChat);
            }));
  http.Post("/v1/completions", guarded([&s](const httplib::Request& req, httplib::Response& res) {
              handle_completion(s, req, res, Endpoint::kCompletion);
            }));
  http.Post("/tokenize", guarded([&s](const httplib::Request& req, httplib::Response& res) {
              handle_tokenize(s, req, res);
            }));
  http.Post("/detokenize", guarded([&s](const httplib::Request& req, httplib::Response& res) {
              handle_detokenize(s, req, res);
            }));
}

ApiServer::ApiServer(Engine& engine, const LlamaModel& model, const Tokenizer& tokenizer,
                     std::string model_id, ApiServerConfig config) {
  config.validate();
  impl_ = std::make_unique<Impl>(engine, model, tokenizer, std::move(model_id), std::move(config));
  impl_->state.started = std::chrono::duration_cast<std::chrono::seconds>(
                             std::chrono::system_clock::now().time_since_epoch())
                             .count();
  // The server's own --head is resolved now, so that a bad one fails at start, not at a request.
  const std::string& head = impl_->state.config.head.head;
  if (head != "none")
    impl_->state.heads.emplace(
        head, std::make_unique<HeadChooser>(impl_->state.config.head, model, tokenizer));
  impl_->install_limits();
  impl_->install_auth();
  impl_->install_routes();
}

ApiServer::~ApiServer() {
  stop();
}

int ApiServer::bind() {
  const ApiServerConfig& c = impl_->state.config;
  if (c.port == 0) {
    impl_->port = impl_->http.bind_to_any_port(c.host);
    if (impl_->port < 0) throw Error("--host " + c.host + ": cannot bind a port there");
  } else {
    if (!impl_->http.bind_to_port(c.host, c.port))
      throw Error("--host " + c.host + " --port " + std::to_string(c.port) +
                  ": cannot bind (address in use, or not an address of this machine)");
    impl_->port = c.port;
  }
  impl_->bound = true;
  if (!is_loopback_host(c.host))
    logger("api")->warn("serving on {}:{}, beyond this machine; requests need the API key", c.host,
                        impl_->port);
  return impl_->port;
}

void ApiServer::serve() {
  if (!impl_->bound) throw Error("ApiServer::serve: bind() first");
  logger("api")->info("serving {} on {}:{}", impl_->state.model_id, impl_->state.config.host,
                      impl_->port);
  impl_->http.listen_after_bind();
  logger("api")->info("stopped");
}

void ApiServer::stop() {
  if (!impl_) return;
  impl_->state.stopping = true;
  impl_->http.stop();
}

}  // namespace tokenfab::api
