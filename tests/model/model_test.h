#pragma once
// One Qt Test class for the model module. test_model.cpp checks the forward pass on the real
// SmolLM2-135M-Instruct (Q4_1) against golden data from an independent NumPy reference
// (tools/reference_forward.py → tests/data/forward_golden.json); test_model_synthetic.cpp checks
// every weight type on synthetic models against a plain-loop reference forward
// (reference_forward.cpp).

#include <QJsonObject>
#include <QObject>
#include <QString>
#include <QtTest>
#include <memory>
#include <optional>

#include "core/model/llama_model.h"
#include "core/tokenizer/tokenizer.h"
#include "kernels/cpu/thread_pool.h"

class ModelTest : public QObject {
  Q_OBJECT

 private slots:
  void initTestCase();

  // Need the real model file.
  void golden_logits();
  void plain_reference_matches_golden();
  void greedy_capital_of_france();
  void requantized_targets_still_answer();
  void perplexity_en();
  void chunked_prefill_matches_unchunked();
  void incremental_decode_matches_prefill();
  void generator_reuses_cached_prefix();

  // Synthetic models, no file needed.
  void synthetic_file_describes_itself();
  void synthetic_matches_reference_data();
  void synthetic_matches_reference();
  void hostile_counts_are_refused_before_allocating();

 private:
  int threads() const;

  QString model_error_;  // why the real model is not available (empty when it is)
  std::unique_ptr<tokenfab::LlamaModel> model_;
  std::optional<tokenfab::Tokenizer> tokenizer_;
  std::unique_ptr<tokenfab::kernels::ThreadPool> pool_;
  QJsonObject golden_;  // tests/data/forward_golden.json
};

#define REQUIRE_MODEL()                           \
  do {                                            \
    if (!model_) QFAIL(qPrintable(model_error_)); \
  } while (false)
