// tokenize / detokenize: the model's tokenizer on the command line.

#include <iostream>
#include <memory>
#include <sstream>

#include "cli_common.h"
#include "core/common/error.h"
#include "core/gguf/gguf_reader.h"
#include "core/model/model_files.h"
#include "core/model/model_library.h"

namespace tokenfab::cli {

namespace {

struct TokenizeOptions {
  CommonOptions common;
  std::string text;
  std::string ids;
  bool no_special = false;
};

Tokenizer load_tokenizer(const CommonOptions& o) {
  const auto file = gguf::GgufFile::open(resolve_model_path(o.model));
  return Tokenizer::from_gguf(file);
}

std::vector<TokenId> parse_ids(const std::string& text, int32_t n_vocab) {
  std::vector<TokenId> ids;
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) {
    size_t used = 0;
    long value = 0;
    try {
      value = std::stol(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used == 0 || used != item.size())
      throw Error("--ids: '" + item + "' is not an integer (expected a list like 1,2,3)");
    if (value < 0 || value >= n_vocab)
      throw Error("--ids: " + item + " is outside the vocabulary (0.." +
                  std::to_string(n_vocab - 1) + ")");
    ids.push_back(static_cast<TokenId>(value));
  }
  if (ids.empty()) throw Error("--ids: no ids given");
  return ids;
}

}  // namespace

void register_tokenize(CLI::App& app) {
  auto o = std::make_shared<TokenizeOptions>();
  auto* tok = app.add_subcommand("tokenize", "text to token ids");
  add_model_option(*tok, o->common);
  add_json_option(*tok, o->common);
  tok->add_option("--text", o->text, "text to tokenize")->required();
  tok->add_flag("--no-special", o->no_special, "treat special-token text as plain text");
  tok->callback([o] {
    const Tokenizer tokenizer = load_tokenizer(o->common);
    const auto ids = tokenizer.encode(o->text, tokenizer.add_bos_token(), !o->no_special);
    if (o->common.json) {
      print_json({{"ids", ids}});
      return;
    }
    for (size_t i = 0; i < ids.size(); ++i) std::cout << (i ? "," : "") << ids[i];
    std::cout << std::endl;
  });

  auto* detok = app.add_subcommand("detokenize", "token ids to text");
  add_model_option(*detok, o->common);
  add_json_option(*detok, o->common);
  detok->add_option("--ids", o->ids, "comma-separated token ids, e.g. 1,2,3")->required();
  detok->callback([o] {
    const Tokenizer tokenizer = load_tokenizer(o->common);
    const std::string text = tokenizer.decode(parse_ids(o->ids, tokenizer.n_vocab()));
    if (o->common.json) {
      print_json({{"text", text}});
      return;
    }
    std::cout << text << std::endl;
  });
}

}  // namespace tokenfab::cli
