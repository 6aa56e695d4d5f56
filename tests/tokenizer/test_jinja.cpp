// Our Jinja implementation and the chat templates built on it: renders equal jinja2's byte for
// byte (tests/data/jinja_golden.json, from tools/golden_jinja.py), errors name the template, the
// position and the problem, runaway templates stop, and ChatTemplate falls back to the family's
// built-in format (Gemma 3 270M has no template) without ever doubling BOS.

#include <spdlog/sinks/ringbuffer_sink.h>
#include <QtTest>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/common/error.h"
#include "core/common/log.h"
#include "core/gguf/gguf_writer.h"
#include "core/model/model_files.h"
#include "core/tokenizer/chat_template.h"
#include "core/tokenizer/jinja_render.h"
#include "core/tokenizer/tokenizer.h"

using tokenfab::ChatMessage;
using tokenfab::ChatTemplate;
using tokenfab::ChatTokens;
using Json = nlohmann::ordered_json;
namespace jinja = tokenfab::jinja;
namespace gguf = tokenfab::gguf;

namespace QTest {
template <>
inline char* toString(const std::string& s) {
  return toString(QByteArray::fromStdString(s));
}
}  // namespace QTest

namespace {

const std::filesystem::path kData = std::filesystem::path(TOKENFAB_SOURCE_DIR) / "tests" / "data";

std::string read_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

jinja::Value from_json(const Json& j) {
  if (j.is_null()) return jinja::Value::none();
  if (j.is_boolean()) return jinja::Value(j.get<bool>());
  if (j.is_number_integer()) return jinja::Value(j.get<int64_t>());
  if (j.is_number_float()) return jinja::Value(j.get<double>());
  if (j.is_string()) return jinja::Value(j.get<std::string>());
  if (j.is_array()) {
    std::vector<jinja::Value> items;
    for (const Json& item : j) items.push_back(from_json(item));
    return jinja::Value::list(std::move(items));
  }
  jinja::DictData dict;
  for (const auto& [key, value] : j.items()) dict.set(jinja::Value(key), from_json(value));
  return jinja::Value::dict(std::move(dict));
}

jinja::DictData variables_of(const Json& j) {
  return from_json(j).as_dict();
}

// The golden file's fixed "now" (2025-03-14T09:26:53), as strftime_now reads it.
jinja::RenderOptions golden_options() {
  std::tm t{};
  t.tm_year = 2025 - 1900;
  t.tm_mon = 2;
  t.tm_mday = 14;
  t.tm_hour = 9;
  t.tm_min = 26;
  t.tm_sec = 53;
  timegm(&t);  // fills in the weekday and the day of the year
  jinja::RenderOptions options;
  options.now = t;
  return options;
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const tokenfab::Error& e) {
    return e.what();
  }
  return "(no error)";
}

std::string render(const std::string& text, const jinja::DictData& variables = {},
                   const jinja::RenderOptions& options = {}) {
  return jinja::Template::parse(text, "t").render(variables, options);
}

std::string render_error(const std::string& text, const jinja::RenderOptions& options = {}) {
  return error_of([&] { render(text, {}, options); });
}

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

#define VERIFY_CONTAINS(text, part) \
  QVERIFY2(contains((text), (part)), ("'" + std::string(part) + "' not in: " + (text)).c_str())

// Captures what the "tokenizer" logger writes while it lives.
class LogCapture {
 public:
  LogCapture() : sink_(std::make_shared<spdlog::sinks::ringbuffer_sink_mt>(64)) {
    tokenfab::logger("tokenizer")->sinks().push_back(sink_);
  }
  ~LogCapture() {
    auto& sinks = tokenfab::logger("tokenizer")->sinks();
    sinks.erase(std::find(sinks.begin(), sinks.end(), sink_));
  }
  std::vector<std::string> lines() const { return sink_->last_formatted(); }

 private:
  std::shared_ptr<spdlog::sinks::ringbuffer_sink_mt> sink_;
};

// A small GGUF file's metadata: architecture, vocabulary, and optionally a chat template.
gguf::GgufFile gguf_file(std::vector<uint8_t>& bytes, const std::string& architecture,
                         const std::vector<std::string>& tokens, bool add_bos,
                         const std::string* chat_template) {
  gguf::GgufWriter w;
  w.add("general.architecture", gguf::Value::string(architecture));
  w.add("tokenizer.ggml.model", gguf::Value::string("gpt2"));
  w.add("tokenizer.ggml.tokens", gguf::Value::string_array(tokens));
  w.add("tokenizer.ggml.bos_token_id", gguf::Value::u32(0));
  w.add("tokenizer.ggml.eos_token_id", gguf::Value::u32(1));
  w.add("tokenizer.ggml.add_bos_token", gguf::Value::boolean(add_bos));
  if (chat_template) w.add("tokenizer.chat_template", gguf::Value::string(*chat_template));
  bytes = w.to_bytes();
  return gguf::GgufFile::parse(bytes, "small.gguf");
}

}  // namespace

class JinjaTest : public QObject {
  Q_OBJECT

 private slots:
  void golden_templates_render_as_jinja2();
  void default_model_template_renders_as_jinja2();
  void fit_chat_prompt_with_a_builtin_format();
  void parse_errors_name_the_problem_and_position();
  void render_errors_name_the_problem_and_position();
  void runaway_templates_stop();
  void builtin_formats();
  void gemma3_falls_back_to_the_gemma_format_and_logs_once();
  void broken_or_missing_templates_fall_back();
  void no_double_bos();
  void default_system_prompt_found_by_rendering();
};

// Every case of tests/data/jinja_golden.json whose template is one of ours: the same text, or,
// where jinja2 refused, an error (with the template's message when it called raise_exception).
void JinjaTest::golden_templates_render_as_jinja2() {
  const Json golden = Json::parse(read_file(kData / "jinja_golden.json"));
  const jinja::RenderOptions options = golden_options();
  int checked = 0;
  for (const Json& c : golden["cases"]) {
    if (!c.contains("template")) continue;
    const std::string name = c["name"];
    const std::string file = c["template"];
    const jinja::Template t = jinja::Template::parse(read_file(kData / file), file);
    const jinja::DictData variables = variables_of(c["variables"]);
    if (c.contains("expected")) {
      std::string out;
      try {
        out = t.render(variables, options);
      } catch (const tokenfab::Error& e) {
        QFAIL((name + ": " + e.what()).c_str());
      }
      if (out != c["expected"].get<std::string>()) qWarning("case %s", name.c_str());
      QCOMPARE(out, c["expected"].get<std::string>());
    } else {
      const std::string error = error_of([&] { t.render(variables, options); });
      VERIFY_CONTAINS(error, file + ":");
      if (c["error_type"] == "TemplateError") VERIFY_CONTAINS(error, c["error"].get<std::string>());
    }
    ++checked;
  }
  QVERIFY(checked >= 60);
}

// SmolLM2's own template, read from the model file: our Jinja gives what jinja2 gave, directly
// and through ChatTemplate (which passes the same variables).
void JinjaTest::default_model_template_renders_as_jinja2() {
  const std::filesystem::path path = tokenfab::default_model_path();
  if (!std::filesystem::exists(path)) {
    QFAIL(("the model file " + path.string() + " is missing; fetch it with `tokenfab-cli fetch`")
              .c_str());
  }
  const gguf::GgufFile file = gguf::GgufFile::open(path);
  const ChatTemplate chat = ChatTemplate::from_gguf(file);
  QVERIFY(chat.family() == ChatTemplate::Family::Jinja);
  const jinja::Template t = jinja::Template::parse(file.get("tokenizer.chat_template").as_string(),
                                                   "tokenizer.chat_template");
  const Json golden = Json::parse(read_file(kData / "jinja_golden.json"));
  int checked = 0;
  for (const Json& c : golden["cases"]) {
    if (!c.contains("model_file")) continue;
    const std::string expected = c["expected"];
    QCOMPARE(t.render(variables_of(c["variables"])), expected);
    std::vector<ChatMessage> messages;
    for (const Json& m : c["variables"]["messages"]) messages.push_back({m["role"], m["content"]});
    QCOMPARE(chat.apply(messages, c["variables"]["add_generation_prompt"].get<bool>()), expected);
    ++checked;
  }
  QCOMPARE(checked, 10);
}

// fit_chat_prompt works the same over any template: here the Gemma format (system text folded
// into the first user turn) with SmolLM2's tokenizer.
void JinjaTest::fit_chat_prompt_with_a_builtin_format() {
  const std::filesystem::path path = tokenfab::default_model_path();
  if (!std::filesystem::exists(path)) {
    QFAIL(("the model file " + path.string() + " is missing; fetch it with `tokenfab-cli fetch`")
              .c_str());
  }
  const gguf::GgufFile file = gguf::GgufFile::open(path);
  const tokenfab::Tokenizer tok = tokenfab::Tokenizer::from_gguf(file);
  const ChatTemplate chat = ChatTemplate::builtin(ChatTemplate::Family::Gemma);
  std::vector<ChatMessage> messages = {{"system", "Be brief."}};
  for (int i = 0; i < 6; ++i) {
    messages.push_back({"user", "Question number " + std::to_string(i) + " about harbours?"});
    messages.push_back({"assistant", "Answer " + std::to_string(i) + ": harbours shelter boats."});
  }
  messages.push_back({"user", "Last one?"});
  const auto prompt_of = [&](size_t left_out) {
    std::vector<ChatMessage> kept = {messages[0]};
    kept.insert(kept.end(), messages.begin() + 1 + static_cast<std::ptrdiff_t>(left_out),
                messages.end());
    return tok.encode(chat.apply(kept, true), tok.add_bos_token(), true);
  };
  const int64_t reserve = 8;
  const int64_t limit = static_cast<int64_t>(prompt_of(0).size()) / 2 + reserve;
  const tokenfab::FittedPrompt fit = tokenfab::fit_chat_prompt(tok, chat, messages, reserve, limit);
  QVERIFY(fit.left_out > 0 && fit.left_out % 2 == 0 && fit.left_out < 12);
  QVERIFY(fit.tokens == prompt_of(static_cast<size_t>(fit.left_out)));
  QVERIFY(static_cast<int64_t>(fit.tokens.size()) + reserve <= limit);
  QVERIFY(static_cast<int64_t>(prompt_of(static_cast<size_t>(fit.left_out) - 2).size()) + reserve >
          limit);
  QVERIFY(tok.decode(fit.tokens).starts_with("<start_of_turn>user\nBe brief.\n\nQuestion number"));
}

void JinjaTest::parse_errors_name_the_problem_and_position() {
  struct Case {
    const char* text;
    const char* expected;
  };
  const Case cases[] = {
      {"{% for m in messages %}\n{{ m }}",
       "t:2:8: unexpected end of template: the 'for' block opened at line 1, column 1 is not "
       "closed "
       "(expected 'else' or 'endfor')"},
      {"line one\n{{ x | nosuch }}", "t:2:8: unknown filter 'nosuch'"},
      {"{% if x is frobbed %}{% endif %}", "t:1:12: unknown test 'frobbed'"},
      {"{% if x %}a{% endfor %}",
       "t:1:15: unexpected 'endfor' (the innermost open block is 'if', opened at line 1, column 1, "
       "which expects 'elif', 'else' or 'endif')"},
      {"{% endif %}", "t:1:4: unexpected 'endif' (no block is open)"},
      {"{{ 'abc }}", "t:1:4: the string literal is not closed"},
      {"{{ x ", "t:1:1: the tag is not closed ('}}' missing)"},
      {"{# note", "t:1:1: the comment is not closed ('#}' missing)"},
      {"{% include 'other.jinja' %}", "t:1:4: unknown or unsupported tag 'include'"},
      {"{% break %}", "t:1:4: 'break' outside a loop"},
      {"{{ 1 + }}", "t:1:8: expected an expression, got the end of the expression ('}}')"},
      {"{{ (1, 2 }}", "t:1:10: unexpected '}'"},
      {"{% for x in y recursive %}{% endfor %}", "recursive loops are not supported"},
      {"{{ x $ y }}", "t:1:6: unexpected character '$'"},
  };
  for (const Case& c : cases) {
    const std::string error = error_of([&] { jinja::Template::parse(c.text, "t"); });
    VERIFY_CONTAINS(error, c.expected);
  }
  // Columns count characters, not bytes.
  VERIFY_CONTAINS(error_of([] { jinja::Template::parse("{{ 'é' | nosuch }}", "t"); }), "t:1:10:");
  // Nesting deep enough to exhaust a recursive parser's stack is refused.
  const std::string deep = "{{ " + std::string(5000, '(') + "1" + std::string(5000, ')') + " }}";
  VERIFY_CONTAINS(error_of([&] { jinja::Template::parse(deep, "t"); }), "levels deep");
}

void JinjaTest::render_errors_name_the_problem_and_position() {
  VERIFY_CONTAINS(render_error("ok\n  {{ raise_exception('Roles must alternate') }}"),
                  "t:2:6: the template raised an error: Roles must alternate");
  VERIFY_CONTAINS(render_error("{{ foo.bar }}"), "t:1:7: 'foo' is undefined");
  VERIFY_CONTAINS(render_error("{{ {}.a.b }}"), "'dict object' has no attribute 'a'");
  VERIFY_CONTAINS(render_error("{{ 'a' + 1 }}"),
                  "t:1:4: unsupported operand type(s) for +: 'str' and 'int'");
  VERIFY_CONTAINS(render_error("{{ 1 // 0 }}"), "integer division or modulo by zero");
  VERIFY_CONTAINS(render_error("{% for a, b in [[1]] %}{% endfor %}"),
                  "not enough values to unpack (expected 2, got 1)");
  VERIFY_CONTAINS(render_error("{% set d = {} %}{% set d.x = 1 %}"),
                  "cannot assign attribute on non-namespace object");
  VERIFY_CONTAINS(render_error("{{ [1].append(2) }}"),
                  "access to attribute 'append' of 'list' object is unsafe");
  VERIFY_CONTAINS(render_error("{{ none | length }}"), "object of type 'NoneType' has no len()");
  // Through a chat template, the message names where the template came from.
  const ChatTemplate chat = ChatTemplate::from_template_text(
      "{% for m in messages %}{% if m.role == 'system' %}{{ raise_exception('no system role') }}"
      "{% endif %}{{ m.content }}{% endfor %}",
      "model.gguf: tokenizer.chat_template");
  const std::string error = error_of([&] { chat.apply({{"system", "x"}, {"user", "y"}}, true); });
  VERIFY_CONTAINS(error, "model.gguf: tokenizer.chat_template:1:");
  VERIFY_CONTAINS(error, "no system role");
}

void JinjaTest::runaway_templates_stop() {
  jinja::RenderOptions small;
  small.limits.max_output_bytes = 1 << 16;
  small.limits.max_iterations = 10'000;
  VERIFY_CONTAINS(render_error("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", small),
                  "levels deep (runaway recursion?)");
  VERIFY_CONTAINS(
      render_error("{% for a in range(100) %}{% for b in range(1000) %}{% endfor %}{% endfor %}",
                   small),
      "loop iterations and macro calls");
  VERIFY_CONTAINS(render_error("{% for i in range(100000000) %}{% endfor %}", small),
                  "range() is longer than the limit");
  VERIFY_CONTAINS(
      render_error("{% for i in range(5000) %}{{ 'xxxxxxxxxxxxxxxxxxxx' }}{% endfor %}", small),
      "the output would be larger than the limit of 65536 bytes");
  VERIFY_CONTAINS(render_error("{{ 'x' * 100000000 }}", small), "larger than the limit");
  VERIFY_CONTAINS(render_error("{% set ns = namespace() %}{% set ns.me = ns %}{{ ns }}"),
                  "nested more than 200 levels deep");
  VERIFY_CONTAINS(render_error("{% set ns = namespace(v=[]) %}{% for i in range(300) %}"
                               "{% set ns.v = [ns.v] %}{% endfor %}{{ ns.v | tojson }}"),
                  "nested more than 200 levels deep");
  // The defaults are generous enough for real conversations.
  QCOMPARE(render("{% for i in range(100000) %}{% endfor %}done"), std::string("done"));
}

// The built-in formats, as the families document them.
void JinjaTest::builtin_formats() {
  using F = ChatTemplate::Family;
  const std::vector<ChatMessage> chat = {
      {"system", "Be brief."}, {"user", "Hi"}, {"assistant", "Hello."}, {"user", "Bye"}};
  const ChatTokens tokens{"<s>", "</s>", true};
  QCOMPARE(ChatTemplate::builtin(F::ChatML).apply(chat, true),
           std::string("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
                       "<|im_start|>assistant\nHello.<|im_end|>\n<|im_start|>user\nBye<|im_end|>\n"
                       "<|im_start|>assistant\n"));
  QCOMPARE(ChatTemplate::builtin(F::Llama3, tokens).apply(chat, true),
           std::string("<|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"
                       "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
                       "<|start_header_id|>assistant<|end_header_id|>\n\nHello.<|eot_id|>"
                       "<|start_header_id|>user<|end_header_id|>\n\nBye<|eot_id|>"
                       "<|start_header_id|>assistant<|end_header_id|>\n\n"));
  QCOMPARE(ChatTemplate::builtin(F::Gemma, tokens).apply(chat, true),
           std::string("<start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n"
                       "<start_of_turn>model\nHello.<end_of_turn>\n"
                       "<start_of_turn>user\nBye<end_of_turn>\n<start_of_turn>model\n"));
  QCOMPARE(ChatTemplate::builtin(F::Mistral, tokens).apply(chat, true),
           std::string("[INST] Be brief.\n\nHi [/INST] Hello.</s>[INST] Bye [/INST]"));
  QCOMPARE(ChatTemplate::builtin(F::Phi3, tokens).apply(chat, false),
           std::string("<|system|>\nBe brief.<|end|>\n<|user|>\nHi<|end|>\n<|assistant|>\nHello."
                       "<|end|>\n<|user|>\nBye<|end|>\n"));
  // The old ChatML API: a default system turn opens a conversation without one.
  QCOMPARE(ChatTemplate::chatml("Default.").apply({{"user", "Hi"}}, true),
           std::string("<|im_start|>system\nDefault.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
                       "<|im_start|>assistant\n"));
  QCOMPARE(ChatTemplate::chatml(std::nullopt).apply({}, true),
           std::string("<|im_start|>assistant\n"));
  QVERIFY(ChatTemplate::builtin(F::Gemma).family() == F::Gemma);
}

// Gemma 3 270M's file has no chat template: the Gemma format, one warning saying so, and no BOS
// text (its tokenizer adds BOS).
void JinjaTest::gemma3_falls_back_to_the_gemma_format_and_logs_once() {
  const std::filesystem::path path = tokenfab::gemma3_model_path();
  if (!std::filesystem::exists(path)) {
    QFAIL(("the model file " + path.string() +
           " is missing; fetch it with `tokenfab-cli fetch gemma3-270m --accept-license`")
              .c_str());
  }
  const gguf::GgufFile file = gguf::GgufFile::open(path);
  QVERIFY(file.find("tokenizer.chat_template") == nullptr);
  const LogCapture log;
  const ChatTemplate chat = ChatTemplate::from_gguf(file);
  QVERIFY(chat.family() == ChatTemplate::Family::Gemma);
  const std::vector<std::string> lines = log.lines();
  QCOMPARE(lines.size(), size_t{1});
  VERIFY_CONTAINS(lines[0], "[warning]");
  VERIFY_CONTAINS(lines[0], "it has no chat template");
  VERIFY_CONTAINS(lines[0], "using the built-in gemma chat format");
  QCOMPARE(
      chat.apply({{"system", "Be brief."}, {"user", "Hi"}, {"assistant", "Hello"}, {"user", "Bye"}},
                 true),
      std::string("<start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n<start_of_turn>model\n"
                  "Hello<end_of_turn>\n<start_of_turn>user\nBye<end_of_turn>\n"
                  "<start_of_turn>model\n"));
  QVERIFY(!chat.default_system_prompt());
}

void JinjaTest::broken_or_missing_templates_fall_back() {
  const std::vector<std::string> llama3_vocab = {"<|begin_of_text|>", "<|eot_id|>",
                                                 "<|start_header_id|>", "<|end_header_id|>"};
  {  // A template that does not parse: the family its text names.
    const std::string broken = "{% for m in messages %}<|start_header_id|>{{ m.role }}";
    std::vector<uint8_t> bytes;
    const gguf::GgufFile file = gguf_file(bytes, "llama", llama3_vocab, true, &broken);
    const LogCapture log;
    const ChatTemplate chat = ChatTemplate::from_gguf(file);
    QVERIFY(chat.family() == ChatTemplate::Family::Llama3);
    QCOMPARE(log.lines().size(), size_t{1});
    VERIFY_CONTAINS(log.lines()[0],
                    "small.gguf: its chat template cannot be used: small.gguf: "
                    "tokenizer.chat_template:1:");
    VERIFY_CONTAINS(log.lines()[0], "is not closed");
    QCOMPARE(chat.apply({{"user", "Hi"}}, true),
             std::string("<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
                         "<|start_header_id|>assistant<|end_header_id|>\n\n"));
  }
  {  // A template that fails on a plain conversation.
    const std::string failing = "{{ '<|im_start|>' + messages[0].content.nope() }}";
    std::vector<uint8_t> bytes;
    const gguf::GgufFile file =
        gguf_file(bytes, "qwen2", {"<|endoftext|>", "<|im_end|>"}, false, &failing);
    const LogCapture log;
    QVERIFY(ChatTemplate::from_gguf(file).family() == ChatTemplate::Family::ChatML);
    VERIFY_CONTAINS(log.lines().at(0), "while rendering a short user/assistant conversation");
  }
  {  // No template: the vocabulary's special tokens, else the architecture.
    std::vector<uint8_t> bytes;
    const gguf::GgufFile file = gguf_file(bytes, "llama", llama3_vocab, true, nullptr);
    QVERIFY(ChatTemplate::from_gguf(file).family() == ChatTemplate::Family::Llama3);
    std::vector<uint8_t> phi_bytes;
    const gguf::GgufFile phi = gguf_file(phi_bytes, "phi3", {"<s>", "</s>"}, false, nullptr);
    QVERIFY(ChatTemplate::from_gguf(phi).family() == ChatTemplate::Family::Phi3);
  }
  {  // Nothing to go by: an error naming the file and the formats we have.
    std::vector<uint8_t> bytes;
    const gguf::GgufFile file = gguf_file(bytes, "llama", {"<s>", "</s>"}, true, nullptr);
    const std::string error = error_of([&] { ChatTemplate::from_gguf(file); });
    VERIFY_CONTAINS(error,
                    "small.gguf: it has no chat template (metadata key tokenizer.chat_template)");
    VERIFY_CONTAINS(error, "chatml, llama3, gemma, mistral, phi3");
  }
}

// A template that renders {{ bos_token }} loses exactly one leading BOS text when the tokenizer
// adds BOS itself, and keeps it when the tokenizer does not.
void JinjaTest::no_double_bos() {
  const std::string text =
      "{{ bos_token }}{% for m in messages %}[{{ m.role }}] {{ m.content }}{{ eos_token }}"
      "{% endfor %}";
  const ChatTemplate adds = ChatTemplate::from_template_text(text, "t", {"<s>", "</s>", true});
  QCOMPARE(adds.apply({{"user", "Hi"}}, true), std::string("[user] Hi</s>"));
  const ChatTemplate keeps = ChatTemplate::from_template_text(text, "t", {"<s>", "</s>", false});
  QCOMPARE(keeps.apply({{"user", "Hi"}}, true), std::string("<s>[user] Hi</s>"));
  const ChatTemplate twice =
      ChatTemplate::from_template_text("{{ bos_token }}" + text, "t", {"<s>", "</s>", true});
  QCOMPARE(twice.apply({{"user", "Hi"}}, true), std::string("<s>[user] Hi</s>"));
  // Through a file: the token texts come from the vocabulary.
  std::vector<uint8_t> bytes;
  const gguf::GgufFile file = gguf_file(bytes, "llama", {"<|begin|>", "<|end|>"}, true, &text);
  QCOMPARE(ChatTemplate::from_gguf(file).apply({{"user", "Hi"}}, true),
           std::string("[user] Hi<|end|>"));
}

// The system prompt a template inserts when the conversation has none comes from rendering it.
void JinjaTest::default_system_prompt_found_by_rendering() {
  const std::string with_default =
      "{% for m in messages %}{% if loop.first and m.role != 'system' %}"
      "{{ '<|im_start|>system\\nYou are Pebble.<|im_end|>\\n' }}{% endif %}"
      "{{ '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' }}{% endfor %}";
  QCOMPARE(
      ChatTemplate::from_template_text(with_default, "t").default_system_prompt().value_or("-"),
      std::string("You are Pebble."));
  const std::string without =
      "{% for m in messages %}{{ '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' }}"
      "{% endfor %}";
  QVERIFY(!ChatTemplate::from_template_text(without, "t").default_system_prompt());
  const std::string refuses_system =
      "{% for m in messages %}{% if m.role == 'system' %}{{ raise_exception('no') }}{% endif %}"
      "{{ m.content }}{% endfor %}";
  QVERIFY(!ChatTemplate::from_template_text(refuses_system, "t").default_system_prompt());
}

QTEST_MAIN(JinjaTest)
#include "test_jinja.moc"
