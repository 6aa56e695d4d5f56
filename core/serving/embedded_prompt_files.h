#pragma once
// The prompt-set files of resources/prompts/ and resources/domains/, compiled into the binary. The
// table is defined in a .cpp that core/CMakeLists.txt generates in the build tree from every
// resources/prompts/*.txt and resources/domains/*/*.txt; prompt_sets.cpp is its only reader.

#include <cstddef>

namespace tokenfab::detail {

struct EmbeddedPromptFile {
  // "chat_turns" for resources/prompts/chat_turns.txt;
  // "domains/code/train" for resources/domains/code/train.txt
  const char* name;
  const unsigned char* data;  // (size) bytes of UTF-8 text, not NUL-terminated
  std::size_t size;
};

extern const EmbeddedPromptFile kEmbeddedPromptFiles[];
extern const std::size_t kEmbeddedPromptFileCount;

}  // namespace tokenfab::detail
