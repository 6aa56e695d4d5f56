#pragma once
// The prompt-set files of resources/prompts/, compiled into the binary. The table is defined in a
// .cpp that core/CMakeLists.txt generates in the build tree from every resources/prompts/*.txt;
// prompt_sets.cpp is its only reader.

#include <cstddef>

namespace tokenfab::detail {

struct EmbeddedPromptFile {
  const char* name;           // file stem: "chat_turns" for resources/prompts/chat_turns.txt
  const unsigned char* data;  // (size) bytes of UTF-8 text, not NUL-terminated
  std::size_t size;
};

extern const EmbeddedPromptFile kEmbeddedPromptFiles[];
extern const std::size_t kEmbeddedPromptFileCount;

}  // namespace tokenfab::detail
