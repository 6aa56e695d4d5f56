#include "core/api/api_server.h"

#include <arpa/inet.h>
#include <sys/socket.h>
#include <openssl/crypto.h>
#include <openssl/sha.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <thread>

#include "core/api/openai_response.h"
#include "core/api/prometheus_metrics.h"
#include "core/api/server_state.h"
#include "core/common/log.h"

namespace tokenfab::api {

using nlohmann::json;

// Connections waiting for accept(): enough for every client of a full queue arriving at once (the
// kernel caps it at net.core.somaxconn).
constexpr int kListenBacklog = 1024;

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
  for (const std::string& o : cors_origins)
    if (o != "*" && o.find("://") == std::string::npos)
      throw Error("--cors-origin " + o +
                  ": expected an origin such as http://localhost:3000, or * for any");
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

std::shared_ptr<Backend> ServerState::backend_or_null() const {
  std::lock_guard lock(mutex_);
  return backend_;
}

std::shared_ptr<Backend> ServerState::backend() const {
  std::shared_ptr<Backend> b = backend_or_null();
  if (!b || b->detaching)
    throw ApiError(503, "The model is loading; retry in a moment (GET /health says when).", "",
                   "server_error", "model_loading");
  return b;
}

void ServerState::set_backend(std::shared_ptr<Backend> b) {
  std::lock_guard lock(mutex_);
  backend_ = std::move(b);
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
  const std::shared_ptr<Backend> b = state.backend();
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
      b->tokenizer.encode(content, add_special && b->tokenizer.add_bos_token(), false);
  send_json(res, 200, {{"tokens", tokens}});
}

// POST /detokenize {"tokens"} → {"content"}.
void handle_detokenize(ServerState& state, const httplib::Request& req, httplib::Response& res) {
  const json j = body_object(req);
  const std::shared_ptr<Backend> b = state.backend();
  for (const auto& [key, v] : j.items())
    if (key != "tokens") throw ApiError(400, key + ": unknown field (tokens)", key);
  const auto it = j.find("tokens");
  if (it == j.end()) throw ApiError(400, "tokens: missing", "tokens");
  if (!it->is_array()) throw ApiError(400, "tokens: expected an array of token ids", "tokens");
  std::vector<TokenId> ids;
  const int32_t n_vocab = b->tokenizer.n_vocab();
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
  send_json(res, 200, {{"content", b->tokenizer.decode(ids, false)}});
}

// GET /health: 200 {"status":"ok"} with an engine attached, 503 {"status":"loading"} without.
void handle_health(ServerState& state, httplib::Response& res) {
  const std::shared_ptr<Backend> b = state.backend_or_null();
  if (b && !b->detaching)
    send_json(res, 200, {{"status", "ok"}});
  else
    send_json(res, 503, {{"status", "loading"}});
}

// GET /metrics: Prometheus text from the engine's snapshot and counters.
void handle_metrics(ServerState& state, httplib::Response& res) {
  const std::shared_ptr<Backend> b = state.backend_or_null();
  MetricsInput in;
  in.api_in_flight = state.in_flight.load();
  std::optional<EngineSnapshot> snapshot;
  std::optional<LiveCounters> counters;
  if (b && !b->detaching) {
    in.model_name = b->model_id;
    snapshot = b->engine.snapshot();
    counters = b->engine.live_counters();
    in.snapshot = &*snapshot;
    in.counters = &*counters;
  }
  res.status = 200;
  res.set_content(prometheus_text(in), "text/plain; version=0.0.4; charset=utf-8");
}

// The Access-Control-Allow-Origin value for a request from `origin`, or empty when that origin
// is not allowed (or CORS is off).
std::string allowed_origin(const ApiServerConfig& c, const std::string& origin) {
  if (origin.empty()) return {};
  for (const std::string& o : c.cors_origins)
    if (o == "*" || o == origin) return o == "*" ? "*" : origin;
  return {};
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
  int listen_fd = -1;       // the listening socket, recorded by the socket-options hook
  std::mutex attach_mutex;  // attach() and detach(), one at a time

  explicit Impl(ApiServerConfig c) : state(std::move(c)) {}
  void install_limits();
  void install_auth();
  void install_cors();
  void install_routes();
};

void ApiServer::Impl::install_limits() {
  const ApiServerConfig& c = state.config;
  // Each generation request holds a handler thread until it ends; a few more serve the rest.
  const auto threads = static_cast<size_t>(c.max_in_flight) + 4;
  http.new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
  // httplib's own socket options set SO_REUSEPORT, with which a second server binds a port that is
  // in use without an error and the two share its connections. Ours: SO_REUSEADDR only (a
  // restarted server binds at once past the old connections' TIME_WAIT), and the socket is
  // recorded so that bind() can raise the listen backlog.
  http.set_socket_options([this](socket_t sock) {
    const int yes = 1;
    setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
    listen_fd = sock;
  });
  // Every SSE event is a small write the client waits for: no Nagle delay behind the last one.
  http.set_tcp_nodelay(true);
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
    // A browser's CORS preflight carries no credentials; it only learns what it may send.
    if (req.path == "/health" || req.method == "OPTIONS" ||
        key_matches(presented_key(req), state.config.api_key))
      return httplib::Server::HandlerResponse::Unhandled;
    send_error(res, ApiError(401,
                             "Incorrect or missing API key: give it as `Authorization: Bearer "
                             "KEY` or `X-Api-Key: KEY`.",
                             "", "authentication_error", "invalid_api_key"));
    return httplib::Server::HandlerResponse::Handled;
  });
}

void ApiServer::Impl::install_cors() {
  if (state.config.cors_origins.empty()) return;
  http.set_post_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
    const std::string origin = allowed_origin(state.config, req.get_header_value("Origin"));
    if (origin.empty()) return;
    res.set_header("Access-Control-Allow-Origin", origin);
    if (origin != "*") res.set_header("Vary", "Origin");
  });
  http.Options(R"(.*)", [this](const httplib::Request& req, httplib::Response& res) {
    const std::string origin = allowed_origin(state.config, req.get_header_value("Origin"));
    res.status = 204;
    if (origin.empty()) return;
    res.set_header("Access-Control-Allow-Methods", "GET, POST, OPTIONS");
    res.set_header("Access-Control-Allow-Headers", "Authorization, Content-Type, X-Api-Key");
    res.set_header("Access-Control-Max-Age", "600");
  });
}

void ApiServer::Impl::install_routes() {
  ServerState& s = state;
  http.Get("/health", guarded([&s](const httplib::Request&, httplib::Response& res) {
             handle_health(s, res);
           }));
  http.Get("/metrics", guarded([&s](const httplib::Request&, httplib::Response& res) {
             handle_metrics(s, res);
           }));
  http.Get("/v1/models", guarded([&s](const httplib::Request&, httplib::Response& res) {
             send_json(res, 200, models_json(s.backend()->model_id, s.started));
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

ApiServer::ApiServer(ApiServerConfig config) {
  config.validate();
  impl_ = std::make_unique<Impl>(std::move(config));
  impl_->state.started = std::chrono::duration_cast<std::chrono::seconds>(
                             std::chrono::system_clock::now().time_since_epoch())
                             .count();
  impl_->install_limits();
  impl_->install_auth();
  impl_->install_cors();
  impl_->install_routes();
}

ApiServer::ApiServer(Engine& engine, const LlamaModel& model, const Tokenizer& tokenizer,
                     std::string model_id, int64_t context, ApiServerConfig config)
    : ApiServer(std::move(config)) {
  attach(engine, model, tokenizer, std::move(model_id), context);
}

void ApiServer::attach(Engine& engine, const LlamaModel& model, const Tokenizer& tokenizer,
                       std::string model_id, int64_t context) {
  std::lock_guard lock(impl_->attach_mutex);
  auto b = std::make_shared<Backend>(engine, model, tokenizer, std::move(model_id), context);
  // The server's own --head is resolved now, so that a bad one fails here, not at a request.
  const HeadOptions& head = impl_->state.config.head;
  if (head.head != "none")  // the key completions.cpp's choose_head looks up
    b->heads.emplace(head.head + "\n" + head.spec,
                     std::make_unique<HeadChooser>(head, model, tokenizer));
  std::shared_ptr<Backend> old = impl_->state.backend_or_null();
  if (old) {
    old->detaching = true;
    impl_->state.set_backend(nullptr);
    while (old.use_count() > 1) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  logger("api")->info("serving model {}", b->model_id);
  impl_->state.set_backend(std::move(b));
}

void ApiServer::detach() {
  std::lock_guard lock(impl_->attach_mutex);
  std::shared_ptr<Backend> old = impl_->state.backend_or_null();
  if (!old) return;
  old->detaching = true;  // generations in flight cancel their requests and end
  impl_->state.set_backend(nullptr);
  while (old.use_count() > 1) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  logger("api")->info("model {} detached", old->model_id);
}

bool ApiServer::attached() const {
  return impl_->state.backend_or_null() != nullptr;
}

int ApiServer::port() const {
  return impl_->port;
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
  // Debian's compiled httplib listens with a backlog of 5: 32 clients connecting at once overflow
  // it, and the kernel drops or resets their connections (the clients see resets, or a TTFT a
  // second longer while their SYN is retried). listen() on a listening socket sets a new backlog.
  if (impl_->listen_fd >= 0 && ::listen(impl_->listen_fd, kListenBacklog) != 0)
    logger("api")->warn("could not raise the listen backlog to {}", kListenBacklog);
  impl_->bound = true;
  if (!is_loopback_host(c.host))
    logger("api")->warn("serving on {}:{}, beyond this machine; requests need the API key", c.host,
                        impl_->port);
  return impl_->port;
}

void ApiServer::serve() {
  if (!impl_->bound) throw Error("ApiServer::serve: bind() first");
  logger("api")->info("listening on {}:{}", impl_->state.config.host, impl_->port);
  impl_->http.listen_after_bind();
  logger("api")->info("stopped");
}

void ApiServer::stop() {
  if (!impl_) return;
  impl_->state.stopping = true;
  impl_->http.stop();
}

}  // namespace tokenfab::api
