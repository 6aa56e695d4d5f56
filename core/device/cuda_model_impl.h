#pragma once
// The CUDA Device's class (cuda_model.h), shared by the files that define its parts: the KV pool
// in device memory (CudaKvPool) and CudaDevice with its buffers. Internal to core/device, included
// only by cuda_model*.cpp; CUDA builds only. Where each part lives:
//   cuda_model.cpp          construction, memory checks, buffers, the public entry points
//   cuda_model_step.cpp     a planned batch's pass: uploads, routing, outputs, CUDA graphs
//   cuda_model_layered.cpp  the layered kernels: GEMV and GEMM layers, the families' layers
//   cuda_model_fused.cpp    the fused decode layers (one cooperative launch a step)
//   cuda_model_logits.cpp   the LM head, sampling candidates, top tokens
//   cuda_model_drafts.cpp   layer taps, draft heads' weights, Medusa proposals
//   cuda_model_mtp.cpp      mtp drafting on the device: chains, trees, best-first trees
// One concern that cannot be cut: the class and the pool whose members every part uses.

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <tuple>
#include <utility>
#include <vector>

#include "core/device/cuda_memory.h"
#include "core/device/cuda_model.h"
#include "core/device/cuda_partition.h"
#include "core/device/cuda_weights.h"
#include "core/runtime/kv_storage.h"
#include "core/runtime/model_runner.h"
#include "core/speculative/draft_head.h"
#include "kernels/cpu/thread_pool.h"
#include "kernels/cuda/candidates.cuh"
#include "kernels/cuda/cublas_gemm.cuh"
#include "kernels/cuda/decode_layers.cuh"
#include "kernels/cuda/paged_decode_attention.cuh"
#include "kernels/cuda/paged_prefill_attention.cuh"
#include "kernels/cuda/paged_rows.h"

namespace tokenfab::cuda_backend {

// The paged KV storage in device memory: per layer, K and V as fp16 bits, (n_blocks, n_kv_head,
// block_size, head_dim) each, the CPU KvStorage's layout. The two partitions of one GPU share one
// (core/kvcache/kv_slots.h), each through a CudaKvPool of its own that queues on its stream.
struct CudaKvTensors {
  int32_t n_blocks = 0;
  std::vector<DeviceArray<uint16_t>> k, v;  // (n_layer)
};

class CudaKvPool final : public KvPool {
 public:
  // Over `shared` when given (another partition's), else over tensors of its own of n_blocks.
  CudaKvPool(const HParams& hp, int32_t n_blocks, int32_t block_size, std::string device, int index,
             cudaStream_t stream, std::shared_ptr<CudaKvTensors> shared = nullptr)
      : hp_(hp),
        device_(std::move(device)),
        index_(index),
        block_size_(block_size),
        stream_(stream),
        tensors_(std::move(shared)) {
    if (tensors_) return;
    tensors_ = std::make_shared<CudaKvTensors>();
    tensors_->n_blocks = n_blocks;
    const size_t halves = block_halves() * static_cast<size_t>(n_blocks);
    tensors_->k.resize(static_cast<size_t>(hp.n_layer));
    tensors_->v.resize(static_cast<size_t>(hp.n_layer));
    for (int64_t l = 0; l < hp.n_layer; ++l) {
      tensors_->k[static_cast<size_t>(l)].reserve(halves, device_, "the KV pool");
      tensors_->v[static_cast<size_t>(l)].reserve(halves, device_, "the KV pool");
    }
  }

  const std::shared_ptr<CudaKvTensors>& tensors() const { return tensors_; }
  const void* storage_id() const override { return tensors_.get(); }
  std::string_view device() const override { return device_; }
  KvMemory memory() const override { return KvMemory::kCuda; }
  int32_t n_layers() const override { return static_cast<int32_t>(hp_.n_layer); }
  int32_t n_blocks() const override { return tensors_->n_blocks; }
  int32_t block_size() const override { return block_size_; }
  size_t block_bytes() const override { return block_halves() * sizeof(uint16_t); }
  std::byte* k_block(int32_t layer, int32_t block) override {
    return reinterpret_cast<std::byte*>(k(layer) + block_halves() * static_cast<size_t>(block));
  }
  std::byte* v_block(int32_t layer, int32_t block) override {
    return reinterpret_cast<std::byte*>(v(layer) + block_halves() * static_cast<size_t>(block));
  }

  // The copies are queued on the device's stream, ahead of the pass that reads them; the caller's
  // thread may have another GPU current, hence the cudaSetDevice.
  void copy_block(int32_t src, int32_t dst) override {
    check(cudaSetDevice(index_), device_, "selecting the device");
    for (int32_t l = 0; l < n_layers(); ++l) {
      check(cudaMemcpyAsync(k_block(l, dst), k_block(l, src), block_bytes(),
                            cudaMemcpyDeviceToDevice, stream_),
            device_, "copying a KV block");
      check(cudaMemcpyAsync(v_block(l, dst), v_block(l, src), block_bytes(),
                            cudaMemcpyDeviceToDevice, stream_),
            device_, "copying a KV block");
    }
  }

  void copy_position(std::span<const int32_t> blocks, int64_t from, int64_t to) override {
    const int32_t bs = block_size_;
    const size_t row_bytes = static_cast<size_t>(hp_.head_dim) * sizeof(uint16_t);
    const size_t pitch = row_bytes * static_cast<size_t>(bs);  // one kv head of a block
    const int32_t src_block = blocks[static_cast<size_t>(from / bs)];
    const int32_t dst_block = blocks[static_cast<size_t>(to / bs)];
    check(cudaSetDevice(index_), device_, "selecting the device");
    for (int32_t l = 0; l < n_layers(); ++l) {
      for (const bool is_k : {true, false}) {
        std::byte* src = (is_k ? k_block(l, src_block) : v_block(l, src_block)) +
                         static_cast<size_t>(from % bs) * row_bytes;
        std::byte* dst = (is_k ? k_block(l, dst_block) : v_block(l, dst_block)) +
                         static_cast<size_t>(to % bs) * row_bytes;
        check(
            cudaMemcpy2DAsync(dst, pitch, src, pitch, row_bytes, static_cast<size_t>(hp_.n_kv_head),
                              cudaMemcpyDeviceToDevice, stream_),
            device_, "moving a KV row");
      }
    }
  }

  // Copies queued here land before this partition's next pass; the storage shared with the other
  // partition waits for them before a slot changes hands (BlockPool::adopt_slot).
  void fence() override {
    check(cudaSetDevice(index_), device_, "selecting the device");
    check(cudaStreamSynchronize(stream_), device_, "finishing the KV pool's copies");
  }

  uint16_t* k(int64_t layer) { return tensors_->k[static_cast<size_t>(layer)].get(); }
  uint16_t* v(int64_t layer) { return tensors_->v[static_cast<size_t>(layer)].get(); }

 private:
  size_t block_halves() const {
    return static_cast<size_t>(hp_.n_kv_head) * static_cast<size_t>(block_size_) *
           static_cast<size_t>(hp_.head_dim);
  }

  const HParams& hp_;
  std::string device_;
  int index_;  // the GPU
  int32_t block_size_;
  cudaStream_t stream_;
  std::shared_ptr<CudaKvTensors> tensors_;
};

class CudaDevice final : public Device {
 public:
  // With `shared_kv` (the other partition's storage), kv_blocks is ignored.
  CudaDevice(DeviceSpec spec, const LlamaModel& model, int threads, int32_t kv_blocks,
             int32_t block_size, CudaOptions options,
             std::shared_ptr<CudaKvTensors> shared_kv = nullptr);
  ~CudaDevice() override;

  const std::shared_ptr<CudaKvTensors>& kv_tensors() const { return kv_->tensors(); }
  int fused_grid() const { return fused_grid_; }       // cuda_fused_layers_grid
  std::optional<FusedPhaseTimes> fused_phase_times();  // cuda_fused_phase_times
  std::optional<double> last_step_gpu_ms() const;      // cuda_last_step_gpu_ms

  const DeviceSpec& spec() const override { return spec_; }
  int threads() const override { return pool_.size(); }
  const LlamaModel& model() const override { return model_; }
  KvPool& kv_storage() override { return *kv_; }
  void run(std::span<const BatchSequence> batch, std::vector<float>& logits,
           std::vector<float>* hidden = nullptr) override;
  void lm_head(const float* z, int64_t n, std::vector<float>& logits) override;
  void lm_head_top(const float* z, int64_t n, std::span<const int32_t> wanted,
                   std::vector<std::vector<int32_t>>& best) override;
  void medusa_top(std::span<const MedusaProposal> proposals, std::span<const int32_t> wanted,
                  std::vector<std::vector<int32_t>>& best) override;
  bool mtp_on_device() const override { return true; }
  bool set_draft_taps(bool on) override;
  int64_t hidden_width() const override {
    return hp_.n_embd * (1 + static_cast<int64_t>(taps_.size()));
  }
  void mtp_propose(std::span<const MtpProposal> proposals,
                   std::vector<std::vector<int32_t>>& drafts,
                   std::vector<std::vector<int32_t>>& parents) override;
  void parallel_for(int64_t n, const std::function<void(int64_t)>& fn) override {
    parallel_for_on(pool_, n, fn);
  }
  bool greedy_on_device() const override { return true; }
  void run_greedy(std::span<const BatchSequence> batch, std::vector<int32_t>& argmax,
                  std::vector<float>* hidden = nullptr) override;
  bool filters_on_device() const override { return true; }
  void run_filtered(std::span<const BatchSequence> batch,
                    std::span<const kernels::CandidateFilter> filters, FilteredRows& rows,
                    std::vector<float>* hidden = nullptr) override;

 private:
  // What a pass sends back of its logit rows: all of them, each row's argmax, or each row's
  // sampling candidates.
  struct Outputs {
    std::vector<float>* logits = nullptr;
    std::vector<int32_t>* argmax = nullptr;
    FilteredRows* filtered = nullptr;
    std::span<const kernels::CandidateFilter> filters = {};  // (logit rows), with `filtered`
    std::vector<float>* hidden = nullptr;
  };
  // The pass itself, then its outputs to the host.
  void forward(std::span<const BatchSequence> batch, const Outputs& out);
  // Enqueues the candidates of the n_logit rows of n_cols logits in logits_ and their download
  // into `rows`. Returns after the step's sync, having fetched the rows that went whole.
  void filter_rows(int64_t n_logit, int64_t n_cols,
                   std::span<const kernels::CandidateFilter> filters, FilteredRows& rows);
  // best[r] = the wanted[r] best tokens of the LM head over xgn_'s first n rows (lm_head_top).
  void top_of_lm_head(int64_t n, std::span<const int32_t> wanted,
                      std::vector<std::vector<int32_t>>& best);
  // A draft head's weights on this GPU, uploaded on first use; the kMaxHeadsKept heads used
  // last stay (evict_draft_heads). Medusa: every level's W (n_embd, n_embd), then every level's b.
  // mtp: its W (n_embd, 2·n_embd) and b, its draft vocabulary and that vocabulary's rows of the LM
  // head.
  struct DraftWeights {
    std::shared_ptr<const DraftHead> head;  // kept alive while its copy is here
    DeviceArray<float> w, b;                // each block's W, back to back; each block's b
    DeviceArray<int32_t> vocab;             // mtp: (|V|) token ids, ascending
    DeviceArray<uint16_t> vocab_rows;       // mtp: (|V|, n_embd) bf16 rows of the LM head
    DeviceArray<uint16_t> fuse_w;           // mtp with taps: W_f (n_embd, T·n_embd) in bf16
    uint64_t last_used = 0;
  };
  const DraftWeights& draft_weights(const std::shared_ptr<const DraftHead>& head);
  // Drops the least recently used heads past kMaxHeadsKept. Only after the stream's work that
  // used them is done (a call's closing sync): heads of one call are never evicted mid-call.
  void evict_draft_heads();
  // mtp drafting: a group of one head's proposals, all chains (the tokens stay on the GPU
  // between steps) or with trees (a level at a time, each level's best columns to the host).
  void mtp_chain_group(std::span<const MtpProposal> proposals, const std::vector<size_t>& members,
                       const DraftWeights& weights, std::vector<std::vector<int32_t>>& drafts,
                       std::vector<std::vector<int32_t>>& parents);
  void mtp_tree_group(std::span<const MtpProposal> proposals, const std::vector<size_t>& members,
                      const DraftWeights& weights, std::vector<std::vector<int32_t>>& drafts,
                      std::vector<std::vector<int32_t>>& parents);
  // Best-first trees (MtpProposal::best_first): a level at a time, only the nodes that can still
  // be among the most probable ones expanded, their normalisers computed on the GPU.
  void mtp_best_first_group(std::span<const MtpProposal> proposals,
                            const std::vector<size_t>& members, const DraftWeights& weights,
                            std::vector<std::vector<int32_t>>& drafts,
                            std::vector<std::vector<int32_t>>& parents);
  // Row t of xg_: the first state of proposals[members[t]]'s drafts (DraftHead::mtp_root): its
  // hidden state h, or with the head's layer taps g = h + b_f (added on the host) + W_f taps (on
  // the GPU, through xgn_).
  void upload_root_states(std::span<const MtpProposal> proposals,
                          const std::vector<size_t>& members, const DraftWeights& weights);
  // The rows of one mtp step: each row's token and the row of the states it reads (src), and
  // the head's W and b for every row, to the GPU.
  void upload_draft_rows(const DraftWeights& weights, std::span<const int32_t> tokens,
                         std::span<const int32_t> src);
  // One mtp step over n rows: z (n, n_embd) from the states h and the rows' tokens, and the
  // rows' logits over the head's vocabulary in logits_ (n, |V|).
  void mtp_step_rows(const DraftWeights& weights, const float* h, float* z, int64_t n);
  // kv_blocks: the blocks of KV this device allocates (0: it shares another's).
  void check_fits(int32_t kv_blocks, int32_t block_size) const;
  void reserve_rows(int64_t rows, int64_t logit_rows, int64_t workspace_floats);
  kernels::PagedDecodeWorkspace attention_workspace();  // workspace_ and split_counts_
  // The buffers drafting uses for `rows` rows of `cols` logits: x_ (embeddings), xg_ and xgn_
  // (states), logits_, argmax_ and act16_ (a GEMM's bf16 input); the pass's other buffers stay.
  void reserve_draft_rows(int64_t rows, int64_t cols);
  // c (m, n) = a (m, k) · w (n, k)ᵀ, a given in f32 and rounded to bf16 on the way in.
  // With `blocks` (a few rows), the GEMV reads them instead of w.
  void linear(const float* a, const uint16_t* w, float* c, int64_t m, int64_t n, int64_t k,
              const CudaBlocks* blocks = nullptr);
  // logits (rows, n_vocab) on the host from final-norm hidden states xgn_ (rows, n_embd).
  void lm_head_rows(int64_t rows, std::vector<float>& logits);
  // Enqueues the layers over the uploaded rows, then the final norm and LM head of the logit
  // rows (rows_.logit_rows gathered after the layers; from x_ itself when every row's logits are
  // wanted in order, `gathered` false) into logits_ and xgn_; with `taps`, their layer taps too
  // (enqueue_taps).
  void enqueue_forward(int64_t n, int64_t n_logit, int64_t n_att_rows, bool has_paths,
                       int32_t max_keys, int64_t n_chunks, int32_t max_chunk_tokens, bool gathered,
                       bool taps);
  // The layers of enqueue_forward, one layer's kernels after another (the reference path).
  void enqueue_layers(int64_t n, int64_t n_logit, int64_t n_att_rows, bool has_paths,
                      int32_t max_keys, int64_t n_chunks, int32_t max_chunk_tokens, bool gathered,
                      bool taps);
  // The attention rows of a step (forward's): decode rows (att_rows_, with paths_ if has_paths)
  // and prompt chunks (chunks_).
  struct StepAttention {
    int64_t n_att_rows;
    bool has_paths;
    int32_t max_keys;
    int64_t n_chunks;
    int32_t max_chunk_tokens;
  };
  // Both attention kernels of `layer` over qkv_, into out (f32) or out16 (bf16), (n, q_dim).
  void enqueue_attention(int64_t layer, const StepAttention& a, float* out, uint16_t* out16);
  // One layer of a many-row step over x_ (n rows): cuBLASLt's GEMMs and the kernels between
  // them, their glue as fused_epilogues_ says.
  void enqueue_gemm_layer(int64_t layer, int64_t n, const StepAttention& att);
  // One layer of a model of another family than plain Llama (family_; CudaOptions::families),
  // any row count: each product through linear() (the GEMVs for a few rows, cuBLASLt beyond),
  // the family's Q/K preparation (biases, Q/K norms, its RoPE) with the KV store in one launch,
  // the attention with the layer's window and soft-cap, the post-norms and the gated
  // activation as launches of their own.
  void enqueue_family_layer(int64_t layer, int64_t n, const StepAttention& att);
  // x_ += norm(proj_) (n rows), the sublayer's output through its post-norm when the family has
  // one (`post_norm` not empty).
  void add_sublayer(const DeviceArray<float>& post_norm, int64_t n);
  // The family's RoPE angles of the step's n rows, every RoPE variant of the model
  // (Architecture::ropes), into h_rope_: (ropes, n, rot_dim), each row's cos then sin, by the
  // CPU's own function (kernels::rope_table_scaled), so the same floats.
  void family_rope_tables(int64_t n);
  // logits_ (rows, n_vocab) ← final_softcap · tanh(logits_ / final_softcap), when the family
  // soft-caps its logits (gemma2), as TransformerPass's LM head does.
  void apply_final_softcap(int64_t rows);
  // The layers of enqueue_forward in one cooperative launch (fused_step; no prompt chunk, every
  // row a decode row), with the taps if `taps` (the table prepare_fused_layers uploaded).
  void enqueue_fused_layers(int64_t n, int64_t n_logit, bool has_paths, int32_t max_keys,
                            bool gathered, bool taps);
  // After `layer`, if it is one of taps_: the logit rows' residual stream RMS-normalised (unit
  // weights, as TransformerPass does) into taps_rows_, (taps_.size(), n_logit, n_embd).
  void enqueue_taps(int64_t layer, int64_t n_logit, bool gathered);
  // xg_ (n_logit, n_embd) = the rows of x_ that logit_rows_ names, in order.
  void gather_logit_rows(int64_t n_logit);
  // A decode-only step through its CUDA graph: captured on the second step of a shape (the first
  // runs directly, so cuBLASLt has chosen its algorithms), replayed after that.
  void run_graph(int64_t n, int32_t max_keys_bucket, bool taps);
  struct Graph;
  // Captures g's step (its second run) and instantiates it; throws Error if either fails.
  void capture_graph(Graph& g, int64_t n, int32_t max_keys_bucket, bool taps);
  void drop_graphs();
  void sync(const char* what);

  DeviceSpec spec_;
  const std::string name_;
  const LlamaModel& model_;
  const HParams& hp_;
  kernels::ThreadPool pool_;
  PartitionStream partition_;  // owns stream_
  cudaStream_t stream_ = nullptr;
  std::unique_ptr<kernels::CublasGemm> gemm_;
  std::unique_ptr<CudaKvPool> kv_;

  std::shared_ptr<const CudaWeights> w_;

  // One pass's buffers, grown as batches grow.
  BatchRows rows_;
  std::vector<int32_t> h_i32_;  // host staging of the small int arrays below
  std::vector<float> h_rope_;   // (rows, rot_dim): each row's cos, then sin (few-row steps)
  std::vector<int32_t> h_tables_;
  std::vector<kernels::PagedSequence> device_seqs_, decode_seqs_;
  std::vector<kernels::CudaPrefillChunk> h_chunks_;
  DeviceArray<kernels::CudaPrefillChunk> chunks_;
  DeviceArray<int32_t> tokens_, positions_, slots_, tables_, paths_;
  DeviceArray<int32_t> logit_rows_;  // rows_.logit_rows (steps whose logit rows are gathered)
  DeviceArray<kernels::CudaPagedRow> att_rows_;
  DeviceArray<float> x_, qkv_, att_, gate_up_, workspace_;
  DeviceArray<float> proj_;            // (rows, n_embd): a GEMM's product before its residual add
  DeviceArray<int32_t> split_counts_;  // the decode attention's counters (PagedDecodeWorkspace)
  DeviceArray<float> rope_;            // h_rope_ on the device
  DeviceArray<uint16_t> act16_;        // a GEMM's input in bf16
  DeviceArray<float> xg_, xgn_, logits_;  // logit rows: gathered, normalised, logits
  // Draft features: the layers tapped (set_draft_taps; empty: off), the RMS norm's unit weights,
  // and a pass's tap rows (enqueue_taps).
  std::vector<int32_t> taps_;
  DeviceArray<float> ones_, taps_rows_;
  // The drafts' first states: host staging of h (+ b_f) and of the taps; the taps on the GPU.
  std::vector<float> h_roots_, h_root_taps_;
  DeviceArray<float> root_taps_;
  DeviceArray<int32_t> argmax_;  // each logit row's argmax (greedy steps)
  // Sampling candidates (filtered steps): each logit row's filter, candidate count, and
  // (rows, width) candidates.
  DeviceArray<kernels::CandidateFilter> filters_;
  DeviceArray<int32_t> candidate_counts_, candidate_ids_;
  DeviceArray<float> candidate_logits_;
  // Medusa proposals: the heads' weights by head, and one call's per-row W and b pointers and
  // hidden-state rows.
  static constexpr size_t kMaxHeadsKept = 8;
  std::map<const DraftHead*, DraftWeights> draft_heads_;
  uint64_t draft_uses_ = 0;
  DeviceArray<const float*> medusa_w_, medusa_b_;
  DeviceArray<int32_t> medusa_src_;
  // mtp chains: the rows' tokens (the last, then each step's draft), and every step's drafts.
  DeviceArray<int32_t> mtp_tokens_, mtp_drafts_;
  DeviceArray<float> row_lse_;  // best-first trees: each expanded row's log-sum-exp

  // CUDA graphs of decode-only steps, by (rows, key bucket, whether the layer taps are kept). A
  // graph holds the buffers' addresses, so any buffer it uses growing drops them all.
  const bool use_graphs_;
  // Whether the few-row GEMVs and the decode attention may start while the kernel before them
  // runs (CudaOptions::overlap_launches on a GPU of compute capability 9.0 or later).
  bool overlap_ = false;
  const bool block_gemv_;                                // CudaOptions::block_gemv
  const bool split_k_;                                   // CudaOptions::gemv_split_k
  const kernels::PrefillAttentionKernel prompt_kernel_;  // CudaOptions::tiled_prompt_attention
  const bool fused_epilogues_;                           // CudaOptions::fused_epilogues
  // A model whose layers differ from the plain Llama layers (differences_from_llama), run with
  // CudaOptions::families: every layer through enqueue_family_layer; its FFN's activation rows
  // (rows, n_ff) in ffn_.
  bool family_ = false;
  DeviceArray<float> ffn_;
  // CudaOptions::chains_on_decode_kernel, or the fused decode layers run here (set once
  // fused_grid_ is known).
  bool chains_on_decode_ = false;
  // CudaOptions::fused_layers: the cooperative kernel's grid (0: the layered kernels run), its
  // layer table on the device (weights, pools and this step's tap rows) with the host copy last
  // uploaded, and its grid barrier's counter.
  int fused_grid_ = 0;
  const bool fused_tensor_cores_;  // CudaOptions::fused_tensor_cores
  bool fused_graphs_ = true;       // false once a fused step could not be captured (run_graph)
  std::vector<kernels::DecodeLayer> h_fused_layers_;
  DeviceArray<kernels::DecodeLayer> fused_layers_;
  DeviceArray<unsigned> fused_barrier_;
  DeviceArray<unsigned long long> fused_clock_;  // the kernel's phase clock (phase_ns)
  // The last forward pass's stream work, from its first upload to its last download (events
  // made on first use; step_timed_ once both are recorded).
  cudaEvent_t step_start_ = nullptr;
  cudaEvent_t step_end_ = nullptr;
  bool step_timed_ = false;
  void end_step_clock();
  // Uploads the fused kernel's layer table for a step whose taps (if `taps`) are n_logit rows,
  // when it differs from the one last uploaded.
  void prepare_fused_layers(int64_t n_logit, bool taps);
  // Whether a step of n rows, all of them decode rows (no prompt chunk), runs fused.
  bool fused_step(int64_t n) const { return fused_grid_ > 0 && n <= fused_rows(); }
  // The most rows a fused step takes.
  int64_t fused_rows() const { return kernels::decode_layers_max_rows(fused_tensor_cores_); }
  struct Graph {
    int runs = 0;  // direct runs so far (capture on the second)
    cudaGraphExec_t exec = nullptr;
  };
  std::map<std::tuple<int64_t, int32_t, bool>, Graph> graphs_;
};

}  // namespace tokenfab::cuda_backend
