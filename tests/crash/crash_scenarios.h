#pragma once
// What tokenfab-crash-child writes and test_crash expects, shared by both.

#include <string>

#include "core/training/head_training_job.h"

namespace tokenfab::crash {

// conversation: each reply is kReplyTokens pieces, saved every kSaveEveryTokens.
inline constexpr int kReplyTokens = 400;
inline constexpr int kSaveEveryTokens = 25;

inline std::string reply_piece(int token) {
  std::string piece = "w";  // (appended, not `"w" + ...`: GCC 12 warns falsely on that)
  piece += std::to_string(token);
  piece += ' ';
  return piece;
}

// The whole reply; a reply saved before its end holds a prefix of it.
inline std::string reply_text() {
  std::string text;
  for (int t = 1; t <= kReplyTokens; ++t) text += reply_piece(t);
  return text;
}

// train: a head that trains in seconds on the embedded model (medusa: no taps to trace).
inline HeadTrainingRequest tiny_training_request() {
  HeadTrainingRequest r;
  r.domain = "code";
  r.prompt_set = "code";
  r.type = "medusa";
  r.taps = false;
  r.heads = 2;
  r.steps = 30;
  r.continuation = 16;
  r.max_prompts = 4;
  r.batch = 32;
  r.threads = 1;
  return r;
}

}  // namespace tokenfab::crash
