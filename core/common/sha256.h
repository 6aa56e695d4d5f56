#pragma once
// SHA-256 of a file (read in 1 MiB pieces) or of bytes in memory, as lowercase hex (OpenSSL's
// implementation).

#include <filesystem>
#include <string>
#include <string_view>

namespace tokenfab {

// Throws Error naming the file when it cannot be read.
std::string sha256_file(const std::filesystem::path& path);
std::string sha256_hex(std::string_view data);

}  // namespace tokenfab
