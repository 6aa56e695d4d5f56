#include "core/device/device.h"

#include <algorithm>
#include <atomic>
#include <charconv>
#include <cmath>
#include <limits>
#include <utility>

#include "core/common/error.h"
#include "core/speculative/draft_head.h"
#include "kernels/cpu/ops.h"

namespace tokenfab {

std::string DeviceSpec::name() const {
  const char* part = partition == DevicePartition::kPrefill  ? "/prefill"
                     : partition == DevicePartition::kDecode ? "/decode"
                                                             : "";
  return std::string(kind == DeviceKind::kCpu ? "cpu" : "cuda") + ":" + std::to_string(index) +
         part;
}

std::vector<DeviceSpec> parse_device_list(std::string_view text, std::string_view flag) {
  const std::string where = std::string(flag) + " \"" + std::string(text) + "\": ";
  std::vector<DeviceSpec> devices;
  size_t start = 0;
  while (start <= text.size()) {
    const size_t comma = std::min(text.find(',', start), text.size());
    std::string_view item = text.substr(start, comma - start);
    while (!item.empty() && item.front() == ' ') item.remove_prefix(1);
    while (!item.empty() && item.back() == ' ') item.remove_suffix(1);
    start = comma + 1;
    if (item.empty()) throw Error(where + "empty device name (expected e.g. cpu:0,cpu:1)");
    const size_t colon = item.find(':');
    const std::string_view kind = item.substr(0, colon);
    DeviceSpec d;
    if (kind == "cpu") {
      d.kind = DeviceKind::kCpu;
    } else if (kind == "cuda") {
#if TOKENFAB_HAVE_CUDA
      d.kind = DeviceKind::kCuda;
#else
      throw Error(where + "this build has no CUDA backend (it is built where nvcc is found); " +
                  "use cpu:N");
#endif
    } else {
      throw Error(where + "unknown device kind \"" + std::string(kind) +
                  "\" (expected cpu:N or cuda:N)");
    }
    if (colon != std::string_view::npos) {
      const std::string_view index = item.substr(colon + 1);
      const auto r = std::from_chars(index.data(), index.data() + index.size(), d.index);
      if (index.empty() || r.ec != std::errc() || r.ptr != index.data() + index.size() ||
          d.index < 0 || d.index > 63)
        throw Error(where + "bad device index \"" + std::string(index) + "\" (expected 0..63)");
    }
    for (const DeviceSpec& e : devices)
      if (e == d) throw Error(where + d.name() + " is listed twice");
    devices.push_back(d);
  }
  return devices;
}

std::string device_list_name(const std::vector<DeviceSpec>& devices) {
  std::string s;
  for (const DeviceSpec& d : devices) s += (s.empty() ? "" : ",") + d.name();
  return s;
}

std::vector<int> divide_threads(int total, int n_devices) {
  if (n_devices < 1) throw Error("no devices to divide threads between");
  if (total < n_devices)
    throw Error("--threads " + std::to_string(total) + " cannot give each of the " +
                std::to_string(n_devices) + " devices a thread of its own");
  std::vector<int> out(static_cast<size_t>(n_devices), total / n_devices);
  for (int i = 0; i < total % n_devices; ++i) ++out[static_cast<size_t>(i)];
  return out;
}

int32_t kv_blocks_for_budget(const HParams& hp, int32_t block_size, int64_t kv_mem_mb,
                             int32_t kv_blocks) {
  if (kv_blocks > 0) return kv_blocks;
  const uint64_t per_block = KvStorage::bytes_per_block(hp, block_size);
  const uint64_t n =
      static_cast<uint64_t>(std::max<int64_t>(kv_mem_mb, 0)) * (1ull << 20) / per_block;
  if (n < 1)
    throw Error("--kv-mem " + std::to_string(kv_mem_mb) + " MiB holds no KV block (one block of " +
                std::to_string(block_size) + " tokens takes " + std::to_string(per_block) +
                " bytes for this model)");
  return static_cast<int32_t>(std::min<uint64_t>(n, 1u << 30));
}

CpuDevice::CpuDevice(DeviceSpec spec, const LlamaModel& model, int threads, int32_t kv_blocks,
                     int32_t block_size)
    : CpuDevice(spec, model, threads,
                std::make_shared<KvStorage>(model.hparams(), kv_blocks, block_size, spec.name())) {}

CpuDevice::CpuDevice(DeviceSpec spec, const LlamaModel& model, int threads,
                     std::shared_ptr<KvStorage> storage)
    : spec_(spec),
      model_(model),
      pool_(threads),
      storage_(std::move(storage)),
      runner_(model, pool_, *storage_) {}

void check_partition_specs(const DeviceSpec& prefill, const DeviceSpec& decode) {
  if (prefill.partition != DevicePartition::kPrefill ||
      decode.partition != DevicePartition::kDecode || prefill.kind != decode.kind ||
      prefill.index != decode.index)
    throw Error(prefill.name() + " and " + decode.name() +
                " are not the prefill and decode partitions of one device");
}

std::pair<std::unique_ptr<Device>, std::unique_ptr<Device>> make_cpu_partitions(
    DeviceSpec prefill, DeviceSpec decode, const LlamaModel& model, int prefill_threads,
    int decode_threads, int32_t kv_slots, int32_t block_size) {
  check_partition_specs(prefill, decode);
  if (prefill.kind != DeviceKind::kCpu) throw Error(prefill.name() + " is not a CPU device");
  DeviceSpec whole = prefill;
  whole.partition = DevicePartition::kWhole;
  auto storage = std::make_shared<KvStorage>(model.hparams(), kv_slots, block_size, whole.name());
  return {std::make_unique<CpuDevice>(prefill, model, prefill_threads, storage),
          std::make_unique<CpuDevice>(decode, model, decode_threads, storage)};
}

void Device::run_greedy(std::span<const BatchSequence> batch, std::vector<int32_t>& argmax,
                        std::vector<float>* hidden) {
  std::vector<float> logits;
  run(batch, logits, hidden);
  const int64_t n_vocab = model().hparams().n_vocab;
  argmax.resize(logits.size() / static_cast<size_t>(n_vocab));
  for (size_t r = 0; r < argmax.size(); ++r)
    argmax[r] = static_cast<int32_t>(kernels::argmax(logits.data() + r * n_vocab, n_vocab));
}

void Device::run_filtered(std::span<const BatchSequence> batch,
                          std::span<const kernels::CandidateFilter> filters, FilteredRows& rows,
                          std::vector<float>* hidden) {
  (void)filters;
  std::vector<float> logits;
  run(batch, logits, hidden);
  rows.assign_whole(std::move(logits), model().hparams().n_vocab);
}

void Device::medusa_top(std::span<const MedusaProposal> proposals, std::span<const int32_t> wanted,
                        std::vector<std::vector<int32_t>>& best) {
  const int64_t n_embd = model().hparams().n_embd;
  std::vector<float> z;
  for (const MedusaProposal& p : proposals)
    for (int32_t level = 0; level < p.levels; ++level) {
      const size_t at = z.size();
      z.resize(at + static_cast<size_t>(n_embd));
      p.head->residual(level, p.hidden, 1, z.data() + at);
    }
  lm_head_top(z.data(), static_cast<int64_t>(z.size()) / n_embd, wanted, best);
}

void Device::mtp_propose(std::span<const MtpProposal> proposals,
                         std::vector<std::vector<int32_t>>& drafts,
                         std::vector<std::vector<int32_t>>& parents) {
  drafts.assign(proposals.size(), {});
  parents.assign(proposals.size(), {});
  for (size_t i = 0; i < proposals.size(); ++i) {
    const MtpProposal& p = proposals[i];
    if (p.best_first)
      p.head->mtp_propose_best_first(model(), p.hidden, p.last, p.widths, p.max_nodes, drafts[i],
                                     parents[i]);
    else
      p.head->mtp_propose(model(), p.hidden, p.last, p.widths, p.max_nodes, drafts[i], parents[i]);
  }
}

void Device::lm_head_top(const float* z, int64_t n, std::span<const int32_t> wanted,
                         std::vector<std::vector<int32_t>>& best) {
  std::vector<float> logits;
  lm_head(z, n, logits);
  const int64_t n_vocab = model().hparams().n_vocab;
  best.assign(static_cast<size_t>(n), {});
  parallel_for(n, [&](int64_t r) {
    const float* row = logits.data() + r * n_vocab;
    const int32_t k = wanted[static_cast<size_t>(r)];
    best[static_cast<size_t>(r)] =
        k == 1 ? std::vector<int32_t>{static_cast<int32_t>(kernels::argmax(row, n_vocab))}
               : top_tokens(row, n_vocab, k);
  });
}

std::vector<int32_t> top_tokens(const float* logits, int64_t n_vocab, int32_t n) {
  if (n <= 0) return {};
  // (logit, token) of the n best so far, best first; ties keep the lower token id.
  std::vector<std::pair<float, int32_t>> top;
  for (int64_t t = 0; t < n_vocab; ++t) {
    // NaN ranks as -inf (as the sampler and the GPU's candidates read it).
    const float x = std::isnan(logits[t]) ? -std::numeric_limits<float>::infinity() : logits[t];
    if (static_cast<int32_t>(top.size()) == n && !(x > top.back().first)) continue;
    auto it = std::upper_bound(top.begin(), top.end(), x,
                               [](float v, const auto& e) { return v > e.first; });
    top.insert(it, {x, static_cast<int32_t>(t)});
    if (static_cast<int32_t>(top.size()) > n) top.pop_back();
  }
  std::vector<int32_t> out;
  for (const auto& e : top) out.push_back(e.second);
  return out;
}

void parallel_for_on(kernels::ThreadPool& pool, int64_t n, const std::function<void(int64_t)>& fn) {
  if (n <= 1 || pool.size() == 1) {
    for (int64_t i = 0; i < n; ++i) fn(i);
    return;
  }
  std::atomic<int64_t> next{0};
  pool.run([&](int, int) {
    for (int64_t i = next.fetch_add(1); i < n; i = next.fetch_add(1)) fn(i);
  });
}

}  // namespace tokenfab
