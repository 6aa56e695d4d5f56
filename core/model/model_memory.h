#pragma once
// What a model needs in memory, from its GGUF header alone, and whether this machine holds it:
// the weights (every tensor's bytes) plus the KV cache at a context, against the host's memory
// (/proc/meminfo) and each GPU's. Works for any valid GGUF that states its attention shape,
// architectures Tokenfab cannot run included.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "core/gguf/gguf_reader.h"

namespace tokenfab {

// K and V are fp16 on every device: the CPU's paged pool (core/runtime/kv_storage.h), the
// single-sequence cache (core/model/kv_cache.h) and the CUDA pool (core/device/cuda_model.h).
inline constexpr uint64_t kKvBytesPerElement = 2;
// The context a model's KV cache is sized for when none is asked: min(context_length, this).
inline constexpr int64_t kDefaultLibraryContext = 4096;

// The attention shape the KV cache follows, from `<arch>.*` keys.
struct KvShape {
  int64_t n_layer = 0;
  std::vector<int64_t> n_kv_head;  // (n_layer): head_count_kv, per layer where the file says so
  int64_t key_length = 0;          // K elements per kv head (attention.key_length, else
                                   // embedding_length / head_count)
  int64_t value_length = 0;        // V elements per kv head (attention.value_length, else
                                   // key_length)

  // Σ over layers of n_kv_head · (key_length + value_length) · kKvBytesPerElement: K and V of one
  // position in every layer. With one head count and one head size this is
  // 2 · n_layer · n_kv_head · head_dim · 2.
  uint64_t bytes_per_token() const;
};

// The KV shape a file states, or nullopt with `why_not` saying which key is missing or invalid
// (a file with no attention, or a malformed one).
std::optional<KvShape> kv_shape(const gguf::GgufFile& file, std::string& why_not);

struct ModelMemory {
  int64_t context = 0;              // positions the KV cache holds
  uint64_t weight_bytes = 0;        // every tensor's bytes
  uint64_t kv_bytes_per_token = 0;  // 0 when the file states no KV shape
  uint64_t kv_bytes() const;        // kv_bytes_per_token · context (saturating)
  uint64_t total_bytes() const;     // weight_bytes + kv_bytes() (saturating)
};

// The KV context used when none is asked: min(context_length, kDefaultLibraryContext), or
// kDefaultLibraryContext when the file states no context length (context_length 0).
int64_t default_context(int64_t context_length);

// One memory a model can be placed in: the host's RAM ("cpu") or one GPU's ("cuda:N").
struct MemoryPlace {
  std::string name;
  uint64_t total_bytes = 0;
  uint64_t available_bytes = 0;  // the host's MemAvailable; a GPU's free memory
  // The host: Tokenfab's CPU virtual devices share one copy of the weights there, so a
  // prefill/decode split on the host needs the weights once and the KV cache twice.
  bool is_host = false;
};

// The host's memory from /proc/meminfo (MemTotal, MemAvailable); sysconf's page counts where
// /proc/meminfo cannot be read.
MemoryPlace host_memory();

enum class FitVerdict : uint8_t { kFits, kFitsOnOneDeviceOnly, kDoesNotFit };
// "fits", "fits on one device only", "does not fit".
const char* verdict_text(FitVerdict verdict);

// Whether `need` fits the places: on each place, weights + KV against its available memory.
//   fits:                     a prefill/decode split fits — two places each hold it, or the host
//                             holds the weights once and the KV cache twice;
//   fits on one device only:  some place holds it, but no split fits;
//   does not fit:             no place holds it.
struct Fit {
  FitVerdict verdict = FitVerdict::kDoesNotFit;
  std::vector<std::string> fits_on;  // the places that hold it, in the order given
  std::string explanation;           // the numbers: what it needs, what each place has
};
Fit assess_fit(const ModelMemory& need, const std::vector<MemoryPlace>& places);

// "1.23 GiB", "456.7 MiB", "12.0 KiB", "512 B".
std::string bytes_text(uint64_t bytes);

}  // namespace tokenfab
