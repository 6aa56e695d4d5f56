// Tokenizer tests against Gemma 3 270M's SentencePiece vocabulary (262,144 tokens, byte fallback,
// no prefix space). Golden ids: tests/data/tokenizer_gemma3_golden.json, written by
// tools/golden_tokenizer_families.py from HuggingFace tokenizers set up as SentencePiece BPE over
// the file's vocabulary, cross-checked there with Google's sentencepiece and transformers' GGUF
// conversion.

#include <QtTest>
#include <string>
#include <vector>

#include "core/tokenizer/utf8.h"
#include "tests/common/gemma3_model.h"
#include "tests/tokenizer/tokenizer_test.h"

using tokenfab::IncrementalDetokenizer;
using tokenfab::TokenId;
using tokenfab::Tokenizer;
using tokenfab::TokenType;
using Ids = std::vector<TokenId>;

namespace {

// Text of several scripts and shapes, including characters Gemma has no token for.
const char* const kGemmaText[] = {
    "Hello, world! It's 2024 and we're decoding at 1,000 tokens/s.",
    "  leading, trailing and   inner   spaces\t\ttabs\r\n\n\n",
    "안녕하세요 세계. 한국어 텍스트도 잘 됩니다! 中文、日本語",
    "Emoji: 👍🏽 🚀 👨‍👩‍👧‍👦 🇰🇷 ❤️ 𝔘𝔫𝔦𝔠𝔬𝔡𝔢",
    "rare: \xf0\xa0\x80\x80\xf0\xaa\x9b\x96 \xf3\xa0\x81\x81 end",  // U+20000 U+2A6D6 U+E0041
    "int main() {\n  std::printf(\"%d\\n\", 42);\n  return 0;\n}\n",
    "<start_of_turn>user\nnot parsed unless asked<end_of_turn>\n",
};

}  // namespace

// Loads Gemma 3 270M's tokenizer into gemma3_ (once), or fails the test naming the missing file.
#define REQUIRE_GEMMA3()                                                                   \
  do {                                                                                     \
    if (!gemma3_) {                                                                        \
      std::filesystem::path gemma3_path_;                                                  \
      TOKENFAB_GEMMA3_MODEL_PATH(gemma3_path_);                                            \
      gemma3_.emplace(Tokenizer::from_gguf(tokenfab::gguf::GgufFile::open(gemma3_path_))); \
    }                                                                                      \
  } while (false)

void TokenizerTest::gemma3_metadata() {
  REQUIRE_GEMMA3();
  const Tokenizer& tok = *gemma3_;
  QCOMPARE(tok.n_vocab(), 262144);
  QCOMPARE(tok.model(), std::string("llama"));
  QCOMPARE(tok.pre_tokenizer(), std::string("default"));
  QVERIFY(!tok.add_space_prefix());
  QCOMPARE(tok.bos_id(), 2);
  QCOMPARE(tok.eos_id(), 1);
  QVERIFY(tok.add_bos_token());
  QCOMPARE(tok.token_text(1902), std::string("\xe2\x96\x81world"));
  QCOMPARE(tok.token_bytes(1902), std::string(" world"));
  QCOMPARE(tok.token_type(238 + 0x41), TokenType::kByte);
  QCOMPARE(tok.token_bytes(238 + 0x41), std::string("A"));  // <0x41>
  QCOMPARE(tok.token_type(105), TokenType::kControl);       // <start_of_turn>
  QCOMPARE(tok.token_type(138), TokenType::kUserDefined);   // two spaces
  QCOMPARE(tok.encode("Hello world", /*add_bos=*/true, false), (Ids{2, 9259, 1902}));
}

// tests/data/tokenizer_gemma3_golden.json: see tools/golden_tokenizer_families.py.
void TokenizerTest::gemma3_golden_ids() {
  REQUIRE_GEMMA3();
  const QJsonArray cases = load_test_json("tokenizer_gemma3_golden.json").value("cases").toArray();
  QVERIFY(cases.size() >= 30);
  const QString mismatch = first_golden_mismatch(*gemma3_, cases);
  QVERIFY2(mismatch.isEmpty(), qPrintable(mismatch));
}

// Every byte has a <0xNN> token, so any bytes at all, invalid UTF-8 included, come back.
void TokenizerTest::gemma3_round_trip() {
  REQUIRE_GEMMA3();
  const Tokenizer& tok = *gemma3_;
  for (const char* text : kGemmaText) {
    QCOMPARE(tok.decode(tok.encode(text, false, false)), std::string(text));
  }
  const std::string invalid[] = {"\x80\xbf", "truncated \xe2\x82", "surrogate \xed\xa0\x80",
                                 std::string("nul \0 byte", 10), "mixed 한\xed\x95 국어"};
  for (const std::string& text : invalid) {
    QCOMPARE(tok.decode(tok.encode(text, false, true)), text);
  }
  for (int b = 0; b < 256; ++b) {
    std::string text = "x";
    text += static_cast<char>(b);
    text += 'y';
    QCOMPARE(tok.decode(tok.encode(text, false, false)), text);
  }
  // Parsed special tokens come back as their text when rendered, and not otherwise.
  const std::string chat = "<start_of_turn>user\nHi<end_of_turn>\n";
  const Ids ids = tok.encode(chat, false, true);
  QCOMPARE(ids.front(), 105);
  QCOMPARE(tok.decode(ids, true), chat);
  QCOMPARE(tok.decode(ids, false), std::string("user\nHi\n"));
}

// Byte-fallback tokens split characters; the detokenizer holds their bytes back.
void TokenizerTest::gemma3_incremental_detokenizer() {
  REQUIRE_GEMMA3();
  const Tokenizer& tok = *gemma3_;
  for (const char* text : kGemmaText) {
    const Ids ids = tok.encode(text, false, false);
    IncrementalDetokenizer detok(tok);
    std::string streamed;
    int held_back = 0;
    for (TokenId id : ids) {
      const std::string piece = detok.push(id);
      QVERIFY2(tokenfab::utf8::is_valid(piece), "push() emitted an incomplete UTF-8 sequence");
      held_back += piece.size() < tok.token_bytes(id).size();
      streamed += piece;
    }
    streamed += detok.flush();
    QCOMPARE(streamed, std::string(text));
    if (std::string_view(text).starts_with("rare")) QVERIFY(held_back > 0);
  }
}

void TokenizerTest::gemma3_end_of_generation() {
  REQUIRE_GEMMA3();
  const Tokenizer& tok = *gemma3_;
  QVERIFY(tok.is_end_of_generation(tok.eos_id()));
  QCOMPARE(tok.find_token("<end_of_turn>"), 106);
  QVERIFY(tok.is_end_of_generation(106));
  QVERIFY(!tok.is_end_of_generation(tok.find_token("<start_of_turn>")));
  QVERIFY(!tok.is_end_of_generation(tok.bos_id()));
  QVERIFY(!tok.is_end_of_generation(9259));
}
