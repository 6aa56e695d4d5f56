// Tokenizer tests that need no model file: pre-tokenizer splits, UTF-8 handling, BPE on tiny
// hand-made vocabularies, chat template recognition and error messages.

#include <QtTest>
#include <functional>
#include <string>
#include <vector>

#include "core/gguf/gguf_writer.h"
#include "core/tokenizer/byte_level.h"
#include "core/tokenizer/chat_template.h"
#include "core/tokenizer/pre_tokenizer.h"
#include "core/tokenizer/utf8.h"
#include "tests/tokenizer/tokenizer_test.h"

using tokenfab::ChatTemplate;
using tokenfab::IncrementalDetokenizer;
using tokenfab::PreTokenizer;
using tokenfab::TokenId;
using tokenfab::Tokenizer;
using tokenfab::TokenizerVocab;
using tokenfab::gguf::GgufFile;
using tokenfab::gguf::GgufWriter;
using tokenfab::gguf::Value;
using Pieces = std::vector<std::string>;

namespace {

Pieces split(std::string_view text, PreTokenizer kind) {
  Pieces out;
  for (std::string_view piece : tokenfab::pre_tokenize(text, kind)) out.emplace_back(piece);
  return out;
}

// The message of the tokenfab::Error `f` throws, or "" when it throws none.
std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const tokenfab::Error& e) {
    return e.what();
  }
  return {};
}

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

// The vocabulary entry of a string of bytes (byte-level mapped).
std::string mapped(std::string_view bytes) {
  std::string out;
  for (char c : bytes) out += tokenfab::byte_level::byte_to_text(static_cast<uint8_t>(c));
  return out;
}

TokenizerVocab tiny_vocab(std::vector<std::string> tokens, std::vector<std::string> merges) {
  TokenizerVocab v;
  v.source = "tiny";
  v.tokens = std::move(tokens);
  v.merges = std::move(merges);
  return v;
}

// A GGUF file (in `bytes`) holding the given tokenizer metadata.
GgufFile gguf_with(std::vector<uint8_t>& bytes, const std::string& model, const std::string& pre,
                   const std::string* chat_template = nullptr) {
  GgufWriter w;
  w.add("general.architecture", Value::string("llama"));
  w.add("tokenizer.ggml.model", Value::string(model));
  w.add("tokenizer.ggml.pre", Value::string(pre));
  w.add("tokenizer.ggml.tokens", Value::string_array({"a", "b", "ab"}));
  w.add("tokenizer.ggml.merges", Value::string_array({"a b"}));
  if (chat_template) w.add("tokenizer.chat_template", Value::string(*chat_template));
  bytes = w.to_bytes();
  return GgufFile::parse(bytes, "tiny.gguf");
}

}  // namespace

// Expected splits follow the regexes in pre_tokenizer.h; checked against HuggingFace tokenizers'
// ByteLevel / Digits / Split pre-tokenizers when written.
void TokenizerTest::pre_tokenizer_gpt2() {
  const PreTokenizer k = PreTokenizer::kGpt2;
  QCOMPARE(split("Hello world's 12345 ABC'S", k),
           (Pieces{"Hello", " world", "'s", " 12345", " ABC", "'", "S"}));
  QCOMPARE(split("a   b\n\n\tc", k), (Pieces{"a", "  ", " b", "\n\n", "\t", "c"}));
  QCOMPARE(split("x  ", k), (Pieces{"x", "  "}));
  QCOMPARE(split("a  1", k), (Pieces{"a", " ", " 1"}));
  QCOMPARE(split("it'll  \t x", k), (Pieces{"it", "'ll", "  \t", " x"}));
  QCOMPARE(split("١٢٣ Ⅻ½ x²y", k), (Pieces{"١٢٣", " Ⅻ½", " x", "²", "y"}));
  QCOMPARE(split("", k), Pieces{});
  QVERIFY(tokenfab::pre_tokenizer_from_name("default") == PreTokenizer::kGpt2);
}

void TokenizerTest::pre_tokenizer_smollm() {
  const PreTokenizer k = PreTokenizer::kSmolLM;
  QCOMPARE(split("Hello world's 12345 ABC'S", k),
           (Pieces{"Hello", " world", "'s", " ", "1", "2", "3", "4", "5", " ABC", "'", "S"}));
  QCOMPARE(split("abc123 4.5", k), (Pieces{"abc", "1", "2", "3", " ", "4", ".", "5"}));
  // The whitespace before a digit ends its own segment, so it is not split.
  QCOMPARE(split("a  1", k), (Pieces{"a", "  ", "1"}));
  QCOMPARE(split("١٢٣ Ⅻ½ x²y", k), (Pieces{"١", "٢", "٣", " ", "Ⅻ", "½", " x", "²", "y"}));
  QCOMPARE(split("a   b\n\n\tc", k), (Pieces{"a", "  ", " b", "\n\n", "\t", "c"}));
  QVERIFY(tokenfab::pre_tokenizer_from_name("smollm") == PreTokenizer::kSmolLM);
}

void TokenizerTest::pre_tokenizer_llama3() {
  const PreTokenizer k = PreTokenizer::kLlama3;
  QCOMPARE(split("Hello world's 12345 ABC'S", k),
           (Pieces{"Hello", " world", "'s", " ", "123", "45", " ABC", "'S"}));
  QCOMPARE(split("a\n\n  b", k), (Pieces{"a", "\n\n", " ", " b"}));
  QCOMPARE(split("x!!\n\ny", k), (Pieces{"x", "!!\n\n", "y"}));
  QCOMPARE(split("#hash", k), (Pieces{"#hash"}));
  QCOMPARE(split("I'LL", k), (Pieces{"I", "'LL"}));
  QCOMPARE(split(" \t\n x", k), (Pieces{" \t\n", " x"}));
  QCOMPARE(split("1234567", k), (Pieces{"123", "456", "7"}));
  QCOMPARE(split("tab\tword  \n", k), (Pieces{"tab", "\tword", "  \n"}));
  QCOMPARE(split("don't", k), (Pieces{"don", "'t"}));
  QVERIFY(tokenfab::pre_tokenizer_from_name("llama-bpe") == PreTokenizer::kLlama3);
  QVERIFY(!tokenfab::pre_tokenizer_from_name("gpt-4o"));
}

void TokenizerTest::pre_tokenizer_invalid_utf8() {
  QCOMPARE(split("a\377b", PreTokenizer::kGpt2), (Pieces{"a", "\xff", "b"}));
  QCOMPARE(split("a\377b", PreTokenizer::kSmolLM), (Pieces{"a", "\xff", "b"}));
  // Llama 3 lets one non-letter lead a word: [^\r\n\p{L}\p{N}]?\p{L}+
  QCOMPARE(split("a\377b", PreTokenizer::kLlama3), (Pieces{"a", "\377b"}));
  for (PreTokenizer k : {PreTokenizer::kGpt2, PreTokenizer::kSmolLM, PreTokenizer::kLlama3}) {
    QCOMPARE(split(" \xff\xfe!", k), (Pieces{" \xff\xfe!"}));
    const std::string text = "x\xe2\x82 \xc0\xaf\xed\xa0\x80 y\xf0\x9f";
    std::string joined;
    for (const std::string& piece : split(text, k)) joined += piece;
    QCOMPARE(joined, text);
  }
}

void TokenizerTest::utf8_decode() {
  using tokenfab::utf8::Status;
  auto check = [](std::string_view bytes, Status status, uint32_t length, uint32_t cp = 0) {
    const tokenfab::utf8::Step step = tokenfab::utf8::decode(bytes);
    QCOMPARE(int(step.status), int(status));
    QCOMPARE(step.length, length);
    if (status == Status::kValid) QCOMPARE(step.cp, cp);
  };
  check("A", Status::kValid, 1, 'A');
  check("\xc3\xa9", Status::kValid, 2, 0xE9);
  check("\xf0\x9f\x9a\x80", Status::kValid, 4, 0x1F680);
  check("\xe2\x82", Status::kIncomplete, 2);
  check("\xe2\x28", Status::kInvalid, 1);
  check("\xc0\xaf", Status::kInvalid, 1);          // overlong
  check("\xed\xa0\x80", Status::kInvalid, 1);      // surrogate
  check("\xf4\x90\x80\x80", Status::kInvalid, 1);  // above U+10FFFF
  check("\342\202A", Status::kInvalid, 2);         // a broken sequence is replaced as one
  QCOMPARE(tokenfab::utf8::complete_prefix_length("ab\xf0\x9f\x9a"), std::size_t(2));
  QCOMPARE(tokenfab::utf8::complete_prefix_length("ab\xe2\x82\xac"), std::size_t(5));
  QCOMPARE(tokenfab::utf8::complete_prefix_length("ab\xff"), std::size_t(3));
  std::string sanitized;
  tokenfab::utf8::append_sanitized(sanitized, "a\377b\342\202");
  QCOMPARE(sanitized, std::string("a\357\277\275b\357\277\275"));
}

// Merges apply by rank, not by position; equal ranks go to the leftmost pair.
void TokenizerTest::bpe_merge_order() {
  {
    const Tokenizer t = Tokenizer::from_vocab(
        tiny_vocab({"a", "b", "c", "ab", "bc", "abc"}, {"b c", "a b", "a bc"}));
    QCOMPARE(t.encode("abc", false, false), std::vector<TokenId>{5});  // (a (b c))
    QCOMPARE(t.encode("ab", false, false), std::vector<TokenId>{3});
  }
  {
    const Tokenizer t =
        Tokenizer::from_vocab(tiny_vocab({"a", "b", "c", "ab", "bc", "abc"}, {"a b", "b c"}));
    QCOMPARE(t.encode("abc", false, false), (std::vector<TokenId>{3, 2}));  // (a b) c
  }
  {
    const Tokenizer t = Tokenizer::from_vocab(tiny_vocab({"a", "aa", "aaaa"}, {"a a", "aa aa"}));
    QCOMPARE(t.encode("aaa", false, false), (std::vector<TokenId>{1, 0}));
    QCOMPARE(t.encode("aaaa", false, false), std::vector<TokenId>{2});
    QCOMPARE(t.encode("aaaaa", false, false), (std::vector<TokenId>{2, 0}));
  }
  {
    // Words do not merge across pre-token boundaries; " b" is "Ġb" in the vocabulary.
    const Tokenizer t = Tokenizer::from_vocab(
        tiny_vocab({"a", "b", mapped(" "), mapped(" b")}, {mapped(" ") + " b"}));
    QCOMPARE(t.encode("a b", false, false), (std::vector<TokenId>{0, 3}));
    QCOMPARE(t.decode(std::vector<TokenId>{0, 3}), std::string("a b"));
  }
  {
    // llama-bpe takes a word that is a whole vocab entry as is, merges or not (ignore_merges).
    TokenizerVocab v = tiny_vocab({"a", "b", "ab"}, {});
    QCOMPARE(Tokenizer::from_vocab(v).encode("ab", false, false), (std::vector<TokenId>{0, 1}));
    v.pre = "llama-bpe";
    QCOMPARE(Tokenizer::from_vocab(v).encode("ab", false, false), std::vector<TokenId>{2});
  }
}

void TokenizerTest::tiny_vocab_specials() {
  TokenizerVocab v = tiny_vocab({"<", "s", ">", "t", "o", "l", "<s>", "<ss>", "<tool>", "x"}, {});
  v.token_types = {1, 1, 1, 1, 1, 1, 3, 3, 4, 1};
  v.eos = 6;
  v.eot = 7;
  const Tokenizer t = Tokenizer::from_vocab(v);
  // Control tokens only with parse_special; the longest match wins.
  QCOMPARE(t.encode("x<ss>x", false, true), (std::vector<TokenId>{9, 7, 9}));
  QCOMPARE(t.encode("x<s>", false, true), (std::vector<TokenId>{9, 6}));
  QCOMPARE(t.encode("<s>", false, false), (std::vector<TokenId>{0, 1, 2}));
  // User-defined tokens are always whole.
  QCOMPARE(t.encode("x<tool>", false, false), (std::vector<TokenId>{9, 8}));
  QCOMPARE(t.decode(std::vector<TokenId>{9, 6, 8}, false), std::string("x<tool>"));
  QCOMPARE(t.decode(std::vector<TokenId>{9, 6, 8}, true), std::string("x<s><tool>"));
  QVERIFY(t.is_special(6) && t.is_special(8) && !t.is_special(0));
  QVERIFY(t.is_end_of_generation(6) && t.is_end_of_generation(7));  // eos and eot_token_id
  QVERIFY(!t.is_end_of_generation(8));
  QVERIFY(contains(error_of([&] {
                     TokenizerVocab bad = v;
                     bad.token_types.pop_back();
                     Tokenizer::from_vocab(bad);
                   }),
                   "tokenizer.ggml.token_type"));
  QVERIFY(contains(error_of([&] {
                     TokenizerVocab bad = v;
                     bad.bos = 10;
                     Tokenizer::from_vocab(bad);
                   }),
                   "tokenizer.ggml.bos_token_id"));
}

void TokenizerTest::detokenizer_holds_back_incomplete() {
  // "€" is E2 82 AC; each byte is a token here.
  const Tokenizer t = Tokenizer::from_vocab(
      tiny_vocab({mapped("\xe2"), mapped("\x82"), mapped("\xac"), "a", mapped("\xff")}, {}));
  IncrementalDetokenizer d(t);
  QCOMPARE(d.push(0), std::string());
  QCOMPARE(d.push(1), std::string());
  QCOMPARE(d.push(2), std::string("\xe2\x82\xac"));
  QCOMPARE(d.push(4), std::string("\xef\xbf\xbd"));  // can never complete: replaced at once
  QCOMPARE(d.push(0), std::string());
  QCOMPARE(d.push(3), std::string("\357\277\275a"));
  QCOMPARE(d.push(0), std::string());
  QCOMPARE(d.flush(), std::string("\xef\xbf\xbd"));
  QCOMPARE(d.flush(), std::string());
}

void TokenizerTest::chat_template_text() {
  const std::string plain =
      "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + "
      "message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}"
      "{{ '<|im_start|>assistant\n' }}{% endif %}";
  const ChatTemplate chatml = ChatTemplate::from_template_text(plain, "plain");
  QVERIFY(!chatml.default_system_prompt());
  QCOMPARE(chatml.apply({{"user", "Hi"}}, true),
           std::string("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"));
  QCOMPARE(chatml.apply({}, true), std::string("<|im_start|>assistant\n"));

  // Qwen2 writes the newline as a Jinja escape and takes a system message from the conversation.
  const std::string qwen =
      "{%- if messages[0]['role'] == 'system' %}{{- '<|im_start|>system\\n' + "
      "messages[0]['content'] + '<|im_end|>\\n' }}{%- else %}{{- '<|im_start|>system\\nYou are "
      "Qwen, created by Alibaba Cloud. You\\'re helpful.<|im_end|>\\n' }}{%- endif %}";
  QCOMPARE(ChatTemplate::from_template_text(qwen, "qwen").default_system_prompt().value_or(""),
           std::string("You are Qwen, created by Alibaba Cloud. You're helpful."));

  // A template that fails on a plain conversation, or does not parse, is refused, naming its
  // source, the position and the problem (from_gguf then falls back to a built-in format).
  const std::string llama3 =
      "{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n' }}";
  const std::string error = error_of([&] { ChatTemplate::from_template_text(llama3, "x.gguf"); });
  QVERIFY2(contains(error, "x.gguf:1:") && contains(error, "'message' is undefined"),
           error.c_str());
  QVERIFY(contains(error_of([] { ChatTemplate::from_template_text("{% if x %}", "y"); }),
                   "y:1:11: unexpected end of template"));
}

void TokenizerTest::unsupported_tokenizer_model() {
  std::vector<uint8_t> bytes;
  const GgufFile file = gguf_with(bytes, "t5", "default");
  const std::string error = error_of([&] { Tokenizer::from_gguf(file); });
  QVERIFY2(contains(error, "tiny.gguf") &&
               contains(error, "unsupported tokenizer model t5 (supported: gpt2, llama)"),
           error.c_str());
  QVERIFY(contains(error_of([] {
                     TokenizerVocab v = tiny_vocab({"a"}, {});
                     v.model = "bert";
                     Tokenizer::from_vocab(v);
                   }),
                   "unsupported tokenizer model bert"));
}

void TokenizerTest::unsupported_pre_tokenizer() {
  std::vector<uint8_t> bytes;
  const GgufFile file = gguf_with(bytes, "gpt2", "gpt-4o");
  const std::string error = error_of([&] { Tokenizer::from_gguf(file); });
  QVERIFY2(contains(error, "tiny.gguf") && contains(error, "unsupported pre-tokenizer gpt-4o") &&
               contains(error, "supported: default, gpt-2, smollm, llama-bpe, qwen2, "
                               "deepseek-r1-qwen, tekken"),
           error.c_str());
  // The same file with a supported pre-tokenizer loads.
  std::vector<uint8_t> good_bytes;
  const GgufFile good = gguf_with(good_bytes, "gpt2", "smollm");
  QCOMPARE(Tokenizer::from_gguf(good).encode("ab", false, false), std::vector<TokenId>{2});
}

void TokenizerTest::missing_chat_template() {
  std::vector<uint8_t> bytes;
  const GgufFile none = gguf_with(bytes, "gpt2", "default");
  const std::string error = error_of([&] { ChatTemplate::from_gguf(none); });
  QVERIFY2(contains(error, "tiny.gguf") && contains(error, "tokenizer.chat_template"),
           error.c_str());
  // A template that cannot be used: the built-in format of the family its text names.
  const std::string gemma = "{{ '<start_of_turn>user\n' + message['content'] }}";
  std::vector<uint8_t> gemma_bytes;
  const GgufFile other = gguf_with(gemma_bytes, "gpt2", "default", &gemma);
  QVERIFY(ChatTemplate::from_gguf(other).family() == ChatTemplate::Family::Gemma);
}
