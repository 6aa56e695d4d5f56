#pragma once
// Roofline: how close a device's steps run to the machine's physical limits. Two limits are
// measured on the host — memory bandwidth and the model's own matmul throughput — and each step's
// measured compute time is set against
//   memory-bound time  = bytes the step must read ÷ bandwidth
//   compute-bound time = multiply-accumulates the step must do ÷ peak MAC rate
// The larger of the two is the least time the step could have taken (`bound_s`).
//
// The step is described by plain numbers (StepWork) so this module does not depend on serving
// (serving depends on device); the UI copies them from StepSample (core/serving/engine.h).

#include <cstdint>

#include "core/model/llama_model.h"

namespace tokenfab {

// What one step computed (the fields of StepSample the roofline needs).
struct StepWork {
  int64_t rows = 0;                // tokens through the layers
  int64_t logit_rows = 0;          // rows through the LM head
  int64_t attended_positions = 0;  // Σ over rows of the positions each attends
  int64_t kv_positions = 0;        // Σ over sequences of their context (KV rows read once)
  double compute_s = 0.0;          // measured time inside the batched pass
};

struct RooflinePoint {
  double measured_s = 0.0;
  double memory_bound_s = 0.0;
  double compute_bound_s = 0.0;
  double bound_s = 0.0;  // max(memory_bound_s, compute_bound_s)
};

// Host read bandwidth, GB/s (1e9 bytes/s) with `threads` threads: a 256 MiB buffer (far beyond
// any cache) is touched once, then each thread sums its contiguous share of it as 64-bit words
// (four independent accumulators, so the loads, not the adds, are the limit); 5 repetitions, the
// fastest counts. Reading is what a decode step does with the weights, so read bandwidth is the
// relevant limit. Throws Error when threads < 1.
double measure_host_bandwidth_gbs(int threads);

// The model's own matmul kernel (kernels::matmul on the stored — usually int8 / Q8_0 — weights)
// on a large batch: the LM head matrix (n_vocab, n_embd) over 64 rows of random activations,
// after one warm-up run; best of 3. GMAC/s = 64 × n_vocab × n_embd / seconds / 1e9. Throws Error
// when threads < 1.
double measure_int8_peak_gmacs(const LlamaModel& model, int threads);
// Which CPU matmul kernels that peak is of: "avx512-vnni", "avx2" or "scalar" (what the
// kernels dispatch to on this machine, TOKENFAB_CPU_KERNELS applied).
const char* cpu_matmul_kernels();

// Multiply-accumulates of one layer's matrices per row: wq, wk, wv, wo, gate, up, down.
int64_t layer_matrix_elements(const HParams& hp);

// The limits of one step (pure arithmetic):
//   bytes = weight_bytes + kv_positions × 2 (K, V) × n_layer × kv_dim × 2 (fp16)
//   MACs  = rows × n_layer × layer_matrix_elements
//         + logit_rows × n_vocab × n_embd              (LM head)
//         + 2 × attended_positions × q_dim × n_layer   (QKᵀ and the weighted sum of V)
//   memory_bound_s = bytes / (bandwidth_gbs × 1e9); compute_bound_s = MACs / (peak_gmacs × 1e9)
// Norms, RoPE, softmax and sampling are left out (small next to the matmuls). A limit that is
// not positive gives a bound of 0.
RooflinePoint roofline(const StepWork& step, const HParams& hp, uint64_t weight_bytes,
                       double bandwidth_gbs, double peak_gmacs);

}  // namespace tokenfab
