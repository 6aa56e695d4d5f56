#include "core/training/prompt_writer.h"

#include <set>

#include "core/common/error.h"
#include "core/tokenizer/utf8.h"

namespace tokenfab {

namespace {

bool is_space(char c) {
  return c == ' ' || c == '\n' || c == '\t' || c == '\r';
}

int count_words(const std::string& text) {
  int n = 0;
  bool in_word = false;
  for (const char c : text) {
    if (is_space(c)) {
      in_word = false;
    } else if (!in_word) {
      in_word = true;
      ++n;
    }
  }
  return n;
}

std::string trimmed(const std::string& text) {
  const size_t first = text.find_first_not_of(" \n\t\r");
  if (first == std::string::npos) return {};
  return text.substr(first, text.find_last_not_of(" \n\t\r") - first + 1);
}

}  // namespace

void PromptWriting::validate() const {
  if (count < 0) throw Error("prompt writing: count must be ≥ 0");
  if (max_tokens < 1) throw Error("prompt writing: max_tokens must be at least 1");
  if (!(temperature > 0.0f && temperature <= 2.0f))
    throw Error("prompt writing: temperature must be in (0, 2]");
  if (threads < 0) throw Error("prompt writing: threads must be ≥ 0");
}

std::string opening_words(const std::string& text, int words) {
  const std::string t = trimmed(text);
  int seen = 0;
  bool in_word = false;
  for (size_t i = 0; i < t.size(); ++i) {
    if (is_space(t[i])) {
      if (in_word && seen == words) return t.substr(0, i);
      in_word = false;
    } else if (!in_word) {
      in_word = true;
      ++seen;
    }
  }
  return t;
}

std::vector<std::string> write_prompts(const LlamaModel& model, const Tokenizer& tokenizer,
                                       const ChatTemplate& chat_template,
                                       std::span<const std::string> examples,
                                       const PromptWriting& o, const TraceProgress& progress,
                                       bool* cancelled) {
  o.validate();
  if (cancelled) *cancelled = false;
  if (o.count == 0) return {};
  if (examples.empty()) throw Error("prompt writing needs at least one example prompt");
  // The template rendered around a marker: what comes before it opens a user turn.
  const std::string marker = "\x1etokenfab-user-text\x1e";
  const std::string rendered = chat_template.apply({{"user", marker}}, false);
  const size_t at = rendered.find(marker);
  if (at == std::string::npos)
    throw Error("the model's chat template does not place the user's text as written");
  const std::string turn_start = rendered.substr(0, at);

  const auto n_examples = static_cast<int64_t>(examples.size());
  std::vector<std::string> openings;
  std::vector<std::vector<TokenId>> starts;
  for (int64_t i = 0; i < o.count; ++i) {
    const int words = 2 + static_cast<int>((i / n_examples) % 3);
    openings.push_back(opening_words(examples[static_cast<size_t>(i % n_examples)], words));
    starts.push_back(
        tokenizer.encode(turn_start + openings.back(), tokenizer.add_bos_token(), true));
  }

  TraceOptions options;
  options.top_k = 0;
  options.continuation_tokens = o.max_tokens;
  options.threads = o.threads;
  options.sampling = SamplingParams{};
  options.sampling.temperature = o.temperature;
  options.sampling.seed = o.seed;
  bool stopped = false;
  const TraceSet turns = record_continuations(
      model, starts, options, [&](TokenId t) { return tokenizer.is_end_of_generation(t); },
      [&](int64_t done, int64_t total) {
        if (progress && !progress(done, total)) stopped = true;
        return !stopped;
      });
  if (cancelled) *cancelled = stopped;

  std::set<std::string> seen;
  for (const std::string& e : examples) seen.insert(trimmed(e));
  std::vector<std::string> out;
  for (int64_t s = 0; s < turns.n_sequences(); ++s) {
    const auto begin = static_cast<size_t>(turns.seq_begin[static_cast<size_t>(s)]);
    const auto end = static_cast<size_t>(turns.seq_begin[static_cast<size_t>(s) + 1]);
    if (end == begin || !tokenizer.is_end_of_generation(turns.next[end - 1])) continue;
    const std::span<const TokenId> body(turns.next.data() + begin, end - 1 - begin);
    const std::string with_special = tokenizer.decode(body, true);
    if (with_special != tokenizer.decode(body, false)) continue;  // a control token inside
    if (!utf8::is_valid(with_special)) continue;  // a character cut or garbled by sampling
    const std::string text = trimmed(openings[static_cast<size_t>(s)] + with_special);
    const int opening = count_words(openings[static_cast<size_t>(s)]);
    const int words = count_words(text);
    if (words < opening + 3 || words > 80) continue;
    if (!seen.insert(text).second) continue;
    out.push_back(text);
  }
  return out;
}

}  // namespace tokenfab
