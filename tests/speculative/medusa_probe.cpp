// tokenfab-medusa-probe: the engine's side of test_medusa_export.py (a test helper, not shipped).
//
//   make-head --model GGUF --name NAME [--type medusa|mtp] [--heads K] [--seed S]
//       A head for the model with random weights, registered in the user data directory
//       ($TOKENFAB_HOME) as `heads train` registers its heads. Random rather than trained: every
//       entry of W and b then moves the drafts, so a transposed or misnamed tensor in an export
//       shows. medusa: W ~ N(0, 1/n_embd) (W h about as large as h), b ~ N(0, 0.1²).
//       Prints {"id": ID, "file": PATH}.
//   drafts --model GGUF --head FILE [--threads N] [--positions P] --prompt TEXT [--prompt TEXT…]
//       For the last P positions of each prompt: the target's final-norm hidden state there (the
//       rows a Medusa proposal starts from, recorded by the engine's ModelRunner) and the head's
//       drafts from it, as a CPU device proposes them (Device::medusa_top: DraftHead::residual,
//       then the model's own LM head kernels on its stored weights), with the engine's logit gap
//       between each draft and the runner-up. Prints
//       {"rows": [{"prompt": i, "position": t, "hidden": [...], "drafts": [...],
//                  "engine_gap": [...]}]}.

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <iostream>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/common/atomic_file.h"
#include "core/common/error.h"
#include "core/device/device.h"
#include "core/speculative/draft_head.h"
#include "core/storage/database.h"
#include "core/storage/registry.h"
#include "core/tokenizer/tokenizer.h"
#include "core/training/head_training_job.h"
#include "core/training/trace_recorder.h"

using namespace tokenfab;
namespace fs = std::filesystem;

namespace {

struct Args {
  std::string command, model, name, head, type = "medusa";
  int heads = 4, threads = 2, positions = 4;
  uint64_t seed = 1;
  std::vector<std::string> prompts;
};

Args parse(int argc, char** argv) {
  if (argc < 2) throw Error("usage: tokenfab-medusa-probe make-head|drafts --model GGUF …");
  Args a;
  a.command = argv[1];
  for (int i = 2; i < argc; i += 2) {
    const std::string flag = argv[i];
    if (i + 1 >= argc) throw Error(flag + " needs a value");
    const std::string value = argv[i + 1];
    if (flag == "--model")
      a.model = value;
    else if (flag == "--name")
      a.name = value;
    else if (flag == "--head")
      a.head = value;
    else if (flag == "--type")
      a.type = value;
    else if (flag == "--heads")
      a.heads = std::stoi(value);
    else if (flag == "--threads")
      a.threads = std::stoi(value);
    else if (flag == "--positions")
      a.positions = std::stoi(value);
    else if (flag == "--seed")
      a.seed = std::stoull(value);
    else if (flag == "--prompt")
      a.prompts.push_back(value);
    else
      throw Error("unknown option " + flag);
  }
  if (a.model.empty()) throw Error("--model is required");
  return a;
}

void make_head(const Args& a) {
  const auto model = LlamaModel::load(a.model, false);
  const HParams& hp = model->hparams();
  DraftHeadInfo info;
  info.type = a.type;
  info.name = a.name;
  info.domain = "test";
  info.base_model_sha256 = model_file_sha256(*model);
  info.n_heads = a.heads;
  info.n_embd = static_cast<int32_t>(hp.n_embd);
  info.n_vocab = static_cast<int32_t>(hp.n_vocab);
  std::mt19937_64 rng(a.seed);
  DraftHead head;
  if (a.type == "mtp") {
    std::vector<TokenId> vocab(static_cast<size_t>(std::min<int64_t>(hp.n_vocab, 1024)));
    for (size_t i = 0; i < vocab.size(); ++i) vocab[i] = static_cast<TokenId>(i);
    head = make_mtp_head(info, std::move(vocab));
  } else {
    head = make_medusa_head(info);
    std::normal_distribution<float> w(0.0f, 1.0f / std::sqrt(static_cast<float>(hp.n_embd)));
    std::normal_distribution<float> b(0.0f, 0.1f);
    for (auto& wk : head.w) std::generate(wk.begin(), wk.end(), [&] { return w(rng); });
    for (auto& bk : head.b) std::generate(bk.begin(), bk.end(), [&] { return b(rng); });
  }
  const fs::path file = user_data_dir() / "heads" / (a.name + ".gguf");
  create_folders_for(file);
  save_draft_head(head, file);
  const auto db = Database::open_default();
  Registry registry(*db);
  registry.add_model(
      {0, info.base_model_sha256, fs::path(a.model).filename().string(), a.model, 0});
  registry.add_domain({0, info.domain, "", "user"});
  HeadRecord record;
  record.name = info.name;
  record.domain = info.domain;
  record.type = info.type;
  record.base_model_sha256 = info.base_model_sha256;
  record.file = file.string();
  const int64_t id = registry.add_head(record);
  std::cout << nlohmann::json{{"id", id}, {"file", file.string()}}.dump() << std::endl;
}

void drafts(const Args& a) {
  if (a.prompts.empty()) throw Error("give at least one --prompt");
  const auto model = LlamaModel::load(a.model);
  const Tokenizer tokenizer = Tokenizer::from_gguf(model->file());
  auto head = std::make_shared<const DraftHead>(load_draft_head(a.head));
  const int64_t d = model->hparams().n_embd, v = model->hparams().n_vocab;
  const int32_t k = head->n_heads();
  CpuDevice device({}, *model, a.threads, 1, 16);
  TraceOptions options;
  options.threads = a.threads;
  nlohmann::json rows = nlohmann::json::array();
  for (size_t p = 0; p < a.prompts.size(); ++p) {
    const std::vector<TokenId> tokens =
        tokenizer.encode(a.prompts[p], tokenizer.add_bos_token(), false);
    const TraceSet trace =
        record_corpus(*model, tokens, static_cast<int32_t>(tokens.size()), options, {});
    for (int64_t t = std::max<int64_t>(0, trace.n_pos() - a.positions); t < trace.n_pos(); ++t) {
      const float* h = trace.hidden.data() + t * d;
      const std::vector<MedusaProposal> proposal{{head, h, k}};
      const std::vector<int32_t> wanted(static_cast<size_t>(k), 1);
      std::vector<std::vector<int32_t>> best;
      device.medusa_top(proposal, wanted, best);
      // The same rows again, for each draft's lead over the runner-up in the engine's logits.
      std::vector<float> z(static_cast<size_t>(k * d)), logits;
      for (int32_t level = 0; level < k; ++level) head->residual(level, h, 1, z.data() + level * d);
      device.lm_head(z.data(), k, logits);
      nlohmann::json ids = nlohmann::json::array(), gaps = nlohmann::json::array();
      for (int32_t level = 0; level < k; ++level) {
        const float* row = logits.data() + level * v;
        const std::vector<int32_t> top = top_tokens(row, v, 2);
        ids.push_back(best[static_cast<size_t>(level)].front());
        gaps.push_back(row[top[0]] - row[top[1]]);
      }
      rows.push_back({{"prompt", p},
                      {"position", t},
                      {"hidden", std::vector<float>(h, h + d)},
                      {"drafts", ids},
                      {"engine_gap", gaps}});
    }
  }
  std::cout << nlohmann::json{{"rows", rows}}.dump() << std::endl;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const Args a = parse(argc, argv);
    if (a.command == "make-head") {
      make_head(a);
    } else if (a.command == "drafts") {
      drafts(a);
    } else {
      throw Error("unknown command " + a.command + " (make-head or drafts)");
    }
  } catch (const std::exception& e) {
    std::cerr << "tokenfab-medusa-probe: " << e.what() << std::endl;
    return 1;
  }
  return 0;
}
