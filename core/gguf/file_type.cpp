#include "core/gguf/file_type.h"

#include <array>
#include <cctype>
#include <utility>

namespace tokenfab::gguf {

namespace {

// llama.cpp's llama_ftype values and names; 4–6 were retired before GGUF.
constexpr std::array<std::pair<uint32_t, const char*>, 32> kFileTypes = {{
    {0, "F32"},      {1, "F16"},      {2, "Q4_0"},     {3, "Q4_1"},    {7, "Q8_0"},
    {8, "Q5_0"},     {9, "Q5_1"},     {10, "Q2_K"},    {11, "Q3_K_S"}, {12, "Q3_K_M"},
    {13, "Q3_K_L"},  {14, "Q4_K_S"},  {15, "Q4_K_M"},  {16, "Q5_K_S"}, {17, "Q5_K_M"},
    {18, "Q6_K"},    {19, "IQ2_XXS"}, {20, "IQ2_XS"},  {21, "Q2_K_S"}, {22, "IQ3_XS"},
    {23, "IQ3_XXS"}, {24, "IQ1_S"},   {25, "IQ4_NL"},  {26, "IQ3_S"},  {27, "IQ3_M"},
    {28, "IQ2_S"},   {29, "IQ2_M"},   {30, "IQ4_XS"},  {31, "IQ1_M"},  {32, "BF16"},
    {36, "TQ1_0"},   {37, "TQ2_0"},
}};

std::string upper(const std::string& s) {
  std::string out = s;
  for (char& c : out) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return out;
}

}  // namespace

std::optional<std::string> file_type_name(uint32_t value) {
  for (const auto& [v, name] : kFileTypes)
    if (v == value) return std::string(name);
  return std::nullopt;
}

std::optional<uint32_t> file_type_value(const std::string& name) {
  const std::string wanted = upper(name);
  for (const auto& [v, n] : kFileTypes)
    if (wanted == n) return v;
  return std::nullopt;
}

}  // namespace tokenfab::gguf
