#pragma once
// general.file_type: the whole file's quantization as llama.cpp's tools name it (its llama_ftype
// values, a fact of the GGUF ecosystem): "Q4_K_M" for 15, say. A file's tensors may mix types;
// this names the mixture its producer meant.

#include <cstdint>
#include <optional>
#include <string>

namespace tokenfab::gguf {

// The name of a general.file_type value ("Q4_K_M"), or nullopt for a value no producer uses.
std::optional<std::string> file_type_name(uint32_t value);
// The value of a name, case-insensitive ("q4_k_m" → 15), or nullopt.
std::optional<uint32_t> file_type_value(const std::string& name);

}  // namespace tokenfab::gguf
