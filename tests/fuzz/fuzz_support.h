#pragma once
// What the fuzz targets' source files (fuzz_targets.cpp, quant_blocks.cpp) share; not part of the
// targets' interface (fuzz_targets.h).

#include <filesystem>
#include <string>

namespace tokenfab::fuzz {

// A finding: what the target saw that a clear refusal would not explain. Aborts, so that libFuzzer
// keeps the input and the replay suite fails on it.
[[noreturn]] void finding(const std::string& what);

// quant_blocks' seeds, into dir (quant_blocks.cpp). Throws Error on failure.
void write_quant_block_seeds(const std::filesystem::path& dir);

}  // namespace tokenfab::fuzz
