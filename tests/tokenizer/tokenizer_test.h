#pragma once
// One Qt Test class for the tokenizer module. Tests that need the model file are in
// test_tokenizer.cpp; those that need none (pre-tokenizers, UTF-8, tiny vocabularies, errors) in
// test_tokenizer_units.cpp; those of the other model families (Gemma 3's SentencePiece vocabulary,
// SentencePiece BPE, the Qwen 2 / Tekken pre-tokenizers) in test_tokenizer_gemma3.cpp (needs Gemma
// 3 270M) and test_tokenizer_families.cpp.

#include <QFile>
#include <QJsonArray>
#include <QJsonDocument>
#include <QJsonObject>
#include <QObject>
#include <QString>
#include <QtTest>
#include <optional>
#include <string>
#include <vector>

#include "core/gguf/gguf_reader.h"
#include "core/tokenizer/tokenizer.h"

// QCOMPARE prints std::string values (and lists of them) as escaped bytes.
namespace QTest {
template <>
inline char* toString(const std::string& s) {
  return toString(QByteArray::fromStdString(s));
}
template <>
inline char* toString(const std::vector<std::string>& pieces) {
  QByteArray out = "[";
  for (const std::string& piece : pieces) {
    char* quoted = toString(QByteArray::fromStdString(piece));
    out += quoted;
    out += ' ';
    delete[] quoted;
  }
  return qstrdup(out.append(']').constData());
}
}  // namespace QTest

// tests/data/NAME parsed, or an empty object when it cannot be read.
inline QJsonObject load_test_json(const char* name) {
  QFile file(QStringLiteral(TOKENFAB_SOURCE_DIR "/tests/data/") + name);
  if (!file.open(QIODevice::ReadOnly)) return {};
  return QJsonDocument::fromJson(file.readAll()).object();
}

// "" when `tokenizer` encodes every case of `cases` ({text, parse_special, ids}) to its ids, else
// a description of the first that differs.
inline QString first_golden_mismatch(const tokenfab::Tokenizer& tokenizer,
                                     const QJsonArray& cases) {
  const auto ids_text = [](const std::vector<tokenfab::TokenId>& ids) {
    QString out;
    for (tokenfab::TokenId id : ids) out += QString::number(id) + ' ';
    return out;
  };
  for (const QJsonValue& value : cases) {
    const QJsonObject c = value.toObject();
    const bool parse_special = c.value("parse_special").toBool();
    const std::vector<tokenfab::TokenId> ids =
        tokenizer.encode(c.value("text").toString().toStdString(), false, parse_special);
    std::vector<tokenfab::TokenId> expected;
    for (const QJsonValue& id : c.value("ids").toArray()) expected.push_back(id.toInt());
    if (ids != expected) {
      return QString("text %1 (parse_special %2)\n   got: %3\n  want: %4")
          .arg(c.value("text").toString())
          .arg(parse_special)
          .arg(ids_text(ids), ids_text(expected));
    }
  }
  return {};
}

class TokenizerTest : public QObject {
  Q_OBJECT

 private slots:
  void initTestCase();

  // Need the SmolLM2 model file.
  void model_metadata();
  void golden_ids();
  void round_trip();
  void round_trip_invalid_utf8();
  void incremental_detokenizer();
  void special_tokens();
  void end_of_generation();
  void chat_template_smollm2();
  void fit_chat_prompt_leaves_out_the_fewest_oldest_messages();

  // No model file needed.
  void pre_tokenizer_gpt2();
  void pre_tokenizer_smollm();
  void pre_tokenizer_llama3();
  void pre_tokenizer_invalid_utf8();
  void utf8_decode();
  void bpe_merge_order();
  void tiny_vocab_specials();
  void detokenizer_holds_back_incomplete();
  void chat_template_text();
  void unsupported_tokenizer_model();
  void unsupported_pre_tokenizer();
  void missing_chat_template();

  // Need Gemma 3 270M (test_tokenizer_gemma3.cpp).
  void gemma3_metadata();
  void gemma3_golden_ids();
  void gemma3_round_trip();
  void gemma3_incremental_detokenizer();
  void gemma3_end_of_generation();

  // No model file needed (test_tokenizer_families.cpp).
  void pre_tokenizer_goldens();
  void pre_tokenizer_tekken_cases();
  void bpe_families_golden_ids();
  void sentencepiece_golden_ids();
  void sentencepiece_merge_order();
  void sentencepiece_byte_fallback_and_unknown();
  void sentencepiece_decode();
  void sentencepiece_from_gguf();
  void unsupported_sentencepiece_vocab();

 private:
  std::optional<tokenfab::gguf::GgufFile> model_file_;
  std::optional<tokenfab::Tokenizer> tokenizer_;
  QString model_error_;
  std::optional<tokenfab::Tokenizer> gemma3_;  // loaded by the first test that needs it
};

// Fails the test, saying how to fetch the model, when it could not be loaded. (QFAIL returns from
// the test function, so this has to be a macro.)
#define REQUIRE_MODEL()                               \
  do {                                                \
    if (!tokenizer_) QFAIL(qPrintable(model_error_)); \
  } while (false)
