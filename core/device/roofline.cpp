#include "core/device/roofline.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "core/common/error.h"
#include "kernels/cpu/cpu_features.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/thread_pool.h"

namespace tokenfab {

namespace {

constexpr size_t kBandwidthBytes = size_t{256} << 20;
constexpr int kBandwidthRepetitions = 5;
constexpr int64_t kPeakRows = 64;
constexpr int kPeakRepetitions = 3;

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

void require_threads(int threads, const char* what) {
  if (threads < 1)
    throw Error(std::string(what) + ": threads must be >= 1 (got " + std::to_string(threads) + ")");
}

}  // namespace

double measure_host_bandwidth_gbs(int threads) {
  require_threads(threads, "bandwidth measurement");
  const size_t n_words = kBandwidthBytes / sizeof(uint64_t);
  std::unique_ptr<uint64_t[]> buffer(new uint64_t[n_words]);  // (n_words)
  kernels::ThreadPool pool(threads);
  // First touch from the threads that will read, so each share's pages are faulted in before
  // timing.
  pool.run([&](int index, int n_threads) {
    int64_t begin = 0, end = 0;
    kernels::ThreadPool::split(static_cast<int64_t>(n_words), 8, index, n_threads, begin, end);
    for (int64_t i = begin; i < end; ++i) buffer[static_cast<size_t>(i)] = static_cast<uint64_t>(i);
  });
  std::vector<uint64_t> sums(static_cast<size_t>(threads));  // kept so the reads are not elided
  double best = std::numeric_limits<double>::infinity();
  for (int rep = 0; rep < kBandwidthRepetitions; ++rep) {
    const auto start = Clock::now();
    pool.run([&](int index, int n_threads) {
      int64_t begin = 0, end = 0;
      kernels::ThreadPool::split(static_cast<int64_t>(n_words), 8, index, n_threads, begin, end);
      const uint64_t* p = buffer.get();
      uint64_t a = 0, b = 0, c = 0, d = 0;
      int64_t i = begin;
      for (; i + 4 <= end; i += 4) {
        a += p[i];
        b += p[i + 1];
        c += p[i + 2];
        d += p[i + 3];
      }
      for (; i < end; ++i) a += p[i];
      sums[static_cast<size_t>(index)] += a + b + c + d;
    });
    best = std::min(best, seconds_since(start));
  }
  volatile uint64_t sink = 0;
  for (uint64_t s : sums) sink = sink + s;
  return static_cast<double>(kBandwidthBytes) / best / 1e9;
}

double measure_int8_peak_gmacs(const LlamaModel& model, int threads) {
  require_threads(threads, "matmul peak measurement");
  const HParams& hp = model.hparams();
  std::vector<float> x(static_cast<size_t>(kPeakRows * hp.n_embd));   // (kPeakRows, n_embd)
  std::vector<float> y(static_cast<size_t>(kPeakRows * hp.n_vocab));  // (kPeakRows, n_vocab)
  std::mt19937 rng(1234);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (float& v : x) v = normal(rng);
  kernels::ThreadPool pool(threads);
  kernels::ActivationScratch scratch;
  const kernels::MatmulJob job = matmul_job(model.output(), y.data(), hp.n_vocab);
  auto run_once = [&] {
    kernels::matmul(pool, {&job, 1}, x.data(), hp.n_embd, hp.n_embd, kPeakRows, scratch);
  };
  run_once();  // warm-up: scratch allocation, weights into whatever cache holds them
  double best = std::numeric_limits<double>::infinity();
  for (int rep = 0; rep < kPeakRepetitions; ++rep) {
    const auto start = Clock::now();
    run_once();
    best = std::min(best, seconds_since(start));
  }
  const double macs = static_cast<double>(kPeakRows) * static_cast<double>(hp.n_vocab) *
                      static_cast<double>(hp.n_embd);
  return macs / best / 1e9;
}

const char* cpu_matmul_kernels() {
  return kernels::kernel_isa_name();
}

int64_t layer_matrix_elements(const HParams& hp) {
  const int64_t attention = hp.q_dim() * hp.n_embd         // wq
                            + 2 * hp.kv_dim() * hp.n_embd  // wk, wv
                            + hp.n_embd * hp.q_dim();      // wo
  const int64_t ffn = 3 * hp.n_ff * hp.n_embd;             // gate, up, down
  return attention + ffn;
}

RooflinePoint roofline(const StepWork& step, const HParams& hp, uint64_t weight_bytes,
                       double bandwidth_gbs, double peak_gmacs) {
  RooflinePoint p;
  p.measured_s = step.compute_s;
  const double kv_bytes = static_cast<double>(step.kv_positions) * 2.0 *
                          static_cast<double>(hp.n_layer) * static_cast<double>(hp.kv_dim()) * 2.0;
  const double bytes = static_cast<double>(weight_bytes) + kv_bytes;
  const double macs = static_cast<double>(step.rows) * static_cast<double>(hp.n_layer) *
                          static_cast<double>(layer_matrix_elements(hp)) +
                      static_cast<double>(step.logit_rows) * static_cast<double>(hp.n_vocab) *
                          static_cast<double>(hp.n_embd) +
                      2.0 * static_cast<double>(step.attended_positions) *
                          static_cast<double>(hp.q_dim()) * static_cast<double>(hp.n_layer);
  if (bandwidth_gbs > 0) p.memory_bound_s = bytes / (bandwidth_gbs * 1e9);
  if (peak_gmacs > 0) p.compute_bound_s = macs / (peak_gmacs * 1e9);
  p.bound_s = std::max(p.memory_bound_s, p.compute_bound_s);
  return p;
}

}  // namespace tokenfab
