// core/api without a model: the OpenAI request parser (what it takes, what it refuses and the
// field it names), stop strings cut across pieces, the response shapes, log-probabilities, the
// Prometheus text, and a server with no engine attached yet.

#include <QtTest>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>

#include <chrono>
#include <cmath>
#include <thread>

#include <httplib.h>
#include <nlohmann/json.hpp>

#include "core/api/api_error.h"
#include "core/api/api_server.h"
#include "core/api/openai_request.h"
#include "core/api/openai_response.h"
#include "core/api/prometheus_metrics.h"
#include "core/api/stop_text.h"
#include "core/metrics/live_counters.h"
#include "core/runtime/token_logprobs.h"

using namespace tokenfab;
using namespace tokenfab::api;

namespace {

// The ApiError parse_openai_request throws for `body` (status 0 when it throws none).
ApiError refusal(const std::string& body, Endpoint endpoint = Endpoint::kChat) {
  try {
    parse_openai_request(body, endpoint);
  } catch (const ApiError& e) {
    return e;
  }
  return ApiError(0, "accepted");
}

const std::string kMessages = R"("messages":[{"role":"user","content":"hi"}])";

}  // namespace

class TestApiRequest : public QObject {
  Q_OBJECT
 private slots:
  void chat_fields_are_taken();
  void content_parts_are_joined();
  void defaults_are_openais();
  void unsupported_fields_are_refused_by_name();
  void fields_that_ask_nothing_are_accepted();
  void wrong_types_and_ranges_name_the_field();
  void completion_needs_a_prompt();
  void stop_text_cuts_at_the_first_stop();
  void stop_text_holds_back_a_possible_start();
  void stop_text_without_stops_passes_everything();
  void chunks_share_id_and_created();
  void loopback_hosts();
  void non_loopback_needs_a_key();
  void logprobs_and_the_extension_are_read();
  void token_logprob_is_the_log_softmax();
  void logprobs_json_shapes();
  void prometheus_text_escapes_and_counts();
  void unattached_server_says_loading();
  void clients_connecting_at_once_are_all_accepted();
  void a_port_in_use_is_refused();
};

void TestApiRequest::chat_fields_are_taken() {
  const OpenAiRequest r = parse_openai_request(
      "{" + kMessages +
          R"(,"model":"m","max_completion_tokens":7,"temperature":0.5,"top_p":0.9,"top_k":20,
          "min_p":0.1,"seed":42,"stop":["a","b"],"stream":true,
          "stream_options":{"include_usage":true},"n":1,"ignore_eos":true,"tokenfab":{"head":"none"}})",
      Endpoint::kChat);
  QCOMPARE(r.model, std::string("m"));
  QCOMPARE(r.messages.size(), size_t{1});
  QCOMPARE(r.messages[0].role, std::string("user"));
  QCOMPARE(r.messages[0].content, std::string("hi"));
  QCOMPARE(*r.max_tokens, 7);
  QCOMPARE(r.sampling.temperature, 0.5f);
  QCOMPARE(r.sampling.top_p, 0.9f);
  QCOMPARE(r.sampling.top_k, 20);
  QCOMPARE(r.sampling.min_p, 0.1f);
  QCOMPARE(r.sampling.seed, uint64_t{42});
  QCOMPARE(r.stop, (std::vector<std::string>{"a", "b"}));
  QVERIFY(r.stream && r.include_usage && r.ignore_eos);
  QCOMPARE(*r.head, std::string("none"));
}

void TestApiRequest::content_parts_are_joined() {
  const OpenAiRequest r = parse_openai_request(
      R"({"messages":[{"role":"developer","content":"sys"},
          {"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]}]})",
      Endpoint::kChat);
  QCOMPARE(r.messages[0].role, std::string("system"));
  QCOMPARE(r.messages[1].content, std::string("ab"));
  QCOMPARE(refusal(R"({"messages":[{"role":"user","content":[{"type":"image_url"}]}]})").param,
           std::string("messages[0].content[0].type"));
  QCOMPARE(refusal(R"({"messages":[{"role":"tool","content":"x"}]})").param,
           std::string("messages[0].role"));
}

void TestApiRequest::defaults_are_openais() {
  const OpenAiRequest r = parse_openai_request("{" + kMessages + "}", Endpoint::kChat);
  QCOMPARE(r.sampling.temperature, 1.0f);
  QCOMPARE(r.sampling.top_p, 1.0f);
  QCOMPARE(r.sampling.top_k, 0);
  QCOMPARE(r.sampling.min_p, 0.0f);
  QVERIFY(!r.max_tokens);
  QVERIFY(!r.stream && !r.head && !r.ignore_eos);
}

void TestApiRequest::unsupported_fields_are_refused_by_name() {
  for (const char* field : {R"("tools":[{"type":"function"}])", R"("n":2)",
                            R"("response_format":{"type":"json_object"})",
                            R"("logit_bias":{"1":5})", R"("frequency_penalty":0.5)"}) {
    const ApiError e = refusal("{" + kMessages + "," + field + "}");
    QCOMPARE(e.status, 400);
    const std::string name = std::string(field).substr(1, std::string(field).find('"', 1) - 1);
    QCOMPARE(e.param, name);
    QVERIFY(std::string(e.what()).find("not supported") != std::string::npos);
  }
  const ApiError unknown = refusal("{" + kMessages + R"(,"frobnicate":1})");
  QCOMPARE(unknown.param, std::string("frobnicate"));
  QCOMPARE(refusal("{" + kMessages + R"(,"tokenfab":{"spec":"wide"}})").param,
           std::string("tokenfab.spec"));
  QCOMPARE(refusal("{" + kMessages + R"(,"tokenfab":{"lookup":99}})").param,
           std::string("tokenfab.lookup"));
  QCOMPARE(refusal("{" + kMessages + R"(,"tokenfab":{"mode":1}})").param,
           std::string("tokenfab.mode"));
}

void TestApiRequest::logprobs_and_the_extension_are_read() {
  const OpenAiRequest chat = parse_openai_request(
      "{" + kMessages +
          R"(,"logprobs":true,"top_logprobs":5,"tokenfab":{"head":"auto","spec":"tree","lookup":3,"draft_len":6}})",
      Endpoint::kChat);
  QCOMPARE(chat.logprobs.value_or(-1), 5);
  QCOMPARE(chat.head.value_or(""), std::string("auto"));
  QCOMPARE(chat.spec.value_or(""), std::string("tree"));
  QCOMPARE(chat.lookup.value_or(-1), 3);
  QCOMPARE(chat.draft_len.value_or(-1), 6);
  // logprobs true alone: the token's own log-probability, no alternatives.
  QCOMPARE(parse_openai_request("{" + kMessages + R"(,"logprobs":true})", Endpoint::kChat)
               .logprobs.value_or(-1),
           0);
  QVERIFY(
      !parse_openai_request("{" + kMessages + R"(,"logprobs":false})", Endpoint::kChat).logprobs);
  // top_logprobs needs logprobs; at most 20.
  QCOMPARE(refusal("{" + kMessages + R"(,"top_logprobs":2})").param, std::string("top_logprobs"));
  QCOMPARE(refusal("{" + kMessages + R"(,"logprobs":true,"top_logprobs":21})").param,
           std::string("top_logprobs"));
  // Completions: logprobs is the number of alternatives.
  QCOMPARE(parse_openai_request(R"({"prompt":"x","logprobs":3})", Endpoint::kCompletion)
               .logprobs.value_or(-1),
           3);
}

void TestApiRequest::token_logprob_is_the_log_softmax() {
  // A row whose softmax is known: logits log(1), log(2), log(3), log(4) → p = 0.1 … 0.4.
  const std::vector<float> logits = {std::log(1.0f), std::log(2.0f), std::log(3.0f),
                                     std::log(4.0f)};
  const TokenLogprob lp = token_logprob(logits, 1, 2);
  QVERIFY(std::abs(lp.logprob - std::log(0.2f)) < 1e-6f);
  QCOMPARE(lp.top.size(), size_t{2});
  QCOMPARE(lp.top[0].first, 3);
  QCOMPARE(lp.top[1].first, 2);
  QVERIFY(std::abs(lp.top[0].second - std::log(0.4f)) < 1e-6f);
  // Huge logits do not overflow: the maximum is taken out first.
  const std::vector<float> big = {1000.0f, 1000.0f};
  QVERIFY(std::abs(token_logprob(big, 0, 0).logprob - std::log(0.5f)) < 1e-6f);
  QVERIFY(token_logprob(big, 0, 0).top.empty());
}

void TestApiRequest::logprobs_json_shapes() {
  const std::vector<LogprobEntry> entries = {{"He", -0.5f, {{"He", -0.5f}, {"A", -1.5f}}},
                                             {"llo", -0.25f, {{"llo", -0.25f}, {"y", -2.0f}}}};
  const nlohmann::json chat = logprobs_json(Endpoint::kChat, true, entries);
  QCOMPARE(chat["content"].size(), size_t{2});
  QCOMPARE(chat["content"][0]["token"].get<std::string>(), std::string("He"));
  QCOMPARE(chat["content"][0]["bytes"], nlohmann::json({72, 101}));
  QCOMPARE(chat["content"][1]["top_logprobs"][1]["token"].get<std::string>(), std::string("y"));
  const nlohmann::json text = logprobs_json(Endpoint::kCompletion, true, entries, 10);
  QCOMPARE(text["tokens"], nlohmann::json({"He", "llo"}));
  QCOMPARE(text["text_offset"], nlohmann::json({10, 12}));
  QCOMPARE(text["top_logprobs"][0]["A"].get<double>(), -1.5);
  QVERIFY(logprobs_json(Endpoint::kChat, false, entries).is_null());
}

void TestApiRequest::prometheus_text_escapes_and_counts() {
  QCOMPARE(escape_label_value("a\"b\\c\nd"), std::string("a\\\"b\\\\c\\nd"));
  BucketHistogram h({0.1, 1.0});
  h.add(0.05);
  h.add(0.1);  // "less than or equal": the 0.1 bucket
  h.add(5.0);
  QCOMPARE(h.cumulative(), (std::vector<int64_t>{2, 2, 3}));
  QCOMPARE(h.count(), int64_t{3});
  LiveCounters c;
  const std::vector<double> gaps = {0.002, 0.003};
  const std::vector<int64_t> proposed = {4, 3}, accepted = {3, 1};
  c.on_ended({kFinishLength, 0.05, 0.2, gaps, "code", 4, proposed, accepted});
  c.on_ended({kFinishAbort, std::nullopt, std::nullopt, {}, "", 0, {}, {}});
  QCOMPARE(c.ended_by_reason.at(kFinishLength), int64_t{1});
  QCOMPARE(c.ended_by_reason.at(kFinishAbort), int64_t{1});
  QCOMPARE(c.itl_s.count(), int64_t{2});
  QCOMPARE(c.ttft_s.count(), int64_t{1});
  const SpeculationCounters& s = c.speculation_by_head.at("code");
  QCOMPARE(s.drafts, int64_t{4});
  QCOMPARE(s.draft_tokens, int64_t{7});
  QCOMPARE(s.accepted_tokens, int64_t{4});
  QCOMPARE(s.accepted_per_position, (std::vector<int64_t>{3, 1}));
  // Without an engine (the model loads) only the server's own gauge is there.
  const std::string loading = prometheus_text({"m", nullptr, nullptr, 2});
  QVERIFY(loading.find("tokenfab:api_requests_in_flight{model_name=\"m\"} 2\n") !=
          std::string::npos);
  QVERIFY(loading.find("tokenfab:prompt_tokens") == std::string::npos);
}

void TestApiRequest::fields_that_ask_nothing_are_accepted() {
  const std::string body = "{" + kMessages +
                           R"(,"n":1,"logprobs":false,"presence_penalty":0,"tools":[],
                           "user":"u","seed":null})";
  QCOMPARE(refusal(body).status, 0);
}

void TestApiRequest::wrong_types_and_ranges_name_the_field() {
  QCOMPARE(refusal("{" + kMessages + R"(,"temperature":"hot"})").param, std::string("temperature"));
  QCOMPARE(refusal("{" + kMessages + R"(,"temperature":3})").param, std::string("temperature"));
  QCOMPARE(refusal("{" + kMessages + R"(,"max_tokens":0})").param, std::string("max_tokens"));
  QCOMPARE(refusal("{" + kMessages + R"(,"max_tokens":1.5})").param, std::string("max_tokens"));
  QCOMPARE(refusal("{" + kMessages + R"(,"stop":[1]})").param, std::string("stop[0]"));
  QCOMPARE(refusal("{" + kMessages + R"(,"stop":["a","b","c","d","e"]})").param,
           std::string("stop"));
  QCOMPARE(refusal("{" + kMessages + R"(,"stream_options":{"include_usage":true}})").param,
           std::string("stream_options"));
  QCOMPARE(refusal(R"({"messages":[]})").param, std::string("messages"));
  QCOMPARE(refusal(R"({"model":"m"})").param, std::string("messages"));
  QCOMPARE(refusal("{not json").status, 400);
  QCOMPARE(refusal("[1]").status, 400);
}

void TestApiRequest::completion_needs_a_prompt() {
  const OpenAiRequest r =
      parse_openai_request(R"({"prompt":"Once","max_tokens":3})", Endpoint::kCompletion);
  QCOMPARE(r.prompt, std::string("Once"));
  QCOMPARE(refusal(R"({"prompt":["a","b"]})", Endpoint::kCompletion).param, std::string("prompt"));
  QCOMPARE(refusal(R"({"prompt":""})", Endpoint::kCompletion).param, std::string("prompt"));
  // messages is a chat field: on /v1/completions it is unknown.
  QCOMPARE(refusal("{" + kMessages + "}", Endpoint::kCompletion).param, std::string("messages"));
  QCOMPARE(refusal(R"({"prompt":"a","max_completion_tokens":3})", Endpoint::kCompletion).param,
           std::string("max_completion_tokens"));
}

void TestApiRequest::stop_text_cuts_at_the_first_stop() {
  StopText s({"END", "ST"});
  QCOMPARE(s.push("abc"), std::string("abc"));
  QCOMPARE(s.push("dSTxEND"), std::string("d"));
  QVERIFY(s.stopped());
  QCOMPARE(s.push("more"), std::string());
  QCOMPARE(s.flush(), std::string());
}

void TestApiRequest::stop_text_holds_back_a_possible_start() {
  StopText s({"</answer>"});
  QCOMPARE(s.push("yes <"), std::string("yes "));
  QCOMPARE(s.push("/ans"), std::string());
  QCOMPARE(s.push("wer>tail"), std::string());
  QVERIFY(s.stopped());

  StopText t({"</answer>"});
  QCOMPARE(t.push("a </an"), std::string("a "));
  QCOMPARE(t.push("d"), std::string("</and"));  // not the stop string after all
  QCOMPARE(t.push("<"), std::string());
  QCOMPARE(t.flush(), std::string("<"));  // the end: what was held back goes out
}

void TestApiRequest::stop_text_without_stops_passes_everything() {
  StopText s({});
  QCOMPARE(s.push("a"), std::string("a"));
  QCOMPARE(s.flush(), std::string());
}

void TestApiRequest::chunks_share_id_and_created() {
  const ResponseIdentity who = new_identity(Endpoint::kChat, "m");
  QVERIFY(who.id.starts_with("chatcmpl-") && who.id.size() == 9 + 24);
  const auto first = chunk_json(who, "", true, "");
  const auto last = chunk_json(who, "", false, "length");
  QCOMPARE(first["id"], last["id"]);
  QCOMPARE(first["created"], last["created"]);
  QCOMPARE(first["object"], nlohmann::json("chat.completion.chunk"));
  QCOMPARE(first["choices"][0]["delta"]["role"], nlohmann::json("assistant"));
  QVERIFY(first["choices"][0]["finish_reason"].is_null());
  QCOMPARE(last["choices"][0]["finish_reason"], nlohmann::json("length"));
  const auto usage = usage_chunk_json(who, {5, 3}, {});
  QCOMPARE(usage["usage"]["total_tokens"], nlohmann::json(8));
  QVERIFY(usage["choices"].empty());
  QVERIFY(new_identity(Endpoint::kCompletion, "m").id.starts_with("cmpl-"));
}

void TestApiRequest::loopback_hosts() {
  QVERIFY(is_loopback_host("127.0.0.1"));
  QVERIFY(is_loopback_host("127.1.2.3"));
  QVERIFY(is_loopback_host("::1"));
  QVERIFY(is_loopback_host("localhost"));
  QVERIFY(!is_loopback_host("0.0.0.0"));
  QVERIFY(!is_loopback_host("192.168.1.5"));
  QVERIFY(!is_loopback_host("::"));
  QVERIFY(!is_loopback_host("example.com"));
}

void TestApiRequest::non_loopback_needs_a_key() {
  ApiServerConfig c;
  c.host = "0.0.0.0";
  QVERIFY_THROWS_EXCEPTION(Error, c.validate());
  c.api_key = "a-key-of-some-length";
  c.validate();
}

// A server with no engine yet (the model loads): /health and generation say 503, /metrics has
// the server's own gauge only.
void TestApiRequest::unattached_server_says_loading() {
  ApiServerConfig c;
  c.port = 0;
  ApiServer server(c);
  const int port = server.bind();
  std::thread serving([&] { server.serve(); });
  httplib::Client client("127.0.0.1", port);
  client.set_connection_timeout(5, 0);
  auto get_health = [&] {  // until the listener runs
    for (int i = 0; i < 100; ++i) {
      if (httplib::Result r = client.Get("/health")) return r;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return client.Get("/health");
  };
  const httplib::Result health = get_health();
  QVERIFY(health);
  QCOMPARE(health->status, 503);
  QCOMPARE(nlohmann::json::parse(health->body)["status"].get<std::string>(),
           std::string("loading"));
  const auto chat = client.Post("/v1/chat/completions", "{" + kMessages + "}", "application/json");
  QVERIFY(chat);
  QCOMPARE(chat->status, 503);
  QCOMPARE(nlohmann::json::parse(chat->body)["error"]["code"].get<std::string>(),
           std::string("model_loading"));
  const auto metrics = client.Get("/metrics");
  QVERIFY(metrics);
  QCOMPARE(metrics->status, 200);
  QVERIFY(metrics->body.find("tokenfab:api_requests_in_flight") != std::string::npos);
  QVERIFY(!server.attached());
  server.stop();
  serving.join();
}

// 100 clients connect at once to a server whose accept loop is not running yet: the kernel
// completes every handshake only if the listen backlog holds them all (httplib's own is 5; beyond
// it SYNs are dropped and retried a second later, or the connections reset).
void TestApiRequest::clients_connecting_at_once_are_all_accepted() {
  ApiServerConfig c;
  c.port = 0;
  ApiServer server(c);
  const int port = server.bind();
  constexpr int kClients = 100;
  std::vector<int> fds;
  for (int i = 0; i < kClients; ++i) {
    const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
    QVERIFY(fd >= 0);
    fds.push_back(fd);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<uint16_t>(port));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    const int r = ::connect(fd, reinterpret_cast<const sockaddr*>(&a), sizeof a);
    QVERIFY(r == 0 || errno == EINPROGRESS);
  }
  int connected = 0;
  for (const int fd : fds) {
    pollfd p{fd, POLLOUT, 0};
    int err = 0;
    socklen_t len = sizeof err;
    if (::poll(&p, 1, 500) == 1 && ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) == 0 &&
        err == 0)
      ++connected;
    ::close(fd);
  }
  QCOMPARE(connected, kClients);
}

// httplib's default socket options (SO_REUSEPORT) would let a second server share the port.
void TestApiRequest::a_port_in_use_is_refused() {
  ApiServerConfig c;
  c.port = 0;
  ApiServer first(c);
  c.port = first.bind();
  ApiServer second(c);
  QVERIFY_THROWS_EXCEPTION(Error, second.bind());
}

QTEST_GUILESS_MAIN(TestApiRequest)
#include "test_api_request.moc"
