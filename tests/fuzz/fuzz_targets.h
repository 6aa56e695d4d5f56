#pragma once
// Fuzz targets: what the app reads from files a user hands it, fed arbitrary bytes. Each target
// returns normally when the input was accepted or refused with tokenfab::Error (the one clear
// message the standards ask for); anything else — another exception, a crash, a sanitizer report,
// a broken round trip — is a finding. The same functions run under libFuzzer
// (tests/fuzz/libfuzzer, TOKENFAB_FUZZ=ON, clang) and, over the committed corpus, in the
// test_fuzz_replay suite of every build.

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <span>
#include <string_view>

namespace tokenfab::fuzz {

// GgufFile::parse over the bytes, then every metadata value and tensor info read back.
void gguf_file(std::span<const uint8_t> bytes);
// The bytes as a model file: LlamaModel::load, the tokenizer and the chat template from it, and
// when all load, a prompt encoded and decoded.
void model_file(std::span<const uint8_t> bytes);
// The bytes as a draft-head file: load_draft_head, then, when check_head_matches finds it of a
// small model's shape, its proposals (mtp) or residual blocks (medusa) on that model.
void head_file(std::span<const uint8_t> bytes);
// The bytes as prompt text for the embedded model's tokenizer (skipped when its file is absent):
// decode(encode(text)) gives back the text less the bytes the vocabulary has no token for, and
// the incremental detokenizer gives back what decode does for valid UTF-8.
void tokenizer_text(std::span<const uint8_t> bytes);
// The bytes as sampling parameters and one row of logits (any floats: NaN, ±inf, ties, −0): a
// Sampler drawing from the row's candidates, as a GPU sends them back
// (kernels::filter_candidates under candidate_filter), draws, accepts and resamples exactly as
// one drawing from the whole row, from the same seed, and every token lies in the row.
void sampler_rows(std::span<const uint8_t> bytes);
// The bytes as the registry's database file: opened (migrated), then every table read through
// the stores the app uses (models, domains, heads with their evaluations and files, the best head
// per domain, conversations with their messages, runs).
void database_file(std::span<const uint8_t> bytes);
// The bytes as weight rows: byte 0 picks a WeightType (modulo their count: every type, the float
// ones included), byte 1 the row length (1 to 8 blocks, or units of 32 elements for the float
// types), then up to 8 rows of that type's blocks follow (a partial row is ignored). Each row
// goes through describe_bad_block, dequantize_row and gemm_scalar (against Q8A activations of a
// fixed vector) from a buffer of its exact size; for the block types the three must agree: a
// block decodes to finite values exactly when its fp16 scales are finite, describe_bad_block
// names the first block that does not (NaN or ±inf values only), and the product is finite
// exactly when it names none.
void quant_blocks(std::span<const uint8_t> bytes);
// The bytes as a model's Jinja chat template (`tokenizer.chat_template` comes from the user's
// file): ChatTemplate::from_template_text parses it and renders a short conversation, then
// apply() renders a longer one with and without the generation prompt; each accepts or refuses
// with one Error, within the renderer's limits on output, loops and depth.
void chat_template(std::span<const uint8_t> bytes);
// The bytes as an HTTP request body of the API server: byte 0 picks the endpoint (chat or
// completions), the rest is parsed by parse_openai_request, which accepts it or refuses it with
// one ApiError of status 400 naming a field or the body; an accepted request holds only values in
// range (sampling parameters that validate, at most 4 non-empty stop strings, 0–20 alternatives).
// Then the response shapes are built from it and serialised (invalid UTF-8 in the text replaced).
void openai_request(std::span<const uint8_t> bytes);
// Whether tokenizer_text has the embedded model's tokenizer to work on.
bool embedded_tokenizer_available();

// Writes the seed inputs into dir/<target>/: a small synthetic model in three weight types, Q4_K
// among them (for gguf_file and model_file), a medusa head and an mtp head with layer taps of
// that model's shape (head_file), a few prompts with chat markup (tokenizer_text), rows of logits
// with the default and the greedy parameters (sampler_rows), a database holding a row of every
// table (database_file), and rows of every weight type, two of them with a NaN or infinite scale
// (quant_blocks), the chat templates of tests/data/jinja_*.jinja (chat_template), and request
// bodies of both endpoints with every field (openai_request). Throws Error on failure.
void write_seeds(const std::filesystem::path& dir);

// The targets by name ("gguf_file", "model_file", "head_file", "tokenizer_text",
// "sampler_rows", "database_file", "quant_blocks", "chat_template", "openai_request"); null for any
// other name.
using Target = void (*)(std::span<const uint8_t>);
Target target_named(std::string_view name);

}  // namespace tokenfab::fuzz
