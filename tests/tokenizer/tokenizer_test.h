#pragma once
// One Qt Test class for the tokenizer module. Tests that need the model file are in
// test_tokenizer.cpp; those that need none (pre-tokenizers, UTF-8, tiny vocabularies, errors) in
// test_tokenizer_units.cpp.

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

 private:
  std::optional<tokenfab::gguf::GgufFile> model_file_;
  std::optional<tokenfab::Tokenizer> tokenizer_;
  QString model_error_;
};

// Fails the test, saying how to fetch the model, when it could not be loaded. (QFAIL returns from
// the test function, so this has to be a macro.)
#define REQUIRE_MODEL()                               \
  do {                                                \
    if (!tokenizer_) QFAIL(qPrintable(model_error_)); \
  } while (false)
