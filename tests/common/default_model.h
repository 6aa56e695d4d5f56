#pragma once
// For test suites that run the real embedded model: loads it and its tokenizer, or fails the
// current test naming the missing file and how to get it (CI fetches it before the tests run).

#include <QtTest>
#include <filesystem>

#include "core/model/llama_model.h"
#include "core/model/model_files.h"
#include "core/tokenizer/tokenizer.h"

// path_out (std::filesystem::path) ← the default model's file, or the test fails naming it.
#define TOKENFAB_DEFAULT_MODEL_PATH(path_out)                                                 \
  do {                                                                                        \
    (path_out) = tokenfab::default_model_path();                                              \
    if (!std::filesystem::exists(path_out))                                                   \
      QFAIL(qPrintable(QString("the default model is missing (%1); run `tokenfab-cli fetch`") \
                           .arg(QString::fromStdString((path_out).string()))));               \
  } while (0)

// For suites that keep their data in a temporary TOKENFAB_HOME: path_out (QString) ← the default
// model's file, resolved before TOKENFAB_HOME moves (the model stays where it was fetched), or the
// test fails naming it; then TOKENFAB_HOME ← home_dir (a valid QTemporaryDir).
#define TOKENFAB_DEFAULT_MODEL_WITH_HOME(path_out, home_dir)                                  \
  do {                                                                                        \
    const std::filesystem::path tokenfab_model_path_ = tokenfab::default_model_path();        \
    if (!std::filesystem::exists(tokenfab_model_path_))                                       \
      QFAIL(qPrintable(QString("the default model is missing (%1); run `tokenfab-cli fetch`") \
                           .arg(QString::fromStdString(tokenfab_model_path_.string()))));     \
    (path_out) = QString::fromStdString(tokenfab_model_path_.string());                       \
    QVERIFY((home_dir).isValid());                                                            \
    qputenv("TOKENFAB_HOME", (home_dir).path().toUtf8());                                     \
  } while (0)

// model: std::unique_ptr<LlamaModel>; tokenizer: std::optional<Tokenizer>.
#define TOKENFAB_LOAD_DEFAULT_MODEL(model, tokenizer)                                         \
  do {                                                                                        \
    const std::filesystem::path tokenfab_model_path_ = tokenfab::default_model_path();        \
    if (!std::filesystem::exists(tokenfab_model_path_))                                       \
      QFAIL(qPrintable(QString("the default model is missing (%1); run `tokenfab-cli fetch`") \
                           .arg(QString::fromStdString(tokenfab_model_path_.string()))));     \
    (model) = tokenfab::LlamaModel::load(tokenfab_model_path_);                               \
    (tokenizer).emplace(tokenfab::Tokenizer::from_gguf((model)->file()));                     \
  } while (0)
