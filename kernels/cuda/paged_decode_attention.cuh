#pragma once
// Attention over the fp16 paged KV pool on the GPU, for decode rows (and any row whose keys are a
// list of positions: causal chunk rows, draft-tree rows). Flash-decoding: each row's keys are cut
// into splits of kPagedDecodeSplitKeys; one block per (split, head, row) computes a partial
// softmax (its max, its sum of exponentials, its weighted sum of V), and the last of a row's
// splits to finish combines them (a row of one split is finished by its only block). A long
// context therefore spreads over many SMs even at batch 1, in one launch.
// Mirrors kernels::paged_attention (kernels/cpu/paged_attention.h) to f32 rounding.
//
// Declared with host-safe types only; the rows of a call are built on the host by
// flatten_paged_rows (kernels/cuda/paged_rows.h) from the same PagedSequence list the CPU takes.

#include <cuda_runtime.h>

#include <cstdint>

namespace tokenfab::kernels {

inline constexpr int kPagedDecodeSplitKeys = 256;  // keys per split (one partial softmax)
inline constexpr int kPagedDecodeMaxHeadDim = 256;

// One layer of a device's KV pool: fp16 bits, layout (n_blocks, n_kv_head, block_size, head_dim)
// for k and v, device memory (kernels::PagedKv's layout), and how the layer's queries attend, as
// kernels::PagedKv says: a sliding window (> 0: a row at position p sees only the keys at
// (p − window, p]) and a score soft-cap (> 0: each score s becomes softcap · tanh(s / softcap)).
// Both 0 (plain causal attention, the Llama layers) launch the kernels that ran on the last GPU
// run; either set launches their variant that applies them (not yet run on a GPU).
struct CudaPagedKv {
  const uint16_t* k;
  const uint16_t* v;
  int block_size;
  int n_kv_head;
  int head_dim;
  int32_t window = 0;
  float softcap = 0.0f;
};

// One query row, device memory. Its keys are positions [0, n_ctx) followed by
// paths[path_begin, path_begin + path_len) (a draft-tree row's ancestors and itself, root first;
// path_len 0 for causal rows, whose n_ctx is pos0 + t + 1). Key i stands at position i of the
// row's chain (a tree row's path entry j at n_ctx + j, its depth), so a window keeps the keys
// [n_ctx + path_len − window, n_ctx + path_len), as the CPU keeps a tree row's.
struct CudaPagedRow {
  const int32_t* blocks;  // the sequence's block table, device memory
  int64_t q_row;          // row of q and out
  int32_t n_ctx;
  int32_t path_begin;
  int32_t path_len;
  int32_t reserved = 0;  // keeps the struct's size a multiple of 8 on host and device alike
};

// The checks both paged attention launchers make of the pool and the heads: throws
// std::invalid_argument, prefixed with `where`, for head_dim outside 1..kPagedDecodeMaxHeadDim,
// n_head not a positive multiple of n_kv_head (or above 65535), a block_size below 1, or a
// negative window or soft-cap.
void check_paged_attention_shape(const CudaPagedKv& kv, int n_head, const char* where);

// Floats of partial results a call needs: (n_rows, n_head, n_splits) maxima and sums plus
// (n_rows, n_head, n_splits, head_dim) partial outputs, n_splits = ⌈max_keys / split keys⌉.
int64_t paged_decode_workspace_floats(int64_t n_rows, int n_head, int head_dim, int32_t max_keys);

// A call's scratch, device memory: the partial results (at least paged_decode_workspace_floats),
// and one counter per (row, head) of the splits that have written theirs (at least
// n_rows · n_head ints). The counters are indexed by (row, head) alone and kept apart from the
// partials, whose layout changes with each call's shape; they must be zero before the first call
// (cudaMemset them when allocating), and every call leaves them zero again.
struct PagedDecodeWorkspace {
  float* partials = nullptr;
  int64_t partial_floats = 0;
  int32_t* counts = nullptr;
  int64_t count_ints = 0;
};

// q: (q rows, n_head, head_dim) device f32, q_stride floats between rows; out: same layout,
// out_stride. rows: (n_rows) device CudaPagedRow; paths: device int32 (may be null when no row
// has a path); max_keys: the largest n_ctx + path_len over the rows. Query head h reads kv head
// h / (n_head / kv.n_kv_head). workspace: the call's scratch (PagedDecodeWorkspace).
// Asynchronous on `stream`; with `overlap` (compute capability 9.0 or later) the launch may start
// while the previous kernel runs, reading only rows, paths and block tables (and prefetching the
// keys' K and V rows into L2) until that kernel has finished (launch_overlap.cuh). Throws
// std::invalid_argument for a bad shape (head_dim above kPagedDecodeMaxHeadDim, n_head not a
// multiple of n_kv_head, a short workspace, more than 65535 rows or n_head above 65535),
// std::runtime_error if a launch fails. With out_bf16 the output goes there instead, as bf16
// bits (kernels::fp32_to_bf16's rounding of what out would hold), same layout and out_stride, and
// out is not written: the input of a GEMM.
void launch_paged_decode_attention(const CudaPagedKv& kv, const CudaPagedRow* rows, int64_t n_rows,
                                   const int32_t* paths, int32_t max_keys, const float* q,
                                   int64_t q_stride, float* out, int64_t out_stride, int n_head,
                                   float scale, const PagedDecodeWorkspace& workspace,
                                   cudaStream_t stream, bool overlap = false,
                                   uint16_t* out_bf16 = nullptr);

}  // namespace tokenfab::kernels
