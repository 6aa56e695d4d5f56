#pragma once
// The one exception type that crosses module boundaries. Messages name what was wrong (the file,
// the field, what was expected), so the CLI can print them as they are.

#include <stdexcept>
#include <string>

namespace tokenfab {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message) : std::runtime_error(message) {}
};

}  // namespace tokenfab
