#pragma once
// The CUDA backend's Device: the model's weights and a paged KV pool in one GPU's memory, and one
// forward pass per planned batch on one CUDA stream, through the ops of kernels/cuda. The serving
// loop (core/serving/worker) drives it exactly as it drives a CpuDevice.
//
// Weights: the matrices are dequantized at load to BF16 (Q, K and V stacked into one matrix, gate
// and up into another), and with CudaOptions::block_gemv also kept in their quantized blocks for
// the decode GEMVs; norms stay f32; the token embedding stays in the file's type and is gathered
// by the embedding op. Batches of more than kernels::kGemvMaxRows rows multiply with
// cuBLASLt (BF16 inputs, FP32 accumulate): the activations between ops are f32 and are rounded to
// BF16 only on their way into a GEMM (the norms and SwiGLU write that bf16 directly). Smaller
// batches (decode steps) take the fused GEMVs of kernels/cuda/gemv.cuh, the norms, RoPE, KV store,
// SwiGLU and residual adds inside the products, over the BF16 weights or (block_gemv) the blocks.
// KV: fp16 in the same (n_blocks, n_kv_head, block_size, head_dim) layout per layer as the CPU's
// KvStorage, so the pool's blocks mean the same on both backends.
// Attention: causal chunks of 4 tokens or more through the tiled prefill kernel
// (paged_prefill_attention.cuh; one of its two kernels, CudaOptions::tiled_prompt_attention),
// decode rows and draft trees through the flash-decoding kernel (paged_decode_attention.cuh);
// verified chains of 4 to 8 rows through either (CudaOptions::chains_on_decode_kernel).
// Draft features (Device::set_draft_taps): after each tapped layer, the logit rows' residual
// stream RMS-normalised on the GPU, downloaded beside the final hidden state; an mtp head's first
// state from them (DraftHead::mtp_root) is made on the GPU, its W_f in BF16.
// Decode-only steps replay CUDA graphs, captured per row count and per 1,024 keys of context; on
// Hopper their GEMVs and attention overlap the previous kernel's tail (CudaOptions).
// Models of the families whose layers differ from plain Llama's run on layered kernels of their
// own, behind CudaOptions::families (not yet verified on a GPU); without it they are refused.
//
// This header is plain C++: it builds without CUDA, where make_cuda_device says so.

#include <cstdint>
#include <memory>
#include <optional>
#include <utility>

#include "core/device/device.h"

namespace tokenfab {

// Whether this binary was built with the CUDA backend.
bool cuda_backend_built();

// Bytes a CUDA device holds for the model's weights: the matrices in BF16 (the LM head too), the
// norms in f32, the token embedding in the file's type; with `block_gemv` (CudaOptions) also the
// quantized copies of the Q4_0, Q4_1 and Q8_0 matrices. Pure arithmetic; every build has it.
uint64_t cuda_weight_bytes(const LlamaModel& model, bool block_gemv = false);

// The weight bytes a one-row decode step reads: as cuda_weight_bytes, but each matrix once, in
// the form its GEMV reads (the quantized copy where block_gemv keeps one, else BF16).
uint64_t cuda_decode_weight_bytes(const LlamaModel& model, bool block_gemv);

// How a CUDA device launches its kernels and what its decode steps read. Graphs and overlapping
// launches change no output, bit for bit (tested); the other choices change only how the
// products or the attention round (BF16 copies or the file's blocks, the order of f32 sums).
struct CudaOptions {
  // Decode-only steps replay CUDA graphs; false runs every step's kernels directly (the reference
  // the graphs are tested against).
  bool graphs = true;
  // On GPUs of compute capability 9.0 or later, with kernels built for sm_90 or later
  // (kernels/cuda/overlap_support.cuh), our kernels of a step (the GEMVs, attention,
  // norms, RoPE, KV store, SwiGLU, residual adds; not cuBLASLt's GEMMs) start while the kernel
  // before them finishes (programmatic dependent launch): each issues its weight loads, or reads
  // its block tables, first and waits for the previous kernel's results only after that. False
  // launches every kernel after the previous one has finished.
  bool overlap_launches = true;
  // Few-row steps (decode) multiply the file's own Q4_0, Q4_1 and Q8_0 blocks, kept on the GPU
  // beside the BF16 copies that prefill's GEMMs use (kernels/cuda/gemv_blocks.h): fewer bytes
  // per step (0.625 or 1.125 a weight instead of 2), the file's exact weights, more memory.
  // Matrices of other types, or stacked from parts of different types, stay BF16.
  bool block_gemv = false;
  // The next four choices (gemv_split_k … fused_epilogues) are off until a GPU run verifies them:
  // off runs the code of the last GPU run (2026-12-04, commit d77f5a4), on the code written since,
  // and the gpu tests hold the two settings to each other (tests/gpu; tools/gpu_check.sh measures
  // both).
  //
  // Few-row steps multiply narrow matrices of long rows (kernels::gemv_split_k: an 8B model's QKV,
  // o and down products) with each row's k split over a block's four warps, for four times the
  // loads in flight; false gives each warp whole rows, as wide matrices always are (and as every
  // matrix was on the last GPU run). A row's sums are then added in another order (f32 rounding).
  bool gemv_split_k = false;
  // Prompt chunks' attention in the tiled kernel that scores a key tile's 32 keys side by side
  // (kernels::PrefillAttentionKernel::kTiled); false: the kernel that scores one key at a time
  // (kKeyByKey, 19 ms for a 512-token prompt of SmolLM2-135M on the last run). The same attention
  // to f32 rounding.
  bool tiled_prompt_attention = false;
  // Verified chains (a sequence's rows of a step that wants every row's logits) of up to
  // kernels::kGemvMaxRows rows go to the decode attention kernel, row by row, and steps of decode
  // rows and such chains replay CUDA graphs: a verified row is then, bit for bit, the same token
  // decoded alone (greedy speculation lossless; a chain of 4+ rows in the prompt kernel took
  // 18 ms a step on the last run, and greedy outputs with a head parted from those without at a
  // near-tie). False: as on the last run, chains of 4 rows or more are attended as prompt chunks
  // and only steps of one row a sequence replay graphs. On wherever the fused decode layers run,
  // whose attention takes chains row by row (fused_layers).
  bool chains_on_decode_kernel = false;
  // Many-row steps (cuBLASLt's GEMMs) with their glue in fewer launches, ten a layer: the o and
  // down GEMMs add their products into the residual stream themselves (beta = 1), the RoPE launch
  // stores the rows' K and V into the pool, and the attention kernels write the o GEMM's input in
  // BF16. False: fourteen a layer, as on the last run: each product into a scratch buffer and a
  // residual add after it, a KV store kernel after RoPE, the attention in f32 and a conversion to
  // BF16. The same values bit for bit but for the residual adds, whose f32 sum cuBLASLt may form
  // in another order (an algorithm that reduces split-k partials into C).
  bool fused_epilogues = false;
  // Steps of up to kernels::kDecodeLayersMaxGemvRows (128) decode rows (no prompt chunk: decode
  // tokens, verified chains, draft trees) run all their layers in one cooperative kernel
  // (kernels/cuda/decode_layers.cuh: one launch a step, grid-wide barriers between a layer's
  // five phases, the next layer's weights prefetched into L2) instead of five launches a layer.
  // BF16 decode weights only (not with block_gemv), and not in partitions that share their SMs;
  // elsewhere the layered kernels run. The products are the layered GEMV's arithmetic; the
  // attention splits its keys otherwise, so outputs agree with the layered path to f32 rounding,
  // and a row's values still do not depend on the step's row count, now up to 128 rows: a
  // verified chain or tree of more than 8 rows is then verified exactly too.
  bool fused_layers = false;
  // With fused_layers: the fused kernel's products on tensor cores (mma.sync, BF16 weights times
  // x as two BF16 terms, f32 sums; kernels/cuda/decode_layers.cuh) instead of the GEMV's
  // arithmetic, and steps of up to kernels::kDecodeLayersMaxRows (256) rows: many rows (a draft
  // tree, a batch of requests) cost little more than one. A row's values still do not depend on
  // the step's row count (verification stays exact), but differ from the layered kernels' and
  // the GEMV variant's to f32 rounding.
  bool fused_tensor_cores = false;
  // A GPU serving as both the prefill and the decode device (DevicePartition): the SMs its
  // decode partition gets to itself, in a green context, prefill getting the rest
  // (core/device/cuda_partition.h). 0: no split; the partitions share the SMs and differ by
  // stream priority. Both partitions must be given the same value.
  int decode_sms = 0;
  // Models whose layers differ from the plain Llama layers (differences_from_llama: Llama 3's
  // frequency factors, Qwen 2/3, Gemma 2/3, Phi-3) run on the layered kernels with their
  // family's features, as the CPU computes them (TransformerPass): RoPE on halves and per layer,
  // Q/K/V biases, Q/K norms, post-norms, GELU gating, the embedding scale, the attention scale,
  // soft-caps and sliding windows. Every step of such a model takes the layered kernels (the
  // fused decode layers decline it), each layer in separate launches: norm, QKV product, the
  // family's Q/K preparation with the KV store, attention, o product, (post-norm,) residual
  // add, and the same for the FFN. Off until a GPU run verifies it (not yet run on a GPU): such
  // a model is then refused, naming --cuda-families on. Plain Llama models run the same code
  // either way.
  bool families = false;
};

// A CUDA device for `spec` (kind kCuda): the weights uploaded, a KV pool of kv_blocks blocks of
// block_size tokens in GPU memory, and `threads` host threads for sampling. Throws Error in a
// build without CUDA, for a device index the machine does not have, and when the weights and the
// pool do not fit in the device's free memory (naming both sizes).
std::unique_ptr<Device> make_cuda_device(DeviceSpec spec, const LlamaModel& model, int threads,
                                         int32_t kv_blocks, int32_t block_size,
                                         CudaOptions options = {});

// The blocks of the cooperative kernel that runs `device`'s few-row steps (CudaOptions::
// fused_layers), or 0 when they run the layered kernels (not asked for, or not available there:
// block weights, shared SMs, no cooperative launch); 0 for a device that is not a CUDA device.
int cuda_fused_layers_grid(const Device& device);

// Where the fused decode layers' steps spend their time: per step, each phase of a layer summed
// over the layers, as block 0 of the kernel clocks it (from the grid barrier that starts the
// phase to the one that ends it: the slowest block's time), averaged over the fused steps run
// since the device was made or last asked.
struct FusedPhaseTimes {
  int64_t steps = 0;
  double qkv_us = 0;  // with the draft heads' taps of the layer before
  double attention_us = 0;
  double o_us = 0;
  double gate_up_us = 0;
  double down_us = 0;
  double tail_us = 0;  // the last layer's taps
};

// `device`'s FusedPhaseTimes, the sums then restarted; nullopt for a device that does not run
// the fused decode layers (or has run no fused step since). Waits for the device's work.
std::optional<FusedPhaseTimes> cuda_fused_phase_times(Device& device);

// The GPU time of `device`'s last forward pass (a step's uploads, kernels and downloads on its
// stream, CUDA events around them), in milliseconds; nullopt for a device that is not a CUDA
// device or has run no step. Set against the step's wall time it shows what the host adds.
std::optional<double> cuda_last_step_gpu_ms(const Device& device);

// The two partitions of one GPU (specs of one index, DevicePartition kPrefill and kDecode): CUDA
// devices with a stream each, one copy of the weights, and one KV storage of kv_slots blocks that
// their workers' pools divide (core/kvcache/kv_slots.h). Throws as make_cuda_device does, and
// for specs that are not two partitions of one GPU.
std::pair<std::unique_ptr<Device>, std::unique_ptr<Device>> make_cuda_partitions(
    DeviceSpec prefill, DeviceSpec decode, const LlamaModel& model, int prefill_threads,
    int decode_threads, int32_t kv_slots, int32_t block_size, CudaOptions options = {});

}  // namespace tokenfab
