#include "core/training/trace.h"

#include <xxhash.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>
#include <span>
#include <system_error>

#include "core/common/atomic_file.h"
#include "core/common/error.h"

namespace tokenfab {

namespace {

constexpr char kMagic[8] = {'T', 'F', 'T', 'R', 'A', 'C', 'E', '\0'};
constexpr uint32_t kVersion = 3;  // version 1: no next array; 2: no taps
constexpr uint32_t kMaxTaps = 16;
constexpr int32_t kMaxEmbd = 1 << 16;
constexpr int32_t kMaxTopK = 1024;
constexpr int64_t kMaxPositions = int64_t{1} << 36;

struct Header {
  char magic[8];
  uint32_t version;
  int32_t n_embd;
  int32_t top_k;
  uint32_t n_taps;  // version 3; 0 before
  int64_t n_pos;
  int64_t n_seq;
};
static_assert(sizeof(Header) == 40);

// Bytes after the header, checksum excluded.
uint64_t payload_bytes(const Header& h) {
  const auto n_pos = static_cast<uint64_t>(h.n_pos), k = static_cast<uint64_t>(h.top_k);
  const uint64_t token_arrays = h.version >= 2 ? 2 : 1;  // pred (and next)
  return (static_cast<uint64_t>(h.n_seq) + 1) * 8 + n_pos * static_cast<uint64_t>(h.n_embd) * 4 +
         n_pos * 4 * token_arrays + n_pos * k * 8 +
         n_pos * static_cast<uint64_t>(h.n_taps) * static_cast<uint64_t>(h.n_embd) * 4;
}

template <typename T>
std::span<const uint8_t> as_bytes(const std::vector<T>& v) {
  return {reinterpret_cast<const uint8_t*>(v.data()), v.size() * sizeof(T)};
}

}  // namespace

std::vector<int64_t> TraceSet::sequence_ends() const {
  std::vector<int64_t> ends(static_cast<size_t>(n_pos()));
  for (int64_t s = 0; s < n_sequences(); ++s)
    for (int64_t i = seq_begin[static_cast<size_t>(s)]; i < seq_begin[static_cast<size_t>(s) + 1];
         ++i)
      ends[static_cast<size_t>(i)] = seq_begin[static_cast<size_t>(s) + 1];
  return ends;
}

void TraceSet::copy_features(int64_t i, bool with_taps, float* out) const {
  const auto d = static_cast<size_t>(n_embd), tw = with_taps ? d * static_cast<size_t>(n_taps) : 0;
  std::copy_n(hidden.begin() + static_cast<ptrdiff_t>(static_cast<size_t>(i) * d), d, out);
  std::copy_n(taps.begin() + static_cast<ptrdiff_t>(static_cast<size_t>(i) * tw), tw, out + d);
}

void TraceSet::append(const TraceSet& other) {
  if (other.n_pos() == 0) return;
  if (n_pos() == 0) {
    n_embd = other.n_embd;
    top_k = other.top_k;
    n_taps = other.n_taps;
    seq_begin = {0};
  } else if (n_embd != other.n_embd || top_k != other.top_k || n_taps != other.n_taps) {
    throw Error("trace set: cannot append traces of n_embd " + std::to_string(other.n_embd) +
                ", top_k " + std::to_string(other.top_k) + " and " + std::to_string(other.n_taps) +
                " layer taps to traces of n_embd " + std::to_string(n_embd) + ", top_k " +
                std::to_string(top_k) + " and " + std::to_string(n_taps));
  }
  taps.insert(taps.end(), other.taps.begin(), other.taps.end());
  const int64_t offset = n_pos();
  hidden.insert(hidden.end(), other.hidden.begin(), other.hidden.end());
  pred.insert(pred.end(), other.pred.begin(), other.pred.end());
  next.insert(next.end(), other.next.begin(), other.next.end());
  topk_ids.insert(topk_ids.end(), other.topk_ids.begin(), other.topk_ids.end());
  topk_probs.insert(topk_probs.end(), other.topk_probs.begin(), other.topk_probs.end());
  for (size_t s = 1; s < other.seq_begin.size(); ++s)
    seq_begin.push_back(other.seq_begin[s] + offset);
}

void TraceSet::validate(const std::string& where) const {
  const auto n = static_cast<size_t>(n_pos());
  if (n_embd < 1 || n_embd > kMaxEmbd)
    throw Error(where + ": n_embd " + std::to_string(n_embd) + " is outside [1, " +
                std::to_string(kMaxEmbd) + "]");
  if (top_k < 0 || top_k > kMaxTopK)
    throw Error(where + ": top_k " + std::to_string(top_k) + " is outside [0, " +
                std::to_string(kMaxTopK) + "]");
  if (n_taps < 0 || n_taps > static_cast<int32_t>(kMaxTaps))
    throw Error(where + ": " + std::to_string(n_taps) + " layer taps (at most " +
                std::to_string(kMaxTaps) + ")");
  if (hidden.size() != n * static_cast<size_t>(n_embd) || next.size() != n ||
      taps.size() != n * static_cast<size_t>(n_taps) * static_cast<size_t>(n_embd) ||
      topk_ids.size() != n * top_k || topk_probs.size() != n * top_k)
    throw Error(where + ": the hidden/next/top-k arrays do not match " + std::to_string(n) +
                " positions");
  if (n > 0 || !seq_begin.empty()) {
    if (seq_begin.empty() || seq_begin.front() != 0 || seq_begin.back() != n_pos())
      throw Error(where + ": seq_begin must start at 0 and end at n_pos " + std::to_string(n));
    for (size_t s = 1; s < seq_begin.size(); ++s)
      if (seq_begin[s] <= seq_begin[s - 1])
        throw Error(where + ": sequence " + std::to_string(s - 1) + " is empty or out of order");
  }
  for (TokenId t : pred)
    if (t < 0) throw Error(where + ": a predicted token id is negative");
  for (TokenId t : next)
    if (t < 0) throw Error(where + ": a next token id is negative");
  for (TokenId t : topk_ids)
    if (t < 0) throw Error(where + ": a top-k token id is negative");
  for (float p : topk_probs)
    if (!(p >= 0.0f && p <= 1.0f)) throw Error(where + ": a top-k probability is outside [0, 1]");
  for (float x : hidden)
    if (!std::isfinite(x)) throw Error(where + ": a hidden state holds a non-finite value");
  for (float x : taps)
    if (!std::isfinite(x)) throw Error(where + ": a layer tap holds a non-finite value");
}

void TraceSet::save(const std::filesystem::path& path) const {
  const std::string where = path.string();
  validate("trace file " + where);
  Header h{};
  std::memcpy(h.magic, kMagic, sizeof kMagic);
  h.version = kVersion;
  h.n_embd = n_embd;
  h.top_k = top_k;
  h.n_taps = static_cast<uint32_t>(n_taps);
  h.n_pos = n_pos();
  h.n_seq = n_sequences();
  const std::vector<int64_t> bounds = seq_begin.empty() ? std::vector<int64_t>{0} : seq_begin;

  std::unique_ptr<XXH64_state_t, decltype(&XXH64_freeState)> state(XXH64_createState(),
                                                                   &XXH64_freeState);
  XXH64_reset(state.get(), 0);
  // A temporary file of its own (a CLI and the app may trace at once), renamed into place whole.
  AtomicFile out(path);
  const auto put = [&](std::span<const uint8_t> bytes) {
    XXH64_update(state.get(), bytes.data(), bytes.size());
    out.write(bytes);
  };
  put({reinterpret_cast<const uint8_t*>(&h), sizeof h});
  put(as_bytes(bounds));
  put(as_bytes(hidden));
  put(as_bytes(pred));
  put(as_bytes(next));
  put(as_bytes(topk_ids));
  put(as_bytes(topk_probs));
  put(as_bytes(taps));
  const uint64_t sum = XXH64_digest(state.get());
  out.write({reinterpret_cast<const uint8_t*>(&sum), sizeof sum});
  out.commit();
}

TraceSet TraceSet::load(const std::filesystem::path& path) {
  const std::string where = "trace file " + path.string();
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  if (!in) throw Error(where + ": cannot open");
  const auto size = static_cast<uint64_t>(in.tellg());
  in.seekg(0);
  Header h{};
  if (size < sizeof h + 8 + 8)
    throw Error(where + ": truncated (" + std::to_string(size) + " bytes)");
  in.read(reinterpret_cast<char*>(&h), sizeof h);
  if (std::memcmp(h.magic, kMagic, sizeof kMagic) != 0)
    throw Error(where + ": not a trace file (bad magic)");
  if (h.version < 1 || h.version > kVersion)
    throw Error(where + ": version " + std::to_string(h.version) + " is not supported (expected " +
                "1 to " + std::to_string(kVersion) + ")");
  if (h.version < 3 && h.n_taps != 0)
    throw Error(where + ": a version " + std::to_string(h.version) +
                " file with a non-zero reserved field");
  if (h.n_taps > kMaxTaps)
    throw Error(where + ": " + std::to_string(h.n_taps) + " layer taps (at most " +
                std::to_string(kMaxTaps) + ")");
  if (h.n_embd < 1 || h.n_embd > kMaxEmbd || h.top_k < 0 || h.top_k > kMaxTopK)
    throw Error(where + ": n_embd " + std::to_string(h.n_embd) + " or top_k " +
                std::to_string(h.top_k) + " is out of range");
  if (h.n_pos < 0 || h.n_pos > kMaxPositions || h.n_seq < 0 || h.n_seq > h.n_pos)
    throw Error(where + ": n_pos " + std::to_string(h.n_pos) + " or n_seq " +
                std::to_string(h.n_seq) + " is out of range");
  const uint64_t expected = sizeof h + payload_bytes(h) + 8;
  if (size < expected)
    throw Error(where + ": truncated (" + std::to_string(size) + " bytes, expected " +
                std::to_string(expected) + ")");
  if (size > expected)
    throw Error(where + ": " + std::to_string(size - expected) + " unexpected trailing bytes");

  TraceSet t;
  t.n_embd = h.n_embd;
  t.top_k = h.top_k;
  t.n_taps = static_cast<int32_t>(h.n_taps);
  const auto n = static_cast<size_t>(h.n_pos), k = static_cast<size_t>(h.top_k);
  t.taps.resize(n * h.n_taps * static_cast<size_t>(h.n_embd));
  t.seq_begin.resize(static_cast<size_t>(h.n_seq) + 1);
  t.hidden.resize(n * static_cast<size_t>(h.n_embd));
  t.pred.resize(n);
  t.next.resize(n);
  t.topk_ids.resize(n * k);
  t.topk_probs.resize(n * k);
  std::unique_ptr<XXH64_state_t, decltype(&XXH64_freeState)> state(XXH64_createState(),
                                                                   &XXH64_freeState);
  XXH64_reset(state.get(), 0);
  XXH64_update(state.get(), &h, sizeof h);
  const auto get = [&](auto& v) {
    const size_t bytes = v.size() * sizeof(v[0]);
    in.read(reinterpret_cast<char*>(v.data()), static_cast<std::streamsize>(bytes));
    XXH64_update(state.get(), v.data(), bytes);
  };
  get(t.seq_begin);
  get(t.hidden);
  get(t.pred);
  if (h.version >= 2) {
    get(t.next);
  } else {
    t.next = t.pred;
  }
  get(t.topk_ids);
  get(t.topk_probs);
  get(t.taps);
  uint64_t sum = 0;
  in.read(reinterpret_cast<char*>(&sum), sizeof sum);
  if (!in) throw Error(where + ": read failed");
  if (sum != XXH64_digest(state.get()))
    throw Error(where + ": checksum mismatch (the file is corrupt)");
  t.validate(where);
  return t;
}

}  // namespace tokenfab
