#pragma once
// SHA-256 of a file, as lowercase hex (OpenSSL's implementation), read in 1 MiB pieces.

#include <filesystem>
#include <string>

namespace tokenfab {

// Throws Error naming the file when it cannot be read.
std::string sha256_file(const std::filesystem::path& path);

}  // namespace tokenfab
