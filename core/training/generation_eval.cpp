#include "core/training/generation_eval.h"

#include <algorithm>
#include <chrono>
#include <optional>

#include "core/common/error.h"
#include "core/model/quant_mix.h"
#include "core/speculative/draft_head.h"
#include "core/tokenizer/chat_template.h"
#include "kernels/cpu/quant_types.h"

namespace tokenfab {

namespace {

constexpr const char* kCancelled = "evaluation cancelled; nothing was recorded";

// The study's targets. A 32-element block type (and f16) re-quantizes every matrix, the LM head
// included, to that one type; a K-quant name (and iq4_xs) is llama-quantize's mixture of that
// name (quant_mix.h), whose super-blocks many models' rows do not divide.
struct TargetQuant {
  const char* name;
  std::optional<kernels::WeightType> uniform;  // nullopt: the mixture `name`
};

// Richest first (llama.cpp's sizes of an 8B model), as the app lists them.
const std::vector<TargetQuant>& target_quants() {
  using kernels::WeightType;
  static const std::vector<TargetQuant> quants = {
      {"native", std::nullopt},   {"f16", WeightType::F16},       {"q8_0", WeightType::Q8_0},
      {"q6_k", std::nullopt},     {"q5_1", WeightType::Q5_1},     {"q5_k_m", std::nullopt},
      {"q5_k_s", std::nullopt},   {"q5_0", WeightType::Q5_0},     {"q4_1", WeightType::Q4_1},
      {"q4_k_m", std::nullopt},   {"iq4_nl", WeightType::IQ4_NL}, {"q4_k_s", std::nullopt},
      {"q4_0", WeightType::Q4_0}, {"iq4_xs", std::nullopt},       {"q3_k_l", std::nullopt},
      {"q3_k_m", std::nullopt},   {"q3_k_s", std::nullopt},       {"q2_k", std::nullopt},
  };
  return quants;
}

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace

double GenerationEvalResult::speedup() const {
  return without.tok_s() > 0 ? with.tok_s() / without.tok_s() : 0.0;
}

double GenerationEvalResult::net_speedup_vs_native() const {
  return native && native->tok_s() > 0 ? with.tok_s() / native->tok_s() : 0.0;
}

const std::vector<std::string>& target_quant_names() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> out;
    for (const TargetQuant& q : target_quants()) out.emplace_back(q.name);
    return out;
  }();
  return names;
}

std::string target_quant_names_text() {
  const auto& names = target_quant_names();
  std::string text;
  for (size_t i = 0; i < names.size(); ++i)
    text += (i == 0 ? "" : i + 1 == names.size() ? " or " : ", ") + names[i];
  return text;
}

void check_target_quant(const std::string& name) {
  const auto& names = target_quant_names();
  if (std::find(names.begin(), names.end(), name) == names.end())
    throw Error("--target-quant " + name + ": expected " + target_quant_names_text() +
                " (f16, q8_0, q5_1, q5_0, q4_1, iq4_nl, q4_0: every matrix in that type; the "
                "K-quant names and iq4_xs: llama-quantize's mixture of that name)");
}

void requantize_target(LlamaModel& model, const std::string& name, int threads) {
  check_target_quant(name);
  if (name == "native") return;
  const auto q = std::find_if(target_quants().begin(), target_quants().end(),
                              [&name](const TargetQuant& t) { return name == t.name; });
  if (q->uniform) {
    model.requantize(*q->uniform, threads);
  } else {
    model.requantize_mix(*quant_mix_file_type(name), threads);
  }
}

GenerationEvalResult evaluate_by_generating(
    const LlamaModel& model, const Tokenizer& tokenizer, const GenerationEvalRequest& r,
    const std::function<bool(const GenerationEvalProgress&)>& progress) {
  check_target_quant(r.target_quant);
  if (r.prompts.empty()) throw Error("the evaluation has no prompts");
  GenerationEvalProgress p;
  p.total = static_cast<int64_t>(r.prompts.size());
  const auto report = [&] {
    if (!progress(p)) throw Error(kCancelled);
  };
  std::unique_ptr<LlamaModel> requantized;
  if (r.target_quant != "native") {
    p.phase = "quantizing";
    report();
    requantized = LlamaModel::load(model.file().name());
    requantize_target(*requantized, r.target_quant, r.config.threads);
  }
  const LlamaModel& target = requantized ? *requantized : model;
  const ChatTemplate tmpl = ChatTemplate::from_gguf(model.file());
  const auto is_end = [&tokenizer](TokenId t) { return tokenizer.is_end_of_generation(t); };
  Engine engine(target, r.config, is_end);
  std::unique_ptr<Engine> native;
  if (requantized) native = std::make_unique<Engine>(model, r.config, is_end);

  GenerationEvalResult out;
  if (native) out.native.emplace();
  p.phase = "generating";
  report();
  const auto start = std::chrono::steady_clock::now();
  for (size_t i = 0; i < r.prompts.size(); ++i) {
    GenerationRequest plain{tokenizer.encode(tmpl.apply({{"user", r.prompts[i]}}, true),
                                             tokenizer.add_bos_token(), true),
                            r.max_tokens};
    GenerationRequest drafted = plain;
    drafted.head = r.head;
    drafted.draft_len = r.draft_len;
    drafted.tree_shape = r.tree_shape;
    drafted.tree_nodes = r.tree_nodes;
    drafted.lookup = r.lookup;
    drafted.adaptive_draft = r.adaptive && r.tree_shape.empty();
    const RequestInfo base = engine.wait(engine.submit(plain));
    const RequestInfo spec = engine.wait(engine.submit(drafted));
    if (base.state != RequestState::kFinished || spec.state != RequestState::kFinished)
      throw Error("prompt " + std::to_string(i + 1) +
                  " failed: " + (base.error.empty() ? spec.error : base.error));
    out.lossless = out.lossless && base.output == spec.output;
    if (native) out.native->add(native->wait(native->submit(plain)));
    out.without.add(base);
    out.with.add(spec);
    ++out.prompts;
    p.done = out.prompts;
    p.accept_per_step = out.with.accept_per_step();
    p.eta_s =
        seconds_since(start) / static_cast<double>(p.done) * static_cast<double>(p.total - p.done);
    report();
  }
  return out;
}

EvaluationRecord evaluation_record(const GenerationEvalRequest& r,
                                   const GenerationEvalResult& result) {
  EvaluationRecord e;
  e.spec = r.tree_shape.empty() ? "chain" : "tree";
  e.accept_per_step = result.with.accept_per_step();
  e.per_position = result.with.per_position();
  e.decode_tok_s = result.with.tok_s();
  e.baseline_decode_tok_s = result.without.tok_s();
  e.target_quant = r.target_quant;
  e.native_decode_tok_s = result.native ? result.native->tok_s() : result.without.tok_s();
  e.devices = r.config.devices_text();
  e.prompts = result.prompts;
  e.tokens = result.with.tokens;
  return e;
}

}  // namespace tokenfab
