// Tokenizer tests of the model families beyond SmolLM2 that need no model file: SentencePiece BPE
// on small vocabularies, and the byte-level pre-tokenizers `qwen2` / `deepseek-r1-qwen` /
// `tekken`. Golden values: tests/data/tokenizer_{sentencepiece,pre,bpe_families}_golden.json,
// written by tools/golden_tokenizer_families.py from HuggingFace tokenizers set up as each model
// (cross-checked there with Google's sentencepiece and transformers' GGUF conversion); the rest
// are worked out by hand from the algorithms in core/tokenizer/sentencepiece.h and
// pre_tokenizer.h.

#include <QtTest>
#include <functional>
#include <string>
#include <vector>

#include "core/gguf/gguf_writer.h"
#include "core/tokenizer/pre_tokenizer.h"
#include "core/tokenizer/utf8.h"
#include "tests/tokenizer/tokenizer_test.h"

using tokenfab::IncrementalDetokenizer;
using tokenfab::PreTokenizer;
using tokenfab::TokenId;
using tokenfab::Tokenizer;
using tokenfab::TokenizerVocab;
using tokenfab::TokenType;
using tokenfab::gguf::GgufFile;
using tokenfab::gguf::GgufWriter;
using tokenfab::gguf::Value;
using Ids = std::vector<TokenId>;
using Pieces = std::vector<std::string>;

namespace {

std::string to_std(const QJsonValue& v) {
  return v.toString().toStdString();
}

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

Pieces split(std::string_view text, PreTokenizer kind) {
  Pieces out;
  for (std::string_view piece : tokenfab::pre_tokenize(text, kind)) out.emplace_back(piece);
  return out;
}

// A SentencePiece vocabulary: every entry normal unless listed in `types`, scores falling with
// the id unless given.
TokenizerVocab sentencepiece_vocab(std::vector<std::string> tokens, std::vector<int32_t> types = {},
                                   std::vector<float> scores = {}) {
  TokenizerVocab v;
  v.source = "spm";
  v.model = "llama";
  v.tokens = std::move(tokens);
  v.token_types = types.empty() ? std::vector<int32_t>(v.tokens.size(), 1) : std::move(types);
  if (scores.empty()) {
    for (std::size_t i = 0; i < v.tokens.size(); ++i) scores.push_back(-static_cast<float>(i));
  }
  v.scores = std::move(scores);
  v.add_space_prefix = false;
  return v;
}

// The vocabulary of tests/data/tokenizer_sentencepiece_golden.json.
TokenizerVocab golden_sentencepiece_vocab(const QJsonObject& json) {
  TokenizerVocab v;
  v.source = "tokenizer_sentencepiece_golden.json";
  v.model = "llama";
  for (const QJsonValue& t : json.value("tokens").toArray()) v.tokens.push_back(to_std(t));
  for (const QJsonValue& s : json.value("scores").toArray())
    v.scores.push_back(static_cast<float>(s.toDouble()));
  for (const QJsonValue& t : json.value("token_types").toArray())
    v.token_types.push_back(t.toInt());
  v.bos = json.value("bos").toInt();
  v.eos = json.value("eos").toInt();
  v.unk = json.value("unk").toInt();
  v.add_space_prefix = json.value("add_space_prefix").toBool();
  return v;
}

// A GGUF file (in `bytes`) with a SentencePiece vocabulary of four tokens.
GgufFile sentencepiece_gguf(std::vector<uint8_t>& bytes, const std::string& pre,
                            std::optional<bool> add_space_prefix, bool with_scores = true) {
  GgufWriter w;
  w.add("general.architecture", Value::string("llama"));
  w.add("tokenizer.ggml.model", Value::string("llama"));
  if (!pre.empty()) w.add("tokenizer.ggml.pre", Value::string(pre));
  w.add("tokenizer.ggml.tokens", Value::string_array({"<unk>", "\xe2\x96\x81", "a",
                                                      "\xe2\x96\x81"
                                                      "a"}));
  if (with_scores) {
    w.add("tokenizer.ggml.scores",
          Value::array(tokenfab::gguf::ValueType::Float32,
                       {Value::f32(0), Value::f32(-1), Value::f32(-2), Value::f32(-3)}));
  }
  w.add("tokenizer.ggml.token_type",
        Value::array(tokenfab::gguf::ValueType::Int32,
                     {Value::i32(2), Value::i32(1), Value::i32(1), Value::i32(1)}));
  w.add("tokenizer.ggml.unknown_token_id", Value::u32(0));
  if (add_space_prefix) w.add("tokenizer.ggml.add_space_prefix", Value::boolean(*add_space_prefix));
  bytes = w.to_bytes();
  return GgufFile::parse(bytes, "spm.gguf");
}

}  // namespace

// tests/data/tokenizer_pre_golden.json: HF tokenizers' Split(Regex(pattern)) splits of our strings.
void TokenizerTest::pre_tokenizer_goldens() {
  const QJsonObject doc = load_test_json("tokenizer_pre_golden.json");
  const QJsonArray cases = doc.value("cases").toArray();
  QVERIFY(cases.size() >= 60);
  for (const QJsonValue& value : cases) {
    const QJsonObject c = value.toObject();
    const std::optional<PreTokenizer> kind = tokenfab::pre_tokenizer_from_name(to_std(c["pre"]));
    QVERIFY(kind);
    Pieces expected;
    for (const QJsonValue& piece : c.value("pieces").toArray()) expected.push_back(to_std(piece));
    const std::string text = to_std(c.value("text"));
    if (split(text, *kind) != expected) {
      QFAIL(qPrintable(QString("%1: %2").arg(c["pre"].toString(), c["text"].toString())));
    }
  }
  QVERIFY(tokenfab::pre_tokenizer_from_name("deepseek-r1-qwen") == PreTokenizer::kQwen2);
}

// Where the Tekken pattern's two word alternatives differ from \p{L}+ (expected by hand from the
// pattern in pre_tokenizer.h).
void TokenizerTest::pre_tokenizer_tekken_cases() {
  const PreTokenizer k = PreTokenizer::kTekken;
  // Upper case then lower case: a capital starts a word.
  QCOMPARE(split("CamelCase HTTPServer", k), (Pieces{"Camel", "Case", " HTTPServer"}));
  QCOMPARE(split("aBC", k), (Pieces{"a", "BC"}));
  // Lo is in both sets: the upper run gives its last character back to the lower part.
  QCOMPARE(split("\xe4\xb8\xad"
                 "A",
                 k),
           (Pieces{"\xe4\xb8\xad", "A"}));  // 中A
  QCOMPARE(split("A\xe4\xb8\xad"
                 "B",
                 k),
           (Pieces{"A\xe4\xb8\xad", "B"}));
  // Marks (here U+0301) are in both sets, so they join either part of a word.
  QCOMPARE(split("e\xcc\x81t\xc3\xa9", k), (Pieces{"e\xcc\x81t\xc3\xa9"}));
  QCOMPARE(split(" \xcc\x81x", k), (Pieces{" \xcc\x81x"}));
  // Digits one at a time; slashes and newlines trail a run of symbols.
  QCOMPARE(split("x2024", k), (Pieces{"x", "2", "0", "2", "4"}));
  QCOMPARE(split("a/b//\n/c", k), (Pieces{"a", "/b", "//\n/", "c"}));
  QCOMPARE(split("don't", k), (Pieces{"don", "'t"}));
  QCOMPARE(split("", k), Pieces{});
  QCOMPARE(split("\xff"
                 "a\xfe",
                 k),
           (Pieces{"\xff"
                   "a",
                   "\xfe"}));  // invalid bytes are "other"
  QCOMPARE(split("12345", PreTokenizer::kQwen2), (Pieces{"1", "2", "3", "4", "5"}));
}

// tests/data/tokenizer_bpe_families_golden.json: a small byte-level BPE vocabulary (trained by HF
// tokenizers) with each new `pre`; ids from HF tokenizers.
void TokenizerTest::bpe_families_golden_ids() {
  const QJsonObject doc = load_test_json("tokenizer_bpe_families_golden.json");
  const QJsonObject vocab = doc.value("vocab").toObject();
  TokenizerVocab v;
  v.source = "tokenizer_bpe_families_golden.json";
  for (const QJsonValue& t : vocab.value("tokens").toArray()) v.tokens.push_back(to_std(t));
  for (const QJsonValue& m : vocab.value("merges").toArray()) v.merges.push_back(to_std(m));
  for (const QJsonValue& t : vocab.value("token_types").toArray())
    v.token_types.push_back(t.toInt());
  const QJsonArray cases = doc.value("cases").toArray();
  QVERIFY(cases.size() >= 24);
  for (const char* pre : {"qwen2", "deepseek-r1-qwen", "tekken"}) {
    v.pre = pre;
    const Tokenizer tok = Tokenizer::from_vocab(v);
    QJsonArray mine;
    for (const QJsonValue& c : cases) {
      if (c.toObject().value("pre").toString() == pre) mine.append(c);
    }
    QVERIFY(mine.size() >= 8);
    const QString mismatch = first_golden_mismatch(tok, mine);
    QVERIFY2(mismatch.isEmpty(), qPrintable(QString(pre) + ": " + mismatch));
  }
}

// tests/data/tokenizer_sentencepiece_golden.json: a SentencePiece BPE vocabulary with byte
// fallback and add_space_prefix (Llama 2 / Mistral / Phi-3 style); ids from HF tokenizers.
void TokenizerTest::sentencepiece_golden_ids() {
  const QJsonObject doc = load_test_json("tokenizer_sentencepiece_golden.json");
  const Tokenizer tok = Tokenizer::from_vocab(golden_sentencepiece_vocab(doc["vocab"].toObject()));
  QVERIFY(tok.add_space_prefix());
  const QJsonArray cases = doc.value("cases").toArray();
  QVERIFY(cases.size() >= 20);
  const QString mismatch = first_golden_mismatch(tok, cases);
  QVERIFY2(mismatch.isEmpty(), qPrintable(mismatch));
  // Text that no special token splits comes back, the prefix space dropped again.
  for (const QJsonValue& c : cases) {
    const std::string text = to_std(c.toObject().value("text"));
    if (contains(text, "<")) continue;
    QCOMPARE(tok.decode(tok.encode(text, false, false)), text);
  }
}

// Merging goes by the score of the merged piece, the leftmost pair among equals; control and
// unused tokens are never merged into.
void TokenizerTest::sentencepiece_merge_order() {
  {
    // ab scores above bc: (a b) c.
    const Tokenizer t = Tokenizer::from_vocab(sentencepiece_vocab({"a", "b", "c", "ab", "bc"}));
    QCOMPARE(t.encode("abc", false, false), (Ids{3, 2}));
  }
  {
    // bc scores above ab: a (b c), then abc.
    const Tokenizer t = Tokenizer::from_vocab(
        sentencepiece_vocab({"a", "b", "c", "ab", "bc", "abc"}, {}, {0, 0, 0, -3, -1, -5}));
    QCOMPARE(t.encode("abc", false, false), Ids{5});
    QCOMPARE(t.encode("abcab", false, false), (Ids{5, 3}));
  }
  {
    // Equal scores: the leftmost pair first.
    const Tokenizer t = Tokenizer::from_vocab(sentencepiece_vocab({"a", "aa"}));
    QCOMPARE(t.encode("aaa", false, false), (Ids{1, 0}));
    QCOMPARE(t.encode("aaaa", false, false), (Ids{1, 1}));
  }
  {
    // Spaces are "▁"; with add_space_prefix one opens the text; merges cross "▁" freely.
    TokenizerVocab v = sentencepiece_vocab({"\xe2\x96\x81", "a", "b",
                                            "\xe2\x96\x81"
                                            "a",
                                            "\xe2\x96\x81"
                                            "b",
                                            "a\xe2\x96\x81"});
    QCOMPARE(Tokenizer::from_vocab(v).encode("a b", false, false), (Ids{1, 4}));
    v.add_space_prefix = true;
    QCOMPARE(Tokenizer::from_vocab(v).encode("a b", false, false), (Ids{3, 4}));
    QCOMPARE(Tokenizer::from_vocab(v).encode(" a", false, false), (Ids{0, 3}));
    v.add_space_prefix.reset();  // absent: true for SentencePiece vocabularies
    QVERIFY(Tokenizer::from_vocab(v).add_space_prefix());
  }
  {
    // <x> is a control token and ~ an unused one: never produced by merging.
    const Tokenizer t = Tokenizer::from_vocab(
        sentencepiece_vocab({"<", "x", ">", "<x", "<x>", "~", "~~"}, {1, 1, 1, 1, 3, 1, 5}));
    QCOMPARE(t.encode("<x>", false, false), (Ids{3, 2}));
    QCOMPARE(t.encode("<x>", false, true), Ids{4});
    QCOMPARE(t.encode("~~", false, false), (Ids{5, 5}));
  }
  {
    // User-defined tokens are matched whole, always; add_space_prefix opens the text after them.
    TokenizerVocab v = sentencepiece_vocab({"\xe2\x96\x81", "a", "<t>",
                                            "\xe2\x96\x81"
                                            "a"},
                                           {1, 1, 4, 1});
    v.add_space_prefix = true;
    QCOMPARE(Tokenizer::from_vocab(v).encode("a<t>a", false, false), (Ids{3, 2, 3}));
  }
}

// A character without a token becomes its <0xNN> tokens; without those, the unknown token (once
// for a run of such characters), or nothing when there is no unknown token either.
void TokenizerTest::sentencepiece_byte_fallback_and_unknown() {
  {
    TokenizerVocab v =
        sentencepiece_vocab({"<unk>", "a", "<0xC3>", "<0xA9>", "<0xFF>"}, {2, 1, 6, 6, 6});
    v.unk = 0;
    const Tokenizer t = Tokenizer::from_vocab(v);
    QCOMPARE(t.encode("a\xc3\xa9"
                      "a",
                      false, false),
             (Ids{1, 2, 3, 1}));                       // aéa
    QCOMPARE(t.encode("\xff", false, false), Ids{4});  // an invalid byte
    QCOMPARE(t.decode(Ids{1, 2, 3}), std::string("a\xc3\xa9"));
    // The text of a byte token is no byte token: here six characters without tokens.
    QCOMPARE(t.encode("<0xC3>", false, false), Ids{0});
  }
  {
    TokenizerVocab v = sentencepiece_vocab({"<unk>", "a"}, {2, 1});
    v.unk = 0;
    const Tokenizer t = Tokenizer::from_vocab(v);
    QCOMPARE(t.encode("a\xc3\xa9\xc3\xa9"
                      "a\xc3\xa9",
                      false, false),
             (Ids{1, 0, 1, 0}));
    v.unk = -1;
    QCOMPARE(Tokenizer::from_vocab(v).encode("a\xc3\xa9"
                                             "a",
                                             false, false),
             (Ids{1, 1}));
  }
}

// "▁" decodes to a space; decode() drops the one space add_space_prefix opened the text with, the
// incremental detokenizer (a continuation) keeps it.
void TokenizerTest::sentencepiece_decode() {
  TokenizerVocab v = sentencepiece_vocab({"<s>", "\xe2\x96\x81", "a",
                                          "\xe2\x96\x81"
                                          "a",
                                          "<0xE2>", "<0x82>", "<0xAC>"},
                                         {3, 1, 1, 1, 6, 6, 6});
  v.bos = 0;
  v.add_space_prefix = true;
  const Tokenizer t = Tokenizer::from_vocab(v);
  QCOMPARE(t.encode("a a", true, false), (Ids{0, 3, 3}));
  QCOMPARE(t.decode(Ids{0, 3, 3}, false), std::string("a a"));
  QCOMPARE(t.decode(Ids{0, 3, 3}, true), std::string("<s> a a"));
  QCOMPARE(t.decode(Ids{1, 1, 2}), std::string(" a"));
  QCOMPARE(t.decode(t.encode("  a", false, false)), std::string("  a"));
  QCOMPARE(t.decode(Ids{}), std::string());

  IncrementalDetokenizer d(t);
  QCOMPARE(d.push(3), std::string(" a"));
  QCOMPARE(d.push(4), std::string());
  QCOMPARE(d.push(5), std::string());
  QCOMPARE(d.push(6), std::string("\xe2\x82\xac"));  // €
  QCOMPARE(d.push(4), std::string());
  QCOMPARE(d.flush(), std::string("\xef\xbf\xbd"));

  v.add_space_prefix = false;
  QCOMPARE(Tokenizer::from_vocab(v).decode(Ids{3, 3}), std::string(" a a"));
}

// The GGUF path: scores, token types, add_space_prefix (absent: true) and `pre`.
void TokenizerTest::sentencepiece_from_gguf() {
  std::vector<uint8_t> bytes;
  {
    const Tokenizer t = Tokenizer::from_gguf(sentencepiece_gguf(bytes, "", std::nullopt));
    QCOMPARE(t.model(), std::string("llama"));
    QVERIFY(t.add_space_prefix());
    QCOMPARE(t.encode("a", false, false), Ids{3});
    QCOMPARE(t.encode("\xc3\xa9", false, false), (Ids{1, 0}));  // no byte tokens: unknown
  }
  {
    const Tokenizer t = Tokenizer::from_gguf(sentencepiece_gguf(bytes, "default", false));
    QVERIFY(!t.add_space_prefix());
    QCOMPARE(t.encode("a a", false, false), (Ids{2, 3}));
    QCOMPARE(t.token_type(0), TokenType::kUnknown);
  }
  const std::string no_scores =
      error_of([&] { Tokenizer::from_gguf(sentencepiece_gguf(bytes, "default", true, false)); });
  QVERIFY2(contains(no_scores, "spm.gguf") && contains(no_scores, "tokenizer.ggml.scores"),
           no_scores.c_str());
  const std::string bad_pre =
      error_of([&] { Tokenizer::from_gguf(sentencepiece_gguf(bytes, "llama-bpe", true)); });
  QVERIFY2(contains(bad_pre, "spm.gguf") &&
               contains(bad_pre,
                        "unsupported pre-tokenizer llama-bpe for tokenizer model llama "
                        "(supported: default)"),
           bad_pre.c_str());
}

void TokenizerTest::unsupported_sentencepiece_vocab() {
  const std::string scores = error_of([] {
    TokenizerVocab v = sentencepiece_vocab({"a", "b"});
    v.scores.pop_back();
    Tokenizer::from_vocab(v);
  });
  QVERIFY2(contains(scores, "tokenizer.ggml.scores has 1 entries"), scores.c_str());
  const std::string byte_token = error_of([] {
    Tokenizer::from_vocab(sentencepiece_vocab({"a", "<0xZZ>"}, {1, 6}));
  });
  QVERIFY2(contains(byte_token, "<0xZZ>") && contains(byte_token, "<0xNN>"), byte_token.c_str());
}
