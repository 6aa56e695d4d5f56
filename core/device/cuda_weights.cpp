// Weight bytes on a GPU (cuda_model.h), in every build; the upload of a model's weights to a GPU
// (cuda_weights.h), in CUDA builds.

#include <initializer_list>

#include "core/device/cuda_model.h"
#include "kernels/cuda/gemv_blocks.h"

#if TOKENFAB_HAVE_CUDA
#include <algorithm>
#include <map>
#include <mutex>
#include <tuple>
#include <vector>

#include "core/device/cuda_weights.h"
#include "kernels/cuda/dequantize.cuh"
#include "kernels/cuda/f32_to_bf16.cuh"
#endif

namespace tokenfab {

namespace {

// Calls f(parts) for each matrix the GPU holds, stacked as it holds them: QKV, gate·up, o, down
// of every layer, then the LM head.
template <class F>
void for_each_gpu_matrix(const LlamaModel& model, F f) {
  for (const LayerWeights& l : model.layers()) {
    f({&l.wq, &l.wk, &l.wv});
    f({&l.w_gate, &l.w_up});
    f({&l.wo});
    f({&l.w_down});
  }
  f({&model.output()});
}

uint64_t bf16_bytes(std::initializer_list<const WeightMatrix*> parts) {
  uint64_t bytes = 0;
  for (const WeightMatrix* m : parts)
    bytes += static_cast<uint64_t>(m->rows) * static_cast<uint64_t>(m->cols) * 2;
  return bytes;
}

// The bytes of the parts' quantized GEMV copy (kernels/cuda/gemv_blocks.h), 0 when they have none.
uint64_t block_bytes(std::initializer_list<const WeightMatrix*> parts) {
  const kernels::GemvWeights format = kernels::gemv_format((*parts.begin())->type);
  uint64_t bytes = 0;
  for (const WeightMatrix* m : parts) {
    if (kernels::gemv_format(m->type) != format ||
        !kernels::gemv_blocks_representable(m->type, m->data, m->rows, m->cols))
      return 0;
    bytes += static_cast<uint64_t>(m->rows) * static_cast<uint64_t>(m->cols / kernels::kQK) *
             (kernels::gemv_block_quant_bytes(format) + sizeof(uint32_t));
  }
  return format == kernels::GemvWeights::kBf16 ? 0 : bytes;
}

// The norms (the family's biases and extra norms too) and the token embedding, which the GPU
// holds as they are.
uint64_t other_weight_bytes(const LlamaModel& model) {
  const auto n_embd = static_cast<uint64_t>(model.hparams().n_embd);
  uint64_t floats = 0;
  for (const LayerWeights& l : model.layers())
    floats += l.bq.size() + l.bk.size() + l.bv.size() + l.q_norm.size() + l.k_norm.size() +
              l.post_attn_norm.size() + l.post_ffn_norm.size();
  return (2 * static_cast<uint64_t>(model.layers().size()) + 1) * n_embd * sizeof(float) +
         floats * sizeof(float) + model.token_embedding().bytes();
}

}  // namespace

uint64_t cuda_weight_bytes(const LlamaModel& model, bool block_gemv) {
  uint64_t bytes = other_weight_bytes(model);
  for_each_gpu_matrix(model, [&](std::initializer_list<const WeightMatrix*> parts) {
    bytes += bf16_bytes(parts) + (block_gemv ? block_bytes(parts) : 0);
  });
  return bytes;
}

uint64_t cuda_decode_weight_bytes(const LlamaModel& model, bool block_gemv) {
  uint64_t bytes = other_weight_bytes(model);
  for_each_gpu_matrix(model, [&](std::initializer_list<const WeightMatrix*> parts) {
    const uint64_t blocks = block_gemv ? block_bytes(parts) : 0;
    bytes += blocks > 0 ? blocks : bf16_bytes(parts);
  });
  return bytes;
}

#if TOKENFAB_HAVE_CUDA

namespace cuda_backend {

namespace {

// Uploads a model's weights to the current GPU on `stream`, dequantizing each matrix (of any
// WeightType) to BF16 through staging buffers sized for the largest one; returns when they are
// in.
class WeightUploader {
 public:
  // blocks: also upload each Q4_0, Q4_1 and Q8_0 matrix in the quantized GEMV's layout.
  WeightUploader(const LlamaModel& model, std::string device, cudaStream_t stream, bool blocks)
      : model_(model),
        hp_(model.hparams()),
        device_(std::move(device)),
        stream_(stream),
        blocks_(blocks) {}

  std::shared_ptr<CudaWeights> upload(int index) {
    auto w = std::make_shared<CudaWeights>();
    w->device = index;
    const int64_t n_embd = hp_.n_embd, q_dim = hp_.q_dim(), kv_dim = hp_.kv_dim();
    uint64_t max_bytes = model_.output().bytes();
    int64_t max_elems = model_.output().rows * model_.output().cols;
    for (const LayerWeights& l : model_.layers())
      for (const WeightMatrix* m : {&l.wq, &l.wk, &l.wv, &l.wo, &l.w_gate, &l.w_up, &l.w_down}) {
        max_bytes = std::max(max_bytes, m->bytes());
        max_elems = std::max(max_elems, m->rows * m->cols);
      }
    raw_.reserve(max_bytes, device_, "weight staging");
    f32_.reserve(static_cast<size_t>(max_elems), device_, "weight staging");

    const WeightMatrix& embd = model_.token_embedding();
    w->embd_type = static_cast<int>(embd.type);
    w->embd.reserve(embd.bytes(), device_, "the token embedding");
    check(cudaMemcpyAsync(w->embd.get(), embd.data, embd.bytes(), cudaMemcpyHostToDevice, stream_),
          device_, "uploading the token embedding");
    w->layers.resize(static_cast<size_t>(hp_.n_layer));
    for (int64_t i = 0; i < hp_.n_layer; ++i) {
      const LayerWeights& lw = model_.layers()[static_cast<size_t>(i)];
      CudaLayer& l = w->layers[static_cast<size_t>(i)];
      f32(lw.attn_norm, l.attn_norm);
      f32(lw.ffn_norm, l.ffn_norm);
      if (!lw.bq.empty()) {
        std::vector<float> bias = lw.bq;
        bias.insert(bias.end(), lw.bk.begin(), lw.bk.end());
        bias.insert(bias.end(), lw.bv.begin(), lw.bv.end());
        f32(bias, l.qkv_bias);  // a pageable source is staged before the call returns
      }
      f32(lw.q_norm, l.q_norm);
      f32(lw.k_norm, l.k_norm);
      f32(lw.post_attn_norm, l.post_attn_norm);
      f32(lw.post_ffn_norm, l.post_ffn_norm);
      l.wqkv.reserve(static_cast<size_t>((q_dim + 2 * kv_dim) * n_embd), device_, "weights");
      bf16(lw.wq, l.wqkv.get());
      bf16(lw.wk, l.wqkv.get() + q_dim * n_embd);
      bf16(lw.wv, l.wqkv.get() + (q_dim + kv_dim) * n_embd);
      l.w_gate_up.reserve(static_cast<size_t>(2 * hp_.n_ff * n_embd), device_, "weights");
      bf16(lw.w_gate, l.w_gate_up.get());
      bf16(lw.w_up, l.w_gate_up.get() + hp_.n_ff * n_embd);
      for (auto [m, dst] : {std::pair{&lw.wo, &l.wo}, std::pair{&lw.w_down, &l.w_down}}) {
        dst->reserve(static_cast<size_t>(m->rows * m->cols), device_, "weights");
        bf16(*m, dst->get());
      }
      if (blocks_) {
        blocks({&lw.wq, &lw.wk, &lw.wv}, l.qkv_blocks);
        blocks({&lw.w_gate, &lw.w_up}, l.gate_up_blocks);
        blocks({&lw.wo}, l.wo_blocks);
        blocks({&lw.w_down}, l.down_blocks);
      }
    }
    f32(model_.output_norm(), w->output_norm);
    const WeightMatrix& out = model_.output();
    w->lm_head.reserve(static_cast<size_t>(out.rows * out.cols), device_, "the LM head");
    bf16(out, w->lm_head.get());
    if (blocks_) blocks({&out}, w->lm_head_blocks);
    check(cudaStreamSynchronize(stream_), device_, "uploading the weights");
    return w;
  }

 private:
  // host into dst; an empty host vector (a family without that tensor) leaves dst empty.
  void f32(const std::vector<float>& host, DeviceArray<float>& dst) {
    if (host.empty()) return;
    dst.reserve(host.size(), device_, "norm weights");
    check(cudaMemcpyAsync(dst.get(), host.data(), host.size() * sizeof(float),
                          cudaMemcpyHostToDevice, stream_),
          device_, "uploading weights");
  }
  // m, dequantized, into dst (m.rows · m.cols bf16).
  void bf16(const WeightMatrix& m, uint16_t* dst) {
    check(cudaMemcpyAsync(raw_.get(), m.data, m.bytes(), cudaMemcpyHostToDevice, stream_), device_,
          "uploading weights");
    launch(device_, "dequantize", [&] {
      kernels::launch_dequantize_rows(static_cast<int>(m.type), raw_.get(), f32_.get(), m.rows,
                                      m.cols, stream_);
      kernels::launch_f32_to_bf16(f32_.get(), dst, m.rows * m.cols, stream_);
    });
  }

  // The parts, stacked in order, into dst in the quantized GEMV's layout; dst stays without blocks
  // when a part has no quantized form or the parts' types differ.
  void blocks(std::initializer_list<const WeightMatrix*> parts, CudaBlocks& dst) {
    kernels::GemvBlocks host;
    for (const WeightMatrix* m : parts)
      if (!kernels::append_gemv_blocks(m->type, m->data, m->rows, m->cols, host)) return;
    dst.q.reserve(host.q.size(), device_, "quantized weights");
    dst.scales.reserve(host.scales.size(), device_, "quantized weights");
    // Synchronous copies: the host arrays go away with this call.
    check(cudaMemcpy(dst.q.get(), host.q.data(), host.q.size(), cudaMemcpyHostToDevice), device_,
          "uploading quantized weights");
    check(cudaMemcpy(dst.scales.get(), host.scales.data(), host.scales.size() * sizeof(uint32_t),
                     cudaMemcpyHostToDevice),
          device_, "uploading quantized weights");
    dst.format = host.format;
  }

  const LlamaModel& model_;
  const HParams& hp_;
  const std::string device_;
  cudaStream_t stream_;
  const bool blocks_;
  DeviceArray<uint8_t> raw_;
  DeviceArray<float> f32_;
};

// The weights of (model, GPU, with blocks or not) while any device holds them: partitions of one
// GPU share one copy.
using WeightsKey = std::tuple<const LlamaModel*, int, bool>;
std::mutex g_weights_mutex;
std::map<WeightsKey, std::weak_ptr<CudaWeights>> g_weights;

}  // namespace

std::shared_ptr<const CudaWeights> resident_weights(const LlamaModel& model, int index,
                                                    bool blocks) {
  std::lock_guard lock(g_weights_mutex);
  const auto it = g_weights.find({&model, index, blocks});
  return it == g_weights.end() ? nullptr : it->second.lock();
}

std::shared_ptr<const CudaWeights> shared_weights(const LlamaModel& model, int index, bool blocks,
                                                  const std::string& device, cudaStream_t stream) {
  std::lock_guard lock(g_weights_mutex);  // held through an upload: the second partition waits
  std::weak_ptr<CudaWeights>& slot = g_weights[{&model, index, blocks}];
  if (std::shared_ptr<CudaWeights> w = slot.lock()) return w;
  std::shared_ptr<CudaWeights> w = WeightUploader(model, device, stream, blocks).upload(index);
  slot = w;
  return w;
}

}  // namespace cuda_backend

#endif

}  // namespace tokenfab
