#pragma once
// Our Jinja implementation's entry point: a template parsed once, rendered many times. It renders
// the subset of Jinja that models' chat templates use, as HF's apply_chat_template renders it
// with jinja2 (trim_blocks, lstrip_blocks, loop controls, an immutable sandbox, its tojson,
// raise_exception and strftime_now): see jinja_lexer.h, jinja_parser.h and jinja_builtins.h.

#include <cstddef>
#include <cstdint>
#include <ctime>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "core/tokenizer/jinja_value.h"

namespace tokenfab::jinja {

struct Program;

// Guards against runaway templates; exceeding one is an error naming it.
struct RenderLimits {
  size_t max_output_bytes = size_t{16} << 20;  // also bounds every string and list built
  int64_t max_iterations = 1'000'000;          // loop iterations and macro calls, together
  int max_call_depth = 32;                     // macros calling macros
};

struct RenderOptions {
  std::optional<std::tm> now;  // what strftime_now formats; the local time when nullopt
  RenderLimits limits;
};

class Template {
 public:
  // Throws tokenfab::Error "SOURCE:LINE:COLUMN: what was wrong" when the text does not parse.
  static Template parse(std::string_view text, std::string source_name);

  // Renders with `variables` (string keys: messages, add_generation_prompt, bos_token, ...).
  // Throws tokenfab::Error "SOURCE:LINE:COLUMN: what was wrong"; for raise_exception() the
  // message ends with the template's own text.
  std::string render(const DictData& variables, const RenderOptions& options = {}) const;

  const std::string& source_name() const;

 private:
  std::shared_ptr<const Program> program_;
};

}  // namespace tokenfab::jinja
