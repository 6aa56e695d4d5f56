// tokenfab-crash-child: one crash scenario, looped until the process is killed, on the database
// in $TOKENFAB_HOME (test_crash kills it with SIGKILL at a random moment and checks what the next
// open finds). After each commit it prints one line to standard output, flushed, so the test
// knows what was committed before the kill:
//
//   tokenfab-crash-child conversation   conversation ID / message ID / reply ID LEN / finished ID
//                                       LEN: replies streamed from a token source of fixed text
//                                       (reply_text(N) in crash_scenarios.h), saved every
//                                       kSaveEveryTokens tokens as "generating", then "finished"
//   tokenfab-crash-child runs           run ID SEQ: RunStore::add
//   tokenfab-crash-child train MODEL    training NAME (its run row is committed) / head ID NAME:
//                                       tiny draft heads trained on MODEL (run_head_training)

#include <chrono>
#include <cstdio>
#include <exception>
#include <string>
#include <thread>

#include <unistd.h>

#include <nlohmann/json.hpp>

#include "core/model/llama_model.h"
#include "core/storage/conversations.h"
#include "core/storage/runs.h"
#include "core/tokenizer/tokenizer.h"
#include "core/training/head_training_job.h"
#include "tests/crash/crash_scenarios.h"

namespace tokenfab {
namespace {

void say(const std::string& line) {
  std::printf("%s\n", line.c_str());
  std::fflush(stdout);
}

[[noreturn]] void stream_conversations() {
  const auto db = Database::open_default();
  Conversations store(*db);
  for (int i = 0;; ++i) {
    const int64_t conversation = store.create("crash " + std::to_string(i));
    say("conversation " + std::to_string(conversation));
    const int64_t question = store.add_message({.conversation_id = conversation,
                                                .role = "user",
                                                .content = "question " + std::to_string(i)});
    say("message " + std::to_string(question));
    const auto generating = [](int tokens) {
      return nlohmann::json{{"state", Conversations::kGenerating}, {"tokens", tokens}}.dump();
    };
    const int64_t reply = store.add_message({.conversation_id = conversation,
                                             .role = "assistant",
                                             .content = "",
                                             .stats_json = generating(0)});
    say("reply " + std::to_string(reply) + " 0");
    std::string text;
    for (int t = 1; t <= crash::kReplyTokens; ++t) {
      text += crash::reply_piece(t);  // a token arrives
      std::this_thread::sleep_for(std::chrono::microseconds(200));
      if (t % crash::kSaveEveryTokens != 0) continue;
      store.update_message(reply, text, generating(t));
      say("reply " + std::to_string(reply) + " " + std::to_string(text.size()));
    }
    store.update_message(
        reply, text, nlohmann::json{{"state", "finished"}, {"tokens", crash::kReplyTokens}}.dump());
    say("finished " + std::to_string(reply) + " " + std::to_string(text.size()));
  }
}

[[noreturn]] void record_runs() {
  const auto db = Database::open_default();
  RunStore runs(*db);
  for (int64_t seq = 0;; ++seq) {
    RunRecord run;
    run.kind = "crash-test";
    run.title = "run " + std::to_string(seq);
    run.model = "none";
    run.config_json = nlohmann::json{{"seq", seq}}.dump();
    run.summary_json = nlohmann::json{{"seq", seq}, {"pad", std::string(4096, 'x')}}.dump();
    say("run " + std::to_string(runs.add(run)) + " " + std::to_string(seq));
  }
}

[[noreturn]] void train_heads(const std::string& model_path) {
  const auto model = LlamaModel::load(model_path);
  const Tokenizer tokenizer = Tokenizer::from_gguf(model->file());
  for (int i = 0;; ++i) {
    HeadTrainingRequest r = crash::tiny_training_request();
    r.name = "crash-" + std::to_string(::getpid()) + "-" + std::to_string(i);
    bool started = false;
    const HeadTrainingResult result =
        run_head_training(*model, tokenizer, r, [&](const HeadTrainingProgress&) {
          if (!started) say("training " + r.name);  // after the run's row is committed
          started = true;
          return true;
        });
    say("head " + std::to_string(result.head_id) + " " + r.name);
  }
}

}  // namespace
}  // namespace tokenfab

int main(int argc, char** argv) {
  const std::string scenario = argc > 1 ? argv[1] : "";
  try {
    if (scenario == "conversation") tokenfab::stream_conversations();
    if (scenario == "runs") tokenfab::record_runs();
    if (scenario == "train" && argc > 2) tokenfab::train_heads(argv[2]);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "tokenfab-crash-child %s: %s\n", scenario.c_str(), e.what());
    return 1;
  }
  std::fprintf(stderr, "usage: tokenfab-crash-child conversation | runs | train MODEL\n");
  return 2;
}
