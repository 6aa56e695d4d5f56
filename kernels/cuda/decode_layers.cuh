#pragma once
// Every layer of a step of decode rows (decode tokens, verified chains, draft trees; up to
// decode_layers_max_rows rows, no prompt chunk) in ONE cooperative kernel: the grid stays resident,
// one block per SM, and goes through each layer's five phases with a grid-wide barrier between
// them, where the layered path (gemv.cuh and paged_decode_attention.cuh) launches five kernels a
// layer:
//   1. q, k, v = wqkv · rmsnorm(x), RoPE on q and k, k and v into the paged pool (a warp per
//      output pair, the QKV GEMV's arithmetic and epilogue);
//   2. attention over the pool: a row's keys in chunks of kDecodeLayersSplitKeys, a lane per key,
//      dealt in order into at most kDecodeLayersMaxSplits splits (a chunk each up to 1,024 keys,
//      more beyond), a warp per (row, split) and query heads of one KV head (up to four, each
//      key's K and V read once for them) with a running softmax over its chunks; a row's last
//      split to finish combines the partial softmaxes;
//   3. x += wo · att;
//   4. h = silu(gate · rmsnorm(x)) · (up · rmsnorm(x));
//   5. x += w_down · h.
// While a layer runs, the grid prefetches the next layer's weights into L2 (layers of up to
// 16 MB), so that its products read them from there, and a block that reaches a barrier issues
// its warps' first loads of the next product's weights before it waits (they land while the grid
// finishes the phase). The products are the GEMV's warp arithmetic
// (gemv_warp.cuh), one warp per output pair, eight x rows at a time (more rows in groups of
// eight): a row's result does not depend on the step's row count, bit for bit, and matches the
// layered GEMV where that gives each warp whole rows (everything but its split-k matrices). Layer
// taps (the draft heads' features) are the layered path's (rmsnorm without a weight of each logit
// row), their sum of squares taken by one warp. BF16 weights only. Mirrors the CPU model runner to
// f32 rounding.
//
// With DecodeLayersArgs::tensor_cores the products run on tensor cores instead (mma.sync, BF16
// weights times x as two BF16 terms, f32 sums; decode_layers.cu says how): a block per tile of 16
// weight rows, its warps splitting k, so that a step of many rows (a draft tree, a batch of
// requests) costs little more than a step of one. A row's values still do not depend on the
// step's row count, but they are not the GEMV's bits (another order of sums, x in 16 bits of
// mantissa), so the two variants are not mixed within a run.

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/paged_decode_attention.cuh"

namespace tokenfab::kernels {

inline constexpr int kDecodeLayersSplitKeys = 32;  // keys per attention chunk: a lane per key
inline constexpr int kDecodeLayersMaxSplits = 32;  // attention splits per (row, head), at most
// Rows a step may have with the GEMV's products (a draft tree of 64 nodes with its root, and
// another request's besides; more rows would each cost a pass over the weights' cache lines), and
// with tensor cores (a batch of 256 requests).
inline constexpr int kDecodeLayersMaxGemvRows = 128;
inline constexpr int kDecodeLayersMaxRows = 256;

constexpr int decode_layers_max_rows(bool tensor_cores) {
  return tensor_cores ? kDecodeLayersMaxRows : kDecodeLayersMaxGemvRows;
}

// One layer's device pointers.
struct DecodeLayer {
  const float* attn_norm = nullptr;     // (n_embd)
  const float* ffn_norm = nullptr;      // (n_embd)
  const uint16_t* wqkv = nullptr;       // (q_dim + 2·kv_dim, n_embd) bf16: wq, wk, wv
  const uint16_t* wo = nullptr;         // (n_embd, q_dim) bf16
  const uint16_t* w_gate_up = nullptr;  // (2·n_ff, n_embd) bf16: w_gate, then w_up
  const uint16_t* w_down = nullptr;     // (n_embd, n_ff) bf16
  uint16_t* k_pool = nullptr;           // (n_blocks, n_kv_head, block_size, head_dim) fp16 bits
  uint16_t* v_pool = nullptr;
  // Null, or this layer's tap: rmsnorm(x) without a weight after the layer, of each logit row
  // (n_logit rows of n_embd floats).
  float* tap = nullptr;
};

// The phase clock's counters (DecodeLayersArgs::phase_ns): nanoseconds in each of a layer's five
// phases summed over layers and launches, then in the tail (the last layer's tap), then the
// launches counted.
inline constexpr int kDecodeLayersPhases = 5;
inline constexpr int kDecodeLayersTailSlot = kDecodeLayersPhases;
inline constexpr int kDecodeLayersLaunchSlot = kDecodeLayersPhases + 1;
inline constexpr int kDecodeLayersClockSlots = kDecodeLayersPhases + 2;

struct DecodeLayersArgs {
  const DecodeLayer* layers = nullptr;  // (n_layer) device memory
  int n_layer = 0;
  int m = 0;                  // rows, 1 … decode_layers_max_rows(tensor_cores)
  bool tensor_cores = false;  // the products on tensor cores (above), not the GEMV's warps
  int n_embd = 0, n_head = 0, n_kv_head = 0, head_dim = 0, rot_dim = 0, n_ff = 0;
  int block_size = 0;
  float eps = 0.0f;
  float scale = 0.0f;  // the attention's 1/√head_dim
  // Activations, device f32, rows back to back: x (m, n_embd), in and out; qkv (m, q_dim +
  // 2·kv_dim); att (m, q_dim); ffn (m, n_ff).
  float* x = nullptr;
  float* qkv = nullptr;
  float* att = nullptr;
  float* ffn = nullptr;
  const float* rope = nullptr;         // (m, rot_dim): row r's cos[rot_dim/2], sin[rot_dim/2]
  const int32_t* kv_slots = nullptr;   // (m): block · block_size + offset of row r's K/V
  const CudaPagedRow* rows = nullptr;  // (m) the rows' keys, q_row < m (paged_decode_attention)
  const int32_t* paths = nullptr;      // may be null when no row has a path
  int32_t max_keys = 0;                // ≥ every row's n_ctx + path_len
  // The taps' rows: n_logit rows, row i from x row logit_rows[i] (null: row i).
  int n_logit = 0;
  const int32_t* logit_rows = nullptr;
  // Scratch: the attention's partials (decode_layers_workspace_floats), its per-(row, head)
  // counters (m · n_head ints, zero before the call and left zero), and the grid barrier's
  // counter (one unsigned, zeroed by the launcher on the stream before each launch).
  float* partials = nullptr;
  int64_t partial_floats = 0;
  int32_t* counts = nullptr;
  int64_t count_ints = 0;
  unsigned* barrier = nullptr;
  // Null, or kDecodeLayersClockSlots counters that block 0's first thread adds its clock
  // (%globaltimer) to: each phase from the barrier that starts it to the one that ends it (the
  // slowest block's time), so a step's time by phase.
  unsigned long long* phase_ns = nullptr;
};

// Whether the fused kernel takes a model of this shape: head_dim a multiple of 64 up to
// kPagedDecodeMaxHeadDim, n_head a multiple of n_kv_head, n_embd, q_dim and n_ff multiples of 8.
bool decode_layers_supported(int n_embd, int n_head, int n_kv_head, int head_dim, int n_ff);

// Floats of attention partials a call of m rows and up to max_keys keys needs.
int64_t decode_layers_workspace_floats(int64_t m, int n_head, int head_dim, int32_t max_keys);

// The grid the kernel runs with on `device` with `sms` SMs to use (0: all of them): one block per
// SM when one fits there and the device can launch cooperative kernels, else 0 (not available).
// Throws std::runtime_error when the device cannot be queried.
int decode_layers_grid(int device, int sms);

// Runs every layer for a.m rows on `stream` with `grid` blocks (decode_layers_grid): zeroes the
// barrier counter, then one cooperative launch. Throws std::invalid_argument for a shape the
// kernel does not take or a short workspace, std::runtime_error if the launch fails.
void launch_decode_layers(const DecodeLayersArgs& a, int grid, cudaStream_t stream);

}  // namespace tokenfab::kernels
