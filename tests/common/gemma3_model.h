#pragma once
// For test suites that need Gemma 3 270M (the second real model, a SentencePiece vocabulary): its
// path, or a failure of the current test naming the missing file and how to get it (CI fetches it
// before the tests run).

#include <QtTest>
#include <filesystem>

#include "core/model/model_files.h"

// The message a test fails with when Gemma 3 270M is missing from `path`.
inline QString gemma3_missing_message(const std::filesystem::path& path) {
  return QString("Gemma 3 270M is missing (%1); run `tokenfab-cli fetch gemma3-270m`")
      .arg(QString::fromStdString(path.string()));
}

// path_out (std::filesystem::path) ← Gemma 3 270M's file, or the test fails naming it.
#define TOKENFAB_GEMMA3_MODEL_PATH(path_out)                                                     \
  do {                                                                                           \
    (path_out) = tokenfab::gemma3_model_path();                                                  \
    if (!std::filesystem::exists(path_out)) QFAIL(qPrintable(gemma3_missing_message(path_out))); \
  } while (0)
