#include "core/training/generation_eval.h"

#include <algorithm>
#include <chrono>
#include <map>

#include "core/common/error.h"
#include "core/speculative/draft_head.h"
#include "core/tokenizer/chat_template.h"
#include "kernels/cpu/quant_types.h"

namespace tokenfab {

namespace {

constexpr const char* kCancelled = "evaluation cancelled; nothing was recorded";

const std::map<std::string, kernels::WeightType>& quant_types() {
  static const std::map<std::string, kernels::WeightType> types = {
      {"f16", kernels::WeightType::F16},
      {"q8_0", kernels::WeightType::Q8_0},
      {"q4_1", kernels::WeightType::Q4_1},
      {"q4_0", kernels::WeightType::Q4_0}};
  return types;
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
  static const std::vector<std::string> names = {"native", "f16", "q8_0", "q4_1", "q4_0"};
  return names;
}

void check_target_quant(const std::string& name) {
  const auto& names = target_quant_names();
  if (std::find(names.begin(), names.end(), name) == names.end())
    throw Error("--target-quant " + name + ": expected native, f16, q8_0, q4_1 or q4_0");
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
    requantized->requantize(quant_types().at(r.target_quant));
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
