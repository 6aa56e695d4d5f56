#pragma once
// A model's weights on one GPU (the CUDA backend, cuda_model.cpp): the matrices in BF16 for
// every product, whatever the file's type (each dequantized on the GPU at load, bit for bit as
// kernels::dequantize_row, then rounded to BF16), and with blocks (CudaOptions::block_gemv) the
// Q4_0, Q4_1 and Q8_0 ones also in the quantized GEMV's layout (the other types have no such
// form: Q5_0/Q5_1, the K-quants and IQ4 keep their BF16 copy alone); the token embedding in the
// file's type, each token's row decoded on the device (kernels/cuda/embedding.cuh). One copy per
// (model, GPU, blocks or not), shared by the devices (partitions) that run it there. A family's
// fused matrices (phi3's attn_qkv, gate·up in ffn_up) are the loader's row views, uploaded as the
// separate matrices they hold. CUDA builds only.

#include <cuda_runtime.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/device/cuda_memory.h"
#include "core/model/llama_model.h"
#include "kernels/cuda/gemv.cuh"

namespace tokenfab::cuda_backend {

// A matrix in the quantized GEMV's layout (kernels/cuda/gemv_blocks.h); format kBf16 when it has
// none (its type has no quantized form, or the device does not keep them).
struct CudaBlocks {
  kernels::GemvWeights format = kernels::GemvWeights::kBf16;
  DeviceArray<uint8_t> q;
  DeviceArray<uint32_t> scales;

  // args' weights as these blocks, when there are any.
  void use_in(kernels::GemvArgs& args) const {
    kernels::use_gemv_blocks(args, format, q.get(), scales.get());
  }
};

struct CudaLayer {
  DeviceArray<float> attn_norm, ffn_norm;
  // The family's extra vectors (LayerWeights; empty where the family has none): the Q/K/V biases
  // back to back (q_dim + 2·kv_dim), the Q and K heads' norms (head_dim each), the post-norms
  // (n_embd each).
  DeviceArray<float> qkv_bias, q_norm, k_norm, post_attn_norm, post_ffn_norm;
  DeviceArray<uint16_t> wqkv;       // (q_dim + 2·kv_dim, n_embd): wq, then wk, then wv
  DeviceArray<uint16_t> w_gate_up;  // (2·n_ff, n_embd): w_gate, then w_up
  DeviceArray<uint16_t> wo, w_down;
  CudaBlocks qkv_blocks, gate_up_blocks, wo_blocks, down_blocks;  // CudaOptions::block_gemv
};

// One model's weights on one GPU, shared by the devices (partitions) that run it there.
struct CudaWeights {
  int device = 0;
  int embd_type = 0;
  DeviceArray<uint8_t> embd;  // token_embd in the file's type and layout
  std::vector<CudaLayer> layers;
  DeviceArray<float> output_norm;
  DeviceArray<uint16_t> lm_head;  // (n_vocab, n_embd)
  CudaBlocks lm_head_blocks;
  ~CudaWeights() {
    cudaSetDevice(device);
    layers.clear();
  }
};

// The weights of (model, GPU index, blocks) when some device holds them now, else null.
std::shared_ptr<const CudaWeights> resident_weights(const LlamaModel& model, int index,
                                                    bool blocks);

// The weights of (model, GPU index, blocks): the resident copy, or uploaded now on `stream` (the
// current device must be that GPU; `device` names it in errors). Held while any device holds them.
std::shared_ptr<const CudaWeights> shared_weights(const LlamaModel& model, int index, bool blocks,
                                                  const std::string& device, cudaStream_t stream);

}  // namespace tokenfab::cuda_backend
