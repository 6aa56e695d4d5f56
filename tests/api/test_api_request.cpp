// core/api without a model: the OpenAI request parser (what it takes, what it refuses and the
// field it names), stop strings cut across pieces, and the response shapes.

#include <QtTest>

#include "core/api/api_error.h"
#include "core/api/api_server.h"
#include "core/api/openai_request.h"
#include "core/api/openai_response.h"
#include "core/api/stop_text.h"

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
};

void TestApiRequest::chat_fields_are_taken() {
  const OpenAiRequest r = parse_openai_request(
      "{" + kMessages +
          R"(,"model":"m","max_completion_tokens":7,"temperature":0.5,"top_p":0.9,"top_k":20,
          "min_p":0.1,"seed":42,"stop":["a","b"],"stream":true,
          "stream_options":{"include_usage":true},"n":1,"tokenfab":{"head":"none"}})",
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
  QVERIFY(r.stream && r.include_usage);
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
  QVERIFY(!r.stream && !r.head);
}

void TestApiRequest::unsupported_fields_are_refused_by_name() {
  for (const char* field : {R"("tools":[{"type":"function"}])", R"("n":2)", R"("logprobs":true)",
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
  QCOMPARE(refusal("{" + kMessages + R"(,"tokenfab":{"spec":"tree"}})").param,
           std::string("tokenfab.spec"));
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

QTEST_GUILESS_MAIN(TestApiRequest)
#include "test_api_request.moc"
