#include "core/model/model_memory.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <limits>

namespace tokenfab {

namespace {

constexpr uint64_t kMax = std::numeric_limits<uint64_t>::max();
// Larger counts or sizes than this are not a real model's; refusing them keeps the products below
// far from overflow (2^20 layers · 2^20 heads · 2^21 elements · 2 bytes < 2^63).
constexpr int64_t kPlausible = int64_t{1} << 20;

uint64_t mul_saturating(uint64_t a, uint64_t b) {
  if (a != 0 && b > kMax / a) return kMax;
  return a * b;
}

uint64_t add_saturating(uint64_t a, uint64_t b) {
  return b > kMax - a ? kMax : a + b;
}

// `<arch>.<key>` as one count per layer: an integer repeated, or an array of n_layer integers.
// nullopt when absent; empty with `why_not` set when invalid.
std::optional<std::vector<int64_t>> per_layer(const gguf::GgufFile& file, const std::string& key,
                                              int64_t n_layer, std::string& why_not) {
  const gguf::Value* v = file.find(key);
  if (v == nullptr) return std::nullopt;
  std::vector<int64_t> values;
  try {
    if (v->type() == gguf::ValueType::Array) {
      values = v->as_int_array(key);
      if (static_cast<int64_t>(values.size()) != n_layer) {
        why_not = key + " has " + std::to_string(values.size()) + " entries for " +
                  std::to_string(n_layer) + " layers";
        return std::vector<int64_t>{};
      }
    } else {
      values.assign(static_cast<size_t>(n_layer), v->as_int(key));
    }
  } catch (const Error&) {
    why_not = key + " is not an integer or an array of integers";
    return std::vector<int64_t>{};
  }
  for (const int64_t n : values) {
    if (n < 0 || n > kPlausible) {
      why_not = key + " holds " + std::to_string(n) + ", not a head count";
      return std::vector<int64_t>{};
    }
  }
  return values;
}

// A positive integer `key` no larger than kPlausible, 0 when absent; -1 with `why_not` set when
// present but invalid.
int64_t positive(const gguf::GgufFile& file, const std::string& key, std::string& why_not) {
  const gguf::Value* v = file.find(key);
  if (v == nullptr) return 0;
  if (v->is_integer()) {
    try {
      const int64_t n = v->as_int(key);
      if (n > 0 && n <= kPlausible) return n;
    } catch (const Error&) {
    }
  }
  why_not = key + " is not a positive integer up to " + std::to_string(kPlausible);
  return -1;
}

}  // namespace

uint64_t KvShape::bytes_per_token() const {
  uint64_t heads = 0;
  for (const int64_t n : n_kv_head) heads += static_cast<uint64_t>(n);
  return heads * static_cast<uint64_t>(key_length + value_length) * kKvBytesPerElement;
}

std::optional<KvShape> kv_shape(const gguf::GgufFile& file, std::string& why_not) {
  const gguf::Value* arch_value = file.find("general.architecture");
  if (arch_value == nullptr || arch_value->type() != gguf::ValueType::String) {
    why_not = "general.architecture is not stated";
    return std::nullopt;
  }
  const std::string p = arch_value->as_string() + ".";
  KvShape s;
  s.n_layer = positive(file, p + "block_count", why_not);
  if (s.n_layer <= 0) {
    if (s.n_layer == 0) why_not = p + "block_count is not stated";
    return std::nullopt;
  }
  const auto heads = per_layer(file, p + "attention.head_count", s.n_layer, why_not);
  if (!heads) why_not = p + "attention.head_count is not stated (no attention, no KV cache)";
  if (!heads || heads->empty()) return std::nullopt;
  const auto kv_heads = per_layer(file, p + "attention.head_count_kv", s.n_layer, why_not);
  if (kv_heads && kv_heads->empty()) return std::nullopt;
  s.n_kv_head = kv_heads ? *kv_heads : *heads;  // absent: one kv head per head (no GQA)

  s.key_length = positive(file, p + "attention.key_length", why_not);
  if (s.key_length < 0) return std::nullopt;
  if (s.key_length == 0) {
    const int64_t n_embd = positive(file, p + "embedding_length", why_not);
    const auto first = std::find_if(heads->begin(), heads->end(), [](int64_t n) { return n > 0; });
    if (n_embd <= 0 || first == heads->end()) {
      if (n_embd == 0) why_not = p + "embedding_length is not stated";
      if (first == heads->end()) why_not = p + "attention.head_count is 0 in every layer";
      return std::nullopt;
    }
    s.key_length = n_embd / *first;
  }
  s.value_length = positive(file, p + "attention.value_length", why_not);
  if (s.value_length < 0) return std::nullopt;
  if (s.value_length == 0) s.value_length = s.key_length;
  why_not.clear();
  return s;
}

uint64_t ModelMemory::kv_bytes() const {
  return mul_saturating(kv_bytes_per_token, static_cast<uint64_t>(std::max<int64_t>(context, 0)));
}

uint64_t ModelMemory::total_bytes() const {
  return add_saturating(weight_bytes, kv_bytes());
}

int64_t default_context(int64_t context_length) {
  return context_length > 0 ? std::min(context_length, kDefaultLibraryContext)
                            : kDefaultLibraryContext;
}

MemoryPlace host_memory() {
  MemoryPlace host{"cpu", 0, 0, true};
  std::ifstream in("/proc/meminfo");
  for (std::string line; std::getline(in, line);) {
    unsigned long long kib = 0;
    if (std::sscanf(line.c_str(), "MemTotal: %llu kB", &kib) == 1) host.total_bytes = kib * 1024;
    if (std::sscanf(line.c_str(), "MemAvailable: %llu kB", &kib) == 1)
      host.available_bytes = kib * 1024;
  }
  const auto page = static_cast<uint64_t>(sysconf(_SC_PAGE_SIZE));
  if (host.total_bytes == 0)
    host.total_bytes = static_cast<uint64_t>(sysconf(_SC_PHYS_PAGES)) * page;
  if (host.available_bytes == 0)
    host.available_bytes = static_cast<uint64_t>(sysconf(_SC_AVPHYS_PAGES)) * page;
  return host;
}

const char* verdict_text(FitVerdict verdict) {
  switch (verdict) {
    case FitVerdict::kFits:
      return "fits";
    case FitVerdict::kFitsOnOneDeviceOnly:
      return "fits on one device only";
    case FitVerdict::kDoesNotFit:
      return "does not fit";
  }
  return "does not fit";
}

std::string bytes_text(uint64_t bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  double value = static_cast<double>(bytes);
  int unit = 0;
  while (value >= 1024.0 && unit < 6) {
    value /= 1024.0;
    ++unit;
  }
  char text[32];
  if (unit == 0) {
    std::snprintf(text, sizeof text, "%llu B", static_cast<unsigned long long>(bytes));
  } else {
    std::snprintf(text, sizeof text, "%.*f %s", value < 10.0 ? 2 : 1, value, units[unit]);
  }
  return text;
}

Fit assess_fit(const ModelMemory& need, const std::vector<MemoryPlace>& places) {
  Fit fit;
  const uint64_t total = need.total_bytes();
  bool split = false;
  std::string where;
  for (const MemoryPlace& place : places) {
    if (total <= place.available_bytes) fit.fits_on.push_back(place.name);
    if (place.is_host && add_saturating(total, need.kv_bytes()) <= place.available_bytes)
      split = true;  // two CPU virtual devices: the weights once, two KV caches
    where += "; " + place.name + ": " + bytes_text(place.available_bytes) + " available of " +
             bytes_text(place.total_bytes);
  }
  split = split || fit.fits_on.size() >= 2;
  fit.verdict = fit.fits_on.empty() ? FitVerdict::kDoesNotFit
                : split             ? FitVerdict::kFits
                                    : FitVerdict::kFitsOnOneDeviceOnly;
  fit.explanation = "needs " + bytes_text(total) + " (weights " + bytes_text(need.weight_bytes) +
                    " + KV cache " + bytes_text(need.kv_bytes()) + " for " +
                    std::to_string(need.context) + " tokens at " +
                    bytes_text(need.kv_bytes_per_token) + " each)" + where;
  if (fit.verdict == FitVerdict::kFitsOnOneDeviceOnly)
    fit.explanation += "; a prefill/decode split needs it on two devices, or " +
                       bytes_text(add_saturating(total, need.kv_bytes())) +
                       " on the cpu (the weights once, two KV caches)";
  return fit;
}

}  // namespace tokenfab
