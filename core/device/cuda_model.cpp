// The CUDA Device (cuda_model.h): the KV pool in device memory and the forward pass of one planned
// batch, over the weights of cuda_weights.h. Everything of one device runs on its one stream, in
// order, so the pool's block copies, the pass and the logits' download need no other
// synchronisation; the step ends with one cudaStreamSynchronize, when the host needs the logits.

#include "core/device/cuda_model.h"

#include <string>

#include "core/common/error.h"
#include "core/common/log.h"

#if TOKENFAB_HAVE_CUDA
#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <map>
#include <numeric>
#include <tuple>
#include <utility>
#include <vector>

#include "core/device/cuda_memory.h"
#include "core/device/cuda_partition.h"
#include "core/device/cuda_weights.h"
#include "core/model/transformer_pass.h"
#include "core/runtime/model_runner.h"
#include "core/speculative/draft_head.h"
#include "kernels/cpu/ops.h"
#include "kernels/cpu/quant_types.h"
#include "kernels/cuda/add_inplace.cuh"
#include "kernels/cuda/argmax.cuh"
#include "kernels/cuda/candidates.cuh"
#include "kernels/cuda/cublas_gemm.cuh"
#include "kernels/cuda/decode_layers.cuh"
#include "kernels/cuda/draft_residual.cuh"
#include "kernels/cuda/embedding.cuh"
#include "kernels/cuda/f32_to_bf16.cuh"
#include "kernels/cuda/gather_rows.cuh"
#include "kernels/cuda/gemv.cuh"
#include "kernels/cuda/glu_rows.cuh"
#include "kernels/cuda/kv_store.cuh"
#include "kernels/cuda/overlap_support.cuh"
#include "kernels/cuda/paged_decode_attention.cuh"
#include "kernels/cuda/paged_prefill_attention.cuh"
#include "kernels/cuda/paged_rows.h"
#include "kernels/cuda/prepare_qk.cuh"
#include "kernels/cuda/rms_norm.cuh"
#include "kernels/cuda/rope.cuh"
#include "kernels/cuda/row_logsumexp.cuh"
#include "kernels/cuda/silu_mul.cuh"
#include "kernels/cuda/softcap.cuh"
#endif

namespace tokenfab {

#if !TOKENFAB_HAVE_CUDA

bool cuda_backend_built() {
  return false;
}

std::unique_ptr<Device> make_cuda_device(DeviceSpec spec, const LlamaModel&, int, int32_t, int32_t,
                                         CudaOptions) {
  throw Error(spec.name() + ": this build has no CUDA backend (it is built where nvcc is found)");
}

std::pair<std::unique_ptr<Device>, std::unique_ptr<Device>> make_cuda_partitions(
    DeviceSpec prefill, DeviceSpec, const LlamaModel&, int, int, int32_t, int32_t, CudaOptions) {
  throw Error(prefill.name() +
              ": this build has no CUDA backend (it is built where nvcc is found)");
}

int cuda_fused_layers_grid(const Device&) {
  return 0;
}

std::optional<FusedPhaseTimes> cuda_fused_phase_times(Device&) {
  return std::nullopt;
}

std::optional<double> cuda_last_step_gpu_ms(const Device&) {
  return std::nullopt;
}

#else

bool cuda_backend_built() {
  return true;
}

namespace {

using cuda_backend::check;
using cuda_backend::CudaBlocks;
using cuda_backend::CudaLayer;
using cuda_backend::CudaWeights;
using cuda_backend::DeviceArray;
using cuda_backend::launch;
using cuda_backend::mib;
using cuda_backend::resident_weights;
using cuda_backend::shared_weights;

// Decode steps' CUDA graphs are captured per row count and per this many keys of context: the
// attention grid covers the bucket (about 1 µs of idle splits per 1,024 keys).
constexpr int32_t kGraphKeyBucket = 1024;

// Prompt chunks of at least this many tokens use the tiled prefill attention kernel (their rows
// share each key tile); shorter ones, and the rows of verified chains where they go to the decode
// kernel (CudaOptions::chains_on_decode_kernel), are decode rows.
constexpr int64_t kMinPrefillChunk = 4;

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

// The `take` best (logit, column) of a row of n logits as filter_rows returned it (candidates
// under top-k = take, or the whole row), best first, ties to the lower column.
std::vector<std::pair<float, int32_t>> best_columns(const LogitRow& row, int64_t n, int32_t take) {
  std::vector<std::pair<float, int32_t>> ranked;
  if (row.whole()) {
    for (const int32_t c : top_tokens(row.logits.data(), n, take))
      ranked.emplace_back(row.logits[static_cast<size_t>(c)], c);
    return ranked;
  }
  for (size_t c = 0; c < row.ids.size(); ++c) ranked.emplace_back(row.logits[c], row.ids[c]);
  if (!row.ranked)  // every token, in column order (top-k did not limit the row)
    std::stable_sort(ranked.begin(), ranked.end(),
                     [](const auto& a, const auto& b) { return a.first > b.first; });
  if (static_cast<int32_t>(ranked.size()) > take) ranked.resize(static_cast<size_t>(take));
  return ranked;
}

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

CudaDevice::CudaDevice(DeviceSpec spec, const LlamaModel& model, int threads, int32_t kv_blocks,
                       int32_t block_size, CudaOptions options,
                       std::shared_ptr<CudaKvTensors> shared_kv)
    : spec_(spec),
      name_(spec.name()),
      model_(model),
      hp_(model.hparams()),
      pool_(threads),
      use_graphs_(options.graphs),
      block_gemv_(options.block_gemv),
      split_k_(options.gemv_split_k),
      prompt_kernel_(options.tiled_prompt_attention ? kernels::PrefillAttentionKernel::kTiled
                                                    : kernels::PrefillAttentionKernel::kKeyByKey),
      fused_epilogues_(options.fused_epilogues),
      fused_tensor_cores_(options.fused_tensor_cores) {
  const std::string differences = differences_from_llama(hp_.arch);
  if (!differences.empty() && !options.families)
    throw Error(name_ + ": " + hp_.architecture + " has " + differences +
                ", which the CUDA backend computes only with --cuda-families on (its layered "
                "kernels for the families, not yet verified on a GPU); or run this model on CPU "
                "devices (--devices cpu:0).");
  family_ = !differences.empty();
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess)
    throw Error(name_ + ": no CUDA device can be used: " + cudaGetErrorString(err));
  if (spec.index >= count)
    throw Error(name_ + ": this machine has " + std::to_string(count) + " CUDA device" +
                (count == 1 ? "" : "s") + " (cuda:0" +
                (count > 1 ? "..cuda:" + std::to_string(count - 1) : std::string()) + ")");
  check(cudaSetDevice(spec.index), name_, "selecting the device");
  try {
    overlap_ = options.overlap_launches && kernels::overlap_launches_supported(spec.index);
  } catch (const std::exception& e) {
    throw Error(name_ + ": reading which launches may overlap: " + e.what());
  }
  if (hp_.head_dim > kernels::kPagedDecodeMaxHeadDim || hp_.rot_dim > kernels::kRopeMaxRotDim ||
      hp_.n_embd % 8 != 0 || hp_.q_dim() % 8 != 0 || hp_.n_ff % 8 != 0)
    throw Error(name_ + ": the CUDA backend needs head_dim <= " +
                std::to_string(kernels::kPagedDecodeMaxHeadDim) +
                " and n_embd, q_dim and n_ff multiples of 8; this model has head_dim " +
                std::to_string(hp_.head_dim) + ", n_embd " + std::to_string(hp_.n_embd) +
                ", q_dim " + std::to_string(hp_.q_dim()) + ", n_ff " + std::to_string(hp_.n_ff));
  check_fits(shared_kv ? 0 : kv_blocks, block_size);
  // Partitions of one GPU: the decode stream's kernels are scheduled ahead of the prefill's, and
  // with decode_sms each partition's stream runs on SMs of its own (green contexts).
  int least = 0, greatest = 0;
  check(cudaDeviceGetStreamPriorityRange(&least, &greatest), name_, "reading stream priorities");
  const int priority = spec.partition == DevicePartition::kDecode    ? greatest
                       : spec.partition == DevicePartition::kPrefill ? least
                                                                     : 0;
  partition_ =
      make_partition_stream({spec.index, spec.partition, options.decode_sms, name_}, priority);
  stream_ = partition_.stream();
  if (spec.partition != DevicePartition::kWhole) {
    // A split asked for and not had is worth a warning; the rest is lifecycle.
    const bool missed = options.decode_sms > 0 && !partition_.green();
    logger("device")->log(missed ? spdlog::level::warn : spdlog::level::info, "{}: {}", name_,
                          partition_.note());
  }
  // cuBLASLt plans its products for the SMs this partition has (all of them without a split).
  const int gemm_sms = partition_.green() ? partition_.sms() : 0;
  launch(name_, "cuBLASLt",
         [&] { gemm_ = std::make_unique<kernels::CublasGemm>(size_t{32} << 20, gemm_sms); });
  kv_ = std::make_unique<CudaKvPool>(hp_, kv_blocks, block_size, name_, spec.index, stream_,
                                     std::move(shared_kv));
  w_ = shared_weights(model_, spec.index, block_gemv_, name_, stream_);
  // The fused decode layers need every SM they are given to themselves while they run (their
  // barriers wait for the whole grid): a whole GPU, or a partition with SMs of its own.
  const bool own_sms = spec.partition == DevicePartition::kWhole || partition_.green();
  if (family_)
    logger("device")->info(
        "{}: {} ({}) runs on the families' layered kernels{}", name_, hp_.architecture, differences,
        options.fused_layers ? "; the fused decode layers compute plain Llama layers only and "
                               "decline it"
                             : "");
  if (options.fused_layers && !family_ && !block_gemv_ && own_sms &&
      kernels::decode_layers_supported(static_cast<int>(hp_.n_embd), static_cast<int>(hp_.n_head),
                                       static_cast<int>(hp_.n_kv_head),
                                       static_cast<int>(hp_.head_dim),
                                       static_cast<int>(hp_.n_ff))) {
    launch(name_, "the fused decode layers", [&] {
      fused_grid_ =
          kernels::decode_layers_grid(spec.index, partition_.green() ? partition_.sms() : 0);
    });
    if (fused_grid_ > 0) {
      fused_barrier_.reserve(1, name_, "the fused layers' barrier");
      fused_clock_.reserve(kernels::kDecodeLayersClockSlots, name_, "the fused layers' clock");
      check(cudaMemsetAsync(fused_clock_.get(), 0,
                            kernels::kDecodeLayersClockSlots * sizeof(unsigned long long), stream_),
            name_, "clearing the fused layers' clock");
    }
  }
  // The fused layers' attention takes a chain's rows one by one (their verification is exact up
  // to fused_rows()), so chains stay off the prompt kernel wherever they run.
  chains_on_decode_ = options.chains_on_decode_kernel || fused_grid_ > 0;
  if (options.fused_layers && !family_)
    logger("device")->info("{}: fused decode layers {}", name_,
                           fused_grid_ > 0
                               ? std::string(fused_tensor_cores_ ? "on (tensor cores), " : "on, ") +
                                     std::to_string(fused_grid_) + " blocks"
                               : std::string("unavailable here; layered kernels"));
}

CudaDevice::~CudaDevice() {
  cudaSetDevice(spec_.index);
  if (stream_ != nullptr) cudaStreamSynchronize(stream_);
  if (step_start_ != nullptr) cudaEventDestroy(step_start_);
  if (step_end_ != nullptr) cudaEventDestroy(step_end_);
  drop_graphs();
  gemm_.reset();
  kv_.reset();
  w_.reset();
  partition_ = {};  // the stream, then its green context
}

void CudaDevice::check_fits(int32_t kv_blocks, int32_t block_size) const {
  // Weights already on this GPU (another partition's) are shared, not loaded again.
  const uint64_t weights = resident_weights(model_, spec_.index, block_gemv_)
                               ? 0
                               : cuda_weight_bytes(model_, block_gemv_);
  const uint64_t kv =
      KvStorage::bytes_per_block(hp_, block_size) * static_cast<uint64_t>(kv_blocks);
  size_t free_bytes = 0, total_bytes = 0;
  check(cudaMemGetInfo(&free_bytes, &total_bytes), name_, "reading the free memory");
  // Room for cuBLASLt's workspace, the staging buffers and a batch's activations.
  const uint64_t headroom = uint64_t{512} << 20;
  if (weights + kv + headroom > free_bytes)
    throw Error(name_ + ": the model's weights in BF16" +
                (block_gemv_ ? " with their quantized copies" : "") + " (" + mib(weights) +
                ") and a KV pool of " + std::to_string(kv_blocks) + " blocks (" + mib(kv) +
                "), with " + mib(headroom) + " for work buffers, do not fit in the device's " +
                mib(free_bytes) + " of free memory (of " + mib(total_bytes) +
                "); lower --kv-mem or --kv-blocks");
}

void CudaDevice::sync(const char* what) {
  check(cudaStreamSynchronize(stream_), name_, what);
}

kernels::PagedDecodeWorkspace CudaDevice::attention_workspace() {
  return {workspace_.get(), static_cast<int64_t>(workspace_.size()), split_counts_.get(),
          static_cast<int64_t>(split_counts_.size())};
}

void CudaDevice::reserve_rows(int64_t rows, int64_t logit_rows, int64_t workspace_floats) {
  const auto r = static_cast<size_t>(rows);
  const auto lr = static_cast<size_t>(std::max<int64_t>(logit_rows, 1));
  const auto e = static_cast<size_t>(hp_.n_embd);
  const size_t widest = static_cast<size_t>(std::max({hp_.n_embd, hp_.q_dim(), hp_.n_ff}));
  bool grew = false;
  grew |= x_.reserve(r * e, name_, "activations");
  grew |=
      qkv_.reserve(r * static_cast<size_t>(hp_.q_dim() + 2 * hp_.kv_dim()), name_, "activations");
  // The attention's f32 rows feed the few-row GEMVs and the fused decode layers only (many-row
  // steps write them in bf16), unless many-row steps convert them after the attention
  // (fused_epilogues off), whose products also go through proj_ before their residual adds.
  // The families' layers (family_) keep every step's attention rows in f32, their products in
  // proj_ and their activation rows in ffn_.
  const size_t f32_rows =
      fused_epilogues_ && !family_
          ? static_cast<size_t>(fused_grid_ > 0 ? fused_rows() : kernels::kGemvMaxRows)
          : r;
  grew |=
      att_.reserve(std::min(r, f32_rows) * static_cast<size_t>(hp_.q_dim()), name_, "activations");
  if (!fused_epilogues_ || family_) grew |= proj_.reserve(r * e, name_, "activations");
  if (family_) grew |= ffn_.reserve(r * static_cast<size_t>(hp_.n_ff), name_, "activations");
  grew |= gate_up_.reserve(r * static_cast<size_t>(2 * hp_.n_ff), name_, "activations");
  grew |= act16_.reserve(std::max(r, lr) * widest, name_, "activations");
  grew |= workspace_.reserve(static_cast<size_t>(std::max<int64_t>(workspace_floats, 1)), name_,
                             "the attention workspace");
  if (split_counts_.reserve(std::max<size_t>(r, 1) * static_cast<size_t>(hp_.n_head), name_,
                            "the attention workspace")) {
    grew = true;  // the attention's split counters start at zero (each call leaves them so)
    check(cudaMemsetAsync(split_counts_.get(), 0, split_counts_.size() * sizeof(int32_t), stream_),
          name_, "clearing the attention's split counters");
  }
  grew |= xg_.reserve(lr * e, name_, "logit rows");
  grew |= xgn_.reserve(lr * e, name_, "logit rows");
  grew |= logits_.reserve(lr * static_cast<size_t>(hp_.n_vocab), name_, "logits");
  grew |= argmax_.reserve(lr, name_, "argmax");
  grew |= logit_rows_.reserve(lr, name_, "logit rows");
  grew |= tokens_.reserve(r, name_, "tokens");
  grew |= positions_.reserve(r, name_, "positions");
  const size_t tables = family_ ? hp_.arch.ropes.size() : 1;  // family_rope_tables
  grew |= rope_.reserve(tables * r * static_cast<size_t>(std::max(hp_.rot_dim, 1)), name_,
                        "RoPE angles");
  grew |= slots_.reserve(r, name_, "KV slots");
  grew |= att_rows_.reserve(r, name_, "attention rows");
  if (grew) drop_graphs();
}

void CudaDevice::reserve_draft_rows(int64_t rows, int64_t cols) {
  const auto r = static_cast<size_t>(std::max<int64_t>(rows, 1));
  const auto e = static_cast<size_t>(hp_.n_embd);
  bool grew = false;
  grew |= x_.reserve(r * e, name_, "draft rows");
  grew |= xg_.reserve(r * e, name_, "draft rows");
  grew |= xgn_.reserve(r * e, name_, "draft rows");
  grew |= act16_.reserve(r * e, name_, "draft rows");
  grew |=
      logits_.reserve(r * static_cast<size_t>(std::max<int64_t>(cols, 1)), name_, "draft logits");
  grew |= argmax_.reserve(r, name_, "draft rows");
  if (grew) drop_graphs();  // the graphs hold the old addresses
}

void CudaDevice::drop_graphs() {
  for (auto& [key, g] : graphs_)
    if (g.exec != nullptr) cudaGraphExecDestroy(g.exec);
  graphs_.clear();
}

void CudaDevice::linear(const float* a, const uint16_t* w, float* c, int64_t m, int64_t n,
                        int64_t k, const CudaBlocks* blocks) {
  launch(name_, "linear", [&] {
    if (kernels::gemv_supports(a, k, static_cast<int>(std::min<int64_t>(m, INT32_MAX)), w, k)) {
      // A few rows: the weights streamed once, no bf16 copy of a.
      kernels::GemvArgs g = kernels::gemv_product(a, k, static_cast<int>(m), w, n, k,
                                                  kernels::GemvEpilogue::kStore, c, n);
      g.overlap = overlap_;
      g.split_k = split_k_;
      if (blocks != nullptr) blocks->use_in(g);
      kernels::launch_gemv(g, stream_);
      return;
    }
    kernels::launch_f32_to_bf16(a, act16_.get(), m * k, stream_, overlap_);
    gemm_->bf16_nt(act16_.get(), w, c, m, n, k, stream_);
  });
}

void CudaDevice::lm_head_rows(int64_t rows, std::vector<float>& logits) {
  logits.resize(static_cast<size_t>(rows) * static_cast<size_t>(hp_.n_vocab));
  if (rows == 0) return;
  linear(xgn_.get(), w_->lm_head.get(), logits_.get(), rows, hp_.n_vocab, hp_.n_embd,
         &w_->lm_head_blocks);
  apply_final_softcap(rows);
  check(cudaMemcpyAsync(logits.data(), logits_.get(), logits.size() * sizeof(float),
                        cudaMemcpyDeviceToHost, stream_),
        name_, "downloading logits");
}

void CudaDevice::run(std::span<const BatchSequence> batch, std::vector<float>& logits,
                     std::vector<float>* hidden) {
  forward(batch, {.logits = &logits, .hidden = hidden});
}

void CudaDevice::run_greedy(std::span<const BatchSequence> batch, std::vector<int32_t>& argmax,
                            std::vector<float>* hidden) {
  forward(batch, {.argmax = &argmax, .hidden = hidden});
}

void CudaDevice::run_filtered(std::span<const BatchSequence> batch,
                              std::span<const kernels::CandidateFilter> filters, FilteredRows& rows,
                              std::vector<float>* hidden) {
  forward(batch, {.filtered = &rows, .filters = filters, .hidden = hidden});
}

void CudaDevice::forward(std::span<const BatchSequence> batch, const Outputs& out) {
  std::vector<float>* logits = out.logits;
  std::vector<int32_t>* argmax = out.argmax;
  std::vector<float>* hidden = out.hidden;
  validate_batch(batch, hp_, kv_->n_blocks(), kv_->block_size());
  check(cudaSetDevice(spec_.index), name_, "selecting the device");
  rows_.assign(batch);
  const auto n = static_cast<int64_t>(rows_.tokens.size());
  const auto n_logit = static_cast<int64_t>(rows_.logit_rows.size());
  if (logits) logits->resize(static_cast<size_t>(n_logit) * static_cast<size_t>(hp_.n_vocab));
  if (argmax) argmax->resize(static_cast<size_t>(n_logit));
  const int64_t width = hidden_width();
  if (hidden) hidden->resize(static_cast<size_t>(n_logit) * static_cast<size_t>(width));
  const bool taps = hidden != nullptr && !taps_.empty() && n_logit > 0;
  if (out.filtered && static_cast<int64_t>(out.filters.size()) != n_logit)
    throw Error(name_ + ": " + std::to_string(out.filters.size()) + " sampling filters for " +
                std::to_string(n_logit) + " logit rows");
  if (out.filtered) out.filtered->assign_whole({}, hp_.n_vocab);
  if (n == 0) return;
  const int32_t bs = kv_->block_size();

  // Block tables, back to back, and each sequence's view with device pointers into them.
  h_tables_.clear();
  for (const BatchSequence& s : batch)
    h_tables_.insert(h_tables_.end(), s.blocks.begin(), s.blocks.end());
  tables_.reserve(h_tables_.size(), name_, "block tables");
  device_seqs_ = rows_.seqs;
  size_t offset = 0;
  for (size_t i = 0; i < batch.size(); ++i) {
    device_seqs_[i].blocks = tables_.get() + offset;
    offset += batch[i].blocks.size();
  }
  // Prompt chunks of kMinPrefillChunk tokens or more go to the tiled prefill kernel; decode rows,
  // verified chains of up to kGemvMaxRows tokens (fused_rows() with the fused decode layers) and
  // draft trees to the flash-decoding kernel (or the fused layers' attention), whose rows are
  // computed each on its own: a verified token's attention is then the same, bit for bit, as when
  // it is decoded alone, which keeps greedy speculation lossless on the GPU (with the GEMVs, which
  // are the same per row whatever the row count; longer chains take the GEMMs). Without
  // chains_on_decode_ (the last GPU run's routing) chains of kMinPrefillChunk rows or more are
  // prompt chunks too.
  decode_seqs_.clear();
  h_chunks_.clear();
  int32_t max_chunk_tokens = 0;
  const int64_t chain_rows = fused_grid_ > 0 ? fused_rows() : kernels::kGemvMaxRows;
  for (size_t i = 0; i < device_seqs_.size(); ++i) {
    const kernels::PagedSequence& s = device_seqs_[i];
    const bool verified_chain =
        chains_on_decode_ && batch[i].all_logits && s.n_tokens <= chain_rows;
    if (s.parent == nullptr && !verified_chain && s.n_tokens >= kMinPrefillChunk) {
      h_chunks_.push_back(
          {s.blocks, s.q_row, static_cast<int32_t>(s.n_tokens), static_cast<int32_t>(s.pos0)});
      max_chunk_tokens = std::max(max_chunk_tokens, static_cast<int32_t>(s.n_tokens));
    } else {
      decode_seqs_.push_back(s);
    }
  }
  kernels::CudaPagedRows att;
  launch(name_, "attention rows", [&] { att = kernels::flatten_paged_rows(decode_seqs_); });
  // Steps of decode rows only (no prompt chunk, no tree; every row's logits, in order) replay a
  // CUDA graph captured for their row count and a bucket of key counts: the attention kernel's
  // grid is sized for the bucket, and the splits past a row's own keys return at once. Decode
  // tokens and a verified chain's rows are the same kernels at the same row count. Without
  // chains_on_decode_ only steps of one row a sequence replay graphs, as on the last GPU run.
  const bool decode_only = use_graphs_ && n_logit == n && h_chunks_.empty() && att.paths.empty() &&
                           (chains_on_decode_ || static_cast<int64_t>(batch.size()) == n);
  const int32_t max_keys =
      decode_only ? (att.max_keys + kGraphKeyBucket - 1) / kGraphKeyBucket * kGraphKeyBucket
                  : att.max_keys;
  const bool fused = h_chunks_.empty() && fused_step(n);
  int64_t ws_floats = kernels::paged_decode_workspace_floats(static_cast<int64_t>(att.rows.size()),
                                                             hp_.n_head, hp_.head_dim, max_keys);
  if (fused)
    ws_floats = std::max(
        ws_floats, kernels::decode_layers_workspace_floats(
                       n, static_cast<int>(hp_.n_head), static_cast<int>(hp_.head_dim), max_keys));
  reserve_rows(n, n_logit, ws_floats);
  if (taps && taps_rows_.reserve(taps_.size() * static_cast<size_t>(n_logit * hp_.n_embd), name_,
                                 "layer taps"))
    drop_graphs();
  if (fused) prepare_fused_layers(n_logit, taps);
  paths_.reserve(std::max<size_t>(att.paths.size(), 1), name_, "tree paths");
  chunks_.reserve(std::max<size_t>(h_chunks_.size(), 1), name_, "prefill chunks");

  // The small per-step arrays (pageable sources: the copy has read them when the call returns).
  auto upload = [&](auto* dst, const auto& host, const char* what) {
    if (host.empty()) return;
    check(cudaMemcpyAsync(dst, host.data(), host.size() * sizeof(host[0]), cudaMemcpyHostToDevice,
                          stream_),
          name_, what);
  };
  if (step_start_ == nullptr) {
    check(cudaEventCreate(&step_start_), name_, "making the step clock");
    check(cudaEventCreate(&step_end_), name_, "making the step clock");
  }
  step_timed_ = false;
  check(cudaEventRecord(step_start_, stream_), name_, "starting the step clock");
  upload(tokens_.get(), rows_.tokens, "uploading tokens");
  h_i32_.assign(rows_.positions.begin(), rows_.positions.end());
  upload(positions_.get(), h_i32_, "uploading positions");
  // A few rows' RoPE angles for the QKV GEMVs, by the CPU's own function (so the same floats).
  h_rope_.clear();
  if (family_) {
    family_rope_tables(n);
  } else if ((n <= kernels::kGemvMaxRows || fused) && hp_.rot_dim > 0) {
    const auto half = static_cast<size_t>(hp_.rot_dim / 2);
    h_rope_.resize(static_cast<size_t>(n) * 2 * half);
    for (int64_t i = 0; i < n; ++i) {
      float* row = h_rope_.data() + static_cast<size_t>(i) * 2 * half;
      kernels::rope_table(rows_.positions[static_cast<size_t>(i)], hp_.rot_dim, hp_.rope_base, row,
                          row + half);
    }
  }
  upload(rope_.get(), h_rope_, "uploading RoPE angles");
  // Row i of a sequence keeps its K/V at position pos0 + i (tree rows too; see BatchSequence).
  h_i32_.clear();
  for (const BatchSequence& s : batch)
    for (int64_t i = 0; i < static_cast<int64_t>(s.tokens.size()); ++i) {
      const int64_t pos = s.pos0 + i;
      h_i32_.push_back(s.blocks[static_cast<size_t>(pos / bs)] * bs +
                       static_cast<int32_t>(pos % bs));
    }
  upload(slots_.get(), h_i32_, "uploading KV slots");
  upload(tables_.get(), h_tables_, "uploading block tables");
  upload(att_rows_.get(), att.rows, "uploading attention rows");
  upload(paths_.get(), att.paths, "uploading tree paths");
  upload(chunks_.get(), h_chunks_, "uploading prefill chunks");
  if (!decode_only) {
    h_i32_.assign(rows_.logit_rows.begin(), rows_.logit_rows.end());
    upload(logit_rows_.get(), h_i32_, "uploading logit rows");
  }

  if (decode_only) {
    run_graph(n, max_keys, taps);
  } else {
    enqueue_forward(n, n_logit, static_cast<int64_t>(att.rows.size()), !att.paths.empty(), max_keys,
                    static_cast<int64_t>(h_chunks_.size()), max_chunk_tokens, true, taps);
  }
  if (n_logit > 0 && logits)
    check(cudaMemcpyAsync(logits->data(), logits_.get(), logits->size() * sizeof(float),
                          cudaMemcpyDeviceToHost, stream_),
          name_, "downloading logits");
  if (n_logit > 0 && argmax) {
    launch(name_, "argmax", [&] {
      kernels::launch_argmax_rows(logits_.get(), argmax_.get(), n_logit, hp_.n_vocab, stream_);
    });
    check(cudaMemcpyAsync(argmax->data(), argmax_.get(), argmax->size() * sizeof(int32_t),
                          cudaMemcpyDeviceToHost, stream_),
          name_, "downloading argmax");
  }
  if (hidden && n_logit > 0) {
    // Row r of hidden: xgn_'s row r, then each tap's (the draft features, Device::hidden_width).
    const size_t d = static_cast<size_t>(hp_.n_embd) * sizeof(float);
    const size_t pitch = static_cast<size_t>(width) * sizeof(float);
    check(cudaMemcpy2DAsync(hidden->data(), pitch, xgn_.get(), d, d, static_cast<size_t>(n_logit),
                            cudaMemcpyDeviceToHost, stream_),
          name_, "downloading hidden states");
    for (size_t t = 0; t < taps_.size(); ++t)
      check(cudaMemcpy2DAsync(hidden->data() + (t + 1) * static_cast<size_t>(hp_.n_embd), pitch,
                              taps_rows_.get() + t * static_cast<size_t>(n_logit * hp_.n_embd), d,
                              d, static_cast<size_t>(n_logit), cudaMemcpyDeviceToHost, stream_),
            name_, "downloading layer taps");
  }
  if (n_logit > 0 && out.filtered) {
    filter_rows(n_logit, hp_.n_vocab, out.filters, *out.filtered);
    return;
  }
  end_step_clock();
  sync("running a batch");
}

void CudaDevice::end_step_clock() {
  check(cudaEventRecord(step_end_, stream_), name_, "stopping the step clock");
  step_timed_ = true;
}

std::optional<double> CudaDevice::last_step_gpu_ms() const {
  if (!step_timed_) return std::nullopt;
  float ms = 0.0f;
  if (cudaEventElapsedTime(&ms, step_start_, step_end_) != cudaSuccess) return std::nullopt;
  return static_cast<double>(ms);
}

void CudaDevice::filter_rows(int64_t n_logit, int64_t n_vocab,
                             std::span<const kernels::CandidateFilter> filters,
                             FilteredRows& rows) {
  int32_t width = 1;
  for (const kernels::CandidateFilter& f : filters)
    width = std::max(width, kernels::candidate_slots(f, n_vocab));
  const auto slots = static_cast<size_t>(n_logit) * static_cast<size_t>(width);
  filters_.reserve(static_cast<size_t>(n_logit), name_, "sampling filters");
  candidate_counts_.reserve(static_cast<size_t>(n_logit), name_, "candidate counts");
  candidate_ids_.reserve(slots, name_, "candidate ids");
  candidate_logits_.reserve(slots, name_, "candidate logits");
  rows.n_vocab = n_vocab;
  rows.width = width;
  rows.count.resize(static_cast<size_t>(n_logit));
  rows.ranked.resize(static_cast<size_t>(n_logit));
  for (int64_t r = 0; r < n_logit; ++r)
    rows.ranked[static_cast<size_t>(r)] =
        kernels::top_k_limits(filters[static_cast<size_t>(r)], n_vocab) ? 1 : 0;
  rows.logits.resize(slots);
  rows.ids.resize(slots);
  check(cudaMemcpyAsync(filters_.get(), filters.data(), filters.size_bytes(),
                        cudaMemcpyHostToDevice, stream_),
        name_, "uploading sampling filters");
  launch(name_, "sampling candidates", [&] {
    kernels::launch_argmax_rows(logits_.get(), argmax_.get(), n_logit, n_vocab, stream_);
    kernels::launch_filter_candidates(logits_.get(), n_logit, n_vocab, filters_.get(),
                                      argmax_.get(), width, candidate_logits_.get(),
                                      candidate_ids_.get(), candidate_counts_.get(), stream_);
  });
  auto download = [&](auto& host, const auto& device, const char* what) {
    check(cudaMemcpyAsync(host.data(), device.get(), host.size() * sizeof(host[0]),
                          cudaMemcpyDeviceToHost, stream_),
          name_, what);
  };
  download(rows.count, candidate_counts_, "downloading candidate counts");
  download(rows.logits, candidate_logits_, "downloading candidate logits");
  download(rows.ids, candidate_ids_, "downloading candidate ids");
  end_step_clock();  // rows the filter left whole come down after it (below)
  sync("running a batch");
  // Rows the filter left too many candidates (or no distribution) come whole.
  rows.whole_at.assign(static_cast<size_t>(n_logit), -1);
  int64_t n_whole = 0;
  for (int64_t r = 0; r < n_logit; ++r)
    if (rows.count[static_cast<size_t>(r)] < 0) rows.whole_at[static_cast<size_t>(r)] = n_whole++;
  rows.whole.resize(static_cast<size_t>(n_whole) * static_cast<size_t>(n_vocab));
  if (n_whole == 0) return;
  for (int64_t r = 0; r < n_logit; ++r) {
    const int64_t at = rows.whole_at[static_cast<size_t>(r)];
    if (at < 0) continue;
    check(cudaMemcpyAsync(rows.whole.data() + at * n_vocab, logits_.get() + r * n_vocab,
                          static_cast<size_t>(n_vocab) * sizeof(float), cudaMemcpyDeviceToHost,
                          stream_),
          name_, "downloading whole logit rows");
  }
  sync("downloading whole logit rows");
}

void CudaDevice::enqueue_forward(int64_t n, int64_t n_logit, int64_t n_att_rows, bool has_paths,
                                 int32_t max_keys, int64_t n_chunks, int32_t max_chunk_tokens,
                                 bool gathered, bool taps) {
  const int64_t n_embd = hp_.n_embd;
  launch(name_, "forward pass", [&] {
    kernels::launch_embedding(w_->embd_type, w_->embd.get(), tokens_.get(), x_.get(), n, n_embd,
                              stream_, hp_.arch.embedding_scale);
    if (n_chunks == 0 && n_att_rows == n && fused_step(n)) {
      enqueue_fused_layers(n, n_logit, has_paths, max_keys, gathered, taps);
    } else {
      enqueue_layers(n, n_logit, n_att_rows, has_paths, max_keys, n_chunks, max_chunk_tokens,
                     gathered, taps);
    }
    if (n_logit == 0) return;
    // The logit rows, gathered in order (rows_.logit_rows), for the final norm and the LM head.
    if (gathered) gather_logit_rows(n_logit);
    kernels::launch_rms_norm(gathered ? xg_.get() : x_.get(), w_->output_norm.get(), xgn_.get(),
                             n_logit, n_embd, hp_.rms_eps, stream_, overlap_);
  });
  if (n_logit == 0) return;
  linear(xgn_.get(), w_->lm_head.get(), logits_.get(), n_logit, hp_.n_vocab, n_embd,
         &w_->lm_head_blocks);
  apply_final_softcap(n_logit);
}

void CudaDevice::apply_final_softcap(int64_t rows) {
  const float cap = hp_.arch.final_softcap;
  if (cap <= 0.0f || rows <= 0) return;
  launch(name_, "soft-capping logits", [&] {
    kernels::launch_softcap(logits_.get(), rows * hp_.n_vocab, cap, stream_, overlap_);
  });
}

void CudaDevice::enqueue_layers(int64_t n, int64_t n_logit, int64_t n_att_rows, bool has_paths,
                                int32_t max_keys, int64_t n_chunks, int32_t max_chunk_tokens,
                                bool gathered, bool taps) {
  const int32_t bs = kv_->block_size();
  const int64_t n_embd = hp_.n_embd, q_dim = hp_.q_dim(), kv_dim = hp_.kv_dim(), n_ff = hp_.n_ff;
  const int64_t qkv_dim = q_dim + 2 * kv_dim;
  const StepAttention att{n_att_rows, has_paths, max_keys, n_chunks, max_chunk_tokens};
  // A few rows (decode steps, short chunks) take our GEMVs: a layer is then the QKV product
  // with its norm, RoPE and KV store, attention, and three more products with their norm,
  // SwiGLU and residual adds built in — five launches (six with a prefill chunk) where the
  // cuBLAS path takes ten (fourteen without fused_epilogues_).
  const bool few_rows =
      n <= kernels::kGemvMaxRows &&
      kernels::gemv_supports(x_.get(), n_embd, static_cast<int>(n), w_->layers[0].wqkv.get(),
                             n_embd) &&
      kernels::gemv_supports(gate_up_.get(), n_ff, static_cast<int>(n), w_->layers[0].w_down.get(),
                             n_ff) &&
      kernels::gemv_supports(att_.get(), q_dim, static_cast<int>(n), w_->layers[0].wo.get(), q_dim);
  for (int64_t layer = 0; layer < hp_.n_layer; ++layer) {
    const CudaLayer& w = w_->layers[static_cast<size_t>(layer)];
    if (family_) {
      enqueue_family_layer(layer, n, att);
      if (taps) enqueue_taps(layer, n_logit, gathered);
      continue;
    }
    if (!few_rows) {
      enqueue_gemm_layer(layer, n, att);
      if (taps) enqueue_taps(layer, n_logit, gathered);
      continue;
    }
    const int m = static_cast<int>(n);
    // q, k, v = wqkv · norm(x), RoPE on q and k, k and v into the pool.
    kernels::GemvArgs g =
        kernels::gemv_product(x_.get(), n_embd, m, w.wqkv.get(), qkv_dim, n_embd,
                              kernels::GemvEpilogue::kRopeKv, qkv_.get(), qkv_dim);
    g.norm = w.attn_norm.get();
    g.eps = hp_.rms_eps;
    g.overlap = overlap_;
    g.split_k = split_k_;
    w.qkv_blocks.use_in(g);
    g.rope = rope_.get();
    g.kv_slots = slots_.get();
    g.q_dim = static_cast<int>(q_dim);
    g.kv_dim = static_cast<int>(kv_dim);
    g.head_dim = static_cast<int>(hp_.head_dim);
    g.rot_dim = static_cast<int>(hp_.rot_dim);
    g.n_kv_head = static_cast<int>(hp_.n_kv_head);
    g.block_size = bs;
    g.k_pool = kv_->k(layer);
    g.v_pool = kv_->v(layer);
    kernels::launch_gemv(g, stream_);
    enqueue_attention(layer, att, att_.get(), nullptr);
    // x += wo · att
    kernels::GemvArgs o = kernels::gemv_product(att_.get(), q_dim, m, w.wo.get(), n_embd, q_dim,
                                                kernels::GemvEpilogue::kAdd, x_.get(), n_embd);
    o.overlap = overlap_;
    o.split_k = split_k_;
    w.wo_blocks.use_in(o);
    kernels::launch_gemv(o, stream_);
    // h = silu(gate · norm(x)) · (up · norm(x)), into gate_up_
    kernels::GemvArgs f =
        kernels::gemv_product(x_.get(), n_embd, m, w.w_gate_up.get(), 2 * n_ff, n_embd,
                              kernels::GemvEpilogue::kSwiGlu, gate_up_.get(), n_ff);
    f.norm = w.ffn_norm.get();
    f.eps = hp_.rms_eps;
    f.overlap = overlap_;
    f.split_k = split_k_;
    w.gate_up_blocks.use_in(f);
    kernels::launch_gemv(f, stream_);
    // x += w_down · h
    kernels::GemvArgs down =
        kernels::gemv_product(gate_up_.get(), n_ff, m, w.w_down.get(), n_embd, n_ff,
                              kernels::GemvEpilogue::kAdd, x_.get(), n_embd);
    down.overlap = overlap_;
    down.split_k = split_k_;
    w.down_blocks.use_in(down);
    kernels::launch_gemv(down, stream_);
    if (taps) enqueue_taps(layer, n_logit, gathered);
  }
}

void CudaDevice::enqueue_attention(int64_t layer, const StepAttention& a, float* out,
                                   uint16_t* out16) {
  const int64_t q_dim = hp_.q_dim(), qkv_dim = q_dim + 2 * hp_.kv_dim();
  // 1/√head_dim unless the family has its own (the same float for plain Llama as before).
  const float scale = hp_.attention_scale();
  kernels::CudaPagedKv pool{kv_->k(layer), kv_->v(layer), kv_->block_size(), hp_.n_kv_head,
                            hp_.head_dim};
  // The layer's window and soft-cap (0 for plain Llama: the kernels of the last GPU run).
  pool.window = static_cast<int32_t>(
      std::min<int64_t>(hp_.window(layer), std::numeric_limits<int32_t>::max()));
  pool.softcap = hp_.arch.attention_softcap;
  kernels::launch_paged_decode_attention(pool, att_rows_.get(), a.n_att_rows,
                                         a.has_paths ? paths_.get() : nullptr, a.max_keys,
                                         qkv_.get(), qkv_dim, out, q_dim, hp_.n_head, scale,
                                         attention_workspace(), stream_, overlap_, out16);
  kernels::launch_paged_prefill_attention(pool, chunks_.get(), a.n_chunks, a.max_chunk_tokens,
                                          qkv_.get(), qkv_dim, out, q_dim, hp_.n_head, scale,
                                          stream_, overlap_, out16, prompt_kernel_);
}

void CudaDevice::enqueue_gemm_layer(int64_t layer, int64_t n, const StepAttention& att) {
  const CudaLayer& w = w_->layers[static_cast<size_t>(layer)];
  const int32_t bs = kv_->block_size();
  const int64_t n_embd = hp_.n_embd, q_dim = hp_.q_dim(), kv_dim = hp_.kv_dim(), n_ff = hp_.n_ff;
  const int64_t qkv_dim = q_dim + 2 * kv_dim;
  // Attention block: norm (to bf16), QKV in one GEMM, RoPE on q and k together (adjacent in the
  // row), K/V into the pool, attention, output projection, residual add. The kernels between the
  // GEMMs may overlap the kernel before them (overlap_), as the GEMVs do.
  kernels::launch_rms_norm_bf16(x_.get(), w.attn_norm.get(), act16_.get(), n, n_embd, hp_.rms_eps,
                                stream_, overlap_);
  gemm_->bf16_nt(act16_.get(), w.wqkv.get(), qkv_.get(), n, qkv_dim, n_embd, stream_);
  if (fused_epilogues_) {
    // RoPE and the KV store in one launch; the attention writes its rows in bf16, the o GEMM's
    // input; x += wo · att in the GEMM's epilogue.
    kernels::RopeKvStore store;
    store.k_offset = q_dim;
    store.v_offset = q_dim + kv_dim;
    store.kv_slots = slots_.get();
    store.n_kv_head = static_cast<int>(hp_.n_kv_head);
    store.block_size = bs;
    store.k_pool = kv_->k(layer);
    store.v_pool = kv_->v(layer);
    kernels::launch_rope(qkv_.get(), positions_.get(), n, qkv_dim, hp_.n_head + hp_.n_kv_head,
                         hp_.head_dim, hp_.rot_dim, hp_.rope_base, stream_, overlap_, &store);
    enqueue_attention(layer, att, nullptr, act16_.get());
    gemm_->bf16_nt(act16_.get(), w.wo.get(), x_.get(), n, n_embd, q_dim, stream_, true);
  } else {
    // As on the last GPU run: RoPE, then the KV store, the attention in f32, its conversion to
    // bf16 and the o GEMM into proj_ (linear), then the residual add.
    kernels::launch_rope(qkv_.get(), positions_.get(), n, qkv_dim, hp_.n_head + hp_.n_kv_head,
                         hp_.head_dim, hp_.rot_dim, hp_.rope_base, stream_, overlap_);
    kernels::launch_kv_store_rows(qkv_.get() + q_dim, qkv_.get() + q_dim + kv_dim, qkv_dim,
                                  slots_.get(), n, static_cast<int>(hp_.n_kv_head),
                                  static_cast<int>(hp_.head_dim), bs, kv_->k(layer), kv_->v(layer),
                                  stream_, overlap_);
    enqueue_attention(layer, att, att_.get(), nullptr);
    linear(att_.get(), w.wo.get(), proj_.get(), n, n_embd, q_dim);
    kernels::launch_add_inplace(x_.get(), proj_.get(), n * n_embd, stream_, overlap_);
  }
  // FFN block: norm (to bf16), gate and up in one GEMM, SwiGLU (to bf16), down, residual add.
  kernels::launch_rms_norm_bf16(x_.get(), w.ffn_norm.get(), act16_.get(), n, n_embd, hp_.rms_eps,
                                stream_, overlap_);
  gemm_->bf16_nt(act16_.get(), w.w_gate_up.get(), gate_up_.get(), n, 2 * n_ff, n_embd, stream_);
  kernels::launch_silu_mul_rows_bf16(gate_up_.get(), n, n_ff, act16_.get(), stream_, overlap_);
  if (fused_epilogues_) {
    gemm_->bf16_nt(act16_.get(), w.w_down.get(), x_.get(), n, n_embd, n_ff, stream_, true);
  } else {
    gemm_->bf16_nt(act16_.get(), w.w_down.get(), proj_.get(), n, n_embd, n_ff, stream_);
    kernels::launch_add_inplace(x_.get(), proj_.get(), n * n_embd, stream_, overlap_);
  }
}

void CudaDevice::enqueue_family_layer(int64_t layer, int64_t n, const StepAttention& att) {
  const CudaLayer& w = w_->layers[static_cast<size_t>(layer)];
  const int64_t n_embd = hp_.n_embd, q_dim = hp_.q_dim(), kv_dim = hp_.kv_dim(), n_ff = hp_.n_ff;
  const int64_t qkv_dim = q_dim + 2 * kv_dim;
  // Attention block: norm (into proj_), QKV product, the family's Q/K preparation and the KV
  // store, attention, o product (into proj_), post-norm, residual add.
  kernels::launch_rms_norm(x_.get(), w.attn_norm.get(), proj_.get(), n, n_embd, hp_.rms_eps,
                           stream_, overlap_);
  linear(proj_.get(), w.wqkv.get(), qkv_.get(), n, qkv_dim, n_embd, &w.qkv_blocks);
  kernels::PrepareQkArgs p;
  p.qkv = qkv_.get();
  p.rows = n;
  p.row_stride = qkv_dim;
  p.n_head = hp_.n_head;
  p.n_kv_head = hp_.n_kv_head;
  p.head_dim = hp_.head_dim;
  p.rot_dim = hp_.rot_dim;
  p.halves = hp_.arch.rope_style == RopeStyle::kHalves;
  p.bias = w.qkv_bias.get();  // null when the family has none
  p.q_norm = w.q_norm.get();
  p.k_norm = w.k_norm.get();
  p.eps = hp_.rms_eps;
  const int rope = hp_.arch.layers.empty() ? 0 : hp_.arch.layers[static_cast<size_t>(layer)].rope;
  if (hp_.rot_dim > 0) p.rope = rope_.get() + rope * n * hp_.rot_dim;  // family_rope_tables
  p.kv_slots = slots_.get();
  p.block_size = kv_->block_size();
  p.k_pool = kv_->k(layer);
  p.v_pool = kv_->v(layer);
  kernels::launch_prepare_qk(p, stream_, overlap_);
  enqueue_attention(layer, att, att_.get(), nullptr);
  linear(att_.get(), w.wo.get(), proj_.get(), n, n_embd, q_dim, &w.wo_blocks);
  add_sublayer(w.post_attn_norm, n);
  // FFN block: norm (into proj_), gate and up in one product, the gated activation (into ffn_),
  // down (into proj_), post-norm, residual add.
  kernels::launch_rms_norm(x_.get(), w.ffn_norm.get(), proj_.get(), n, n_embd, hp_.rms_eps, stream_,
                           overlap_);
  linear(proj_.get(), w.w_gate_up.get(), gate_up_.get(), n, 2 * n_ff, n_embd, &w.gate_up_blocks);
  kernels::launch_glu_rows(gate_up_.get(), n, n_ff,
                           hp_.arch.activation == FfnActivation::kGeluTanh
                               ? kernels::GluActivation::kGeluTanh
                               : kernels::GluActivation::kSilu,
                           ffn_.get(), stream_, overlap_);
  linear(ffn_.get(), w.w_down.get(), proj_.get(), n, n_embd, n_ff, &w.down_blocks);
  add_sublayer(w.post_ffn_norm, n);
}

void CudaDevice::add_sublayer(const DeviceArray<float>& post_norm, int64_t n) {
  const int64_t n_embd = hp_.n_embd;
  if (post_norm.get() != nullptr)
    kernels::launch_rms_norm(proj_.get(), post_norm.get(), proj_.get(), n, n_embd, hp_.rms_eps,
                             stream_, overlap_);
  kernels::launch_add_inplace(x_.get(), proj_.get(), n * n_embd, stream_, overlap_);
}

void CudaDevice::family_rope_tables(int64_t n) {
  if (hp_.rot_dim <= 0) return;
  const auto half = static_cast<size_t>(hp_.rot_dim / 2);
  const size_t per_table = static_cast<size_t>(n) * 2 * half;
  h_rope_.resize(hp_.arch.ropes.size() * per_table);
  for (size_t t = 0; t < hp_.arch.ropes.size(); ++t) {
    const RopeSpec& rope = hp_.arch.ropes[t];
    for (int64_t i = 0; i < n; ++i) {
      float* row = h_rope_.data() + t * per_table + static_cast<size_t>(i) * 2 * half;
      kernels::rope_table_scaled(
          rows_.positions[static_cast<size_t>(i)], hp_.rot_dim, rope.base, rope.pos_scale,
          rope.factors.empty() ? nullptr : rope.factors.data(), rope.attn_factor, row, row + half);
    }
  }
}

void CudaDevice::prepare_fused_layers(int64_t n_logit, bool taps) {
  std::vector<kernels::DecodeLayer> table(static_cast<size_t>(hp_.n_layer));
  for (int64_t layer = 0; layer < hp_.n_layer; ++layer) {
    const CudaLayer& w = w_->layers[static_cast<size_t>(layer)];
    kernels::DecodeLayer& l = table[static_cast<size_t>(layer)];
    l.attn_norm = w.attn_norm.get();
    l.ffn_norm = w.ffn_norm.get();
    l.wqkv = w.wqkv.get();
    l.wo = w.wo.get();
    l.w_gate_up = w.w_gate_up.get();
    l.w_down = w.w_down.get();
    l.k_pool = kv_->k(layer);
    l.v_pool = kv_->v(layer);
    const auto at = std::find(taps_.begin(), taps_.end(), static_cast<int32_t>(layer));
    if (taps && at != taps_.end())
      l.tap = taps_rows_.get() + (at - taps_.begin()) * n_logit * hp_.n_embd;
  }
  const auto same = [](const kernels::DecodeLayer& a, const kernels::DecodeLayer& b) {
    return a.attn_norm == b.attn_norm && a.ffn_norm == b.ffn_norm && a.wqkv == b.wqkv &&
           a.wo == b.wo && a.w_gate_up == b.w_gate_up && a.w_down == b.w_down &&
           a.k_pool == b.k_pool && a.v_pool == b.v_pool && a.tap == b.tap;
  };
  if (std::equal(table.begin(), table.end(), h_fused_layers_.begin(), h_fused_layers_.end(), same))
    return;
  // A graph holds the table's address, not its contents: a new table is uploaded in place,
  // in stream order after the steps that read the old one.
  if (fused_layers_.reserve(table.size(), name_, "the fused layers' table")) drop_graphs();
  check(cudaMemcpyAsync(fused_layers_.get(), table.data(), table.size() * sizeof(table[0]),
                        cudaMemcpyHostToDevice, stream_),
        name_, "uploading the fused layers' table");
  h_fused_layers_ = std::move(table);
}

void CudaDevice::enqueue_fused_layers(int64_t n, int64_t n_logit, bool has_paths, int32_t max_keys,
                                      bool gathered, bool taps) {
  kernels::DecodeLayersArgs a;
  a.layers = fused_layers_.get();
  a.n_layer = static_cast<int>(hp_.n_layer);
  a.m = static_cast<int>(n);
  a.tensor_cores = fused_tensor_cores_;
  a.n_embd = static_cast<int>(hp_.n_embd);
  a.n_head = static_cast<int>(hp_.n_head);
  a.n_kv_head = static_cast<int>(hp_.n_kv_head);
  a.head_dim = static_cast<int>(hp_.head_dim);
  a.rot_dim = static_cast<int>(hp_.rot_dim);
  a.n_ff = static_cast<int>(hp_.n_ff);
  a.block_size = kv_->block_size();
  a.eps = hp_.rms_eps;
  a.scale = 1.0f / std::sqrt(static_cast<float>(hp_.head_dim));
  a.x = x_.get();
  a.qkv = qkv_.get();
  a.att = att_.get();
  a.ffn = gate_up_.get();
  a.rope = rope_.get();
  a.kv_slots = slots_.get();
  a.rows = att_rows_.get();
  a.paths = has_paths ? paths_.get() : nullptr;
  a.max_keys = max_keys;
  // The taps' pointers are in the layer table (prepare_fused_layers); without taps none is set.
  a.n_logit = taps ? static_cast<int>(n_logit) : 0;
  a.logit_rows = gathered ? logit_rows_.get() : nullptr;
  a.partials = workspace_.get();
  a.partial_floats = static_cast<int64_t>(workspace_.size());
  a.counts = split_counts_.get();
  a.count_ints = static_cast<int64_t>(split_counts_.size());
  a.barrier = fused_barrier_.get();
  a.phase_ns = fused_clock_.get();
  kernels::launch_decode_layers(a, fused_grid_, stream_);
}

void CudaDevice::enqueue_taps(int64_t layer, int64_t n_logit, bool gathered) {
  const auto at = std::find(taps_.begin(), taps_.end(), static_cast<int32_t>(layer));
  if (at == taps_.end()) return;
  const int64_t d = hp_.n_embd;
  float* out = taps_rows_.get() + (at - taps_.begin()) * n_logit * d;
  if (gathered) gather_logit_rows(n_logit);
  kernels::launch_rms_norm(gathered ? xg_.get() : x_.get(), ones_.get(), out, n_logit, d,
                           hp_.rms_eps, stream_, overlap_);
}

void CudaDevice::gather_logit_rows(int64_t n_logit) {
  // Each f32 row as 2 · n_embd 16-bit halves: a plain copy, bit for bit.
  kernels::launch_gather_rows_u16(reinterpret_cast<const uint16_t*>(x_.get()), 2 * hp_.n_embd,
                                  logit_rows_.get(), n_logit,
                                  reinterpret_cast<uint16_t*>(xg_.get()), stream_);
}

bool CudaDevice::set_draft_taps(bool on) {
  std::vector<int32_t> layers = on ? draft_tap_layers(hp_.n_layer) : std::vector<int32_t>{};
  if (!layers.empty() && ones_.size() == 0) {
    check(cudaSetDevice(spec_.index), name_, "selecting the device");
    const std::vector<float> ones(static_cast<size_t>(hp_.n_embd), 1.0f);
    ones_.reserve(ones.size(), name_, "layer taps");
    // On the device's stream, which the taps' kernels run on (a pageable source is staged before
    // the call returns).
    check(cudaMemcpyAsync(ones_.get(), ones.data(), ones.size() * sizeof(float),
                          cudaMemcpyHostToDevice, stream_),
          name_, "uploading the layer taps' norm");
  }
  if (layers != taps_) drop_graphs();  // a captured step keeps the layers it tapped
  taps_ = std::move(layers);
  return !taps_.empty();
}

void CudaDevice::run_graph(int64_t n, int32_t max_keys_bucket, bool taps) {
  Graph& g = graphs_[{n, max_keys_bucket, taps}];
  const bool fused = fused_step(n);
  if ((g.exec == nullptr && g.runs < 1) || (fused && !fused_graphs_)) {
    g.runs = 1;
    enqueue_forward(n, n, n, false, max_keys_bucket, 0, 0, false, taps);
    return;
  }
  if (g.exec == nullptr) {
    try {
      capture_graph(g, n, max_keys_bucket, taps);
    } catch (const Error& e) {
      if (!fused) throw;
      // A driver that cannot capture the cooperative launch: the fused steps launch directly
      // from now on (nothing of the failed capture ran).
      cudaGetLastError();
      fused_graphs_ = false;
      logger("device")->warn("{}: the fused decode layers launch without CUDA graphs: {}", name_,
                             e.what());
      enqueue_forward(n, n, n, false, max_keys_bucket, 0, 0, false, taps);
      return;
    }
  }
  check(cudaGraphLaunch(g.exec, stream_), name_, "launching a decode step's CUDA graph");
}

void CudaDevice::capture_graph(Graph& g, int64_t n, int32_t max_keys_bucket, bool taps) {
  cudaGraph_t graph = nullptr;
  check(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal), name_,
        "starting a CUDA graph capture");
  try {
    enqueue_forward(n, n, n, false, max_keys_bucket, 0, 0, false, taps);
  } catch (...) {
    cudaStreamEndCapture(stream_, &graph);  // the stream leaves capture mode either way
    if (graph != nullptr) cudaGraphDestroy(graph);
    throw;
  }
  check(cudaStreamEndCapture(stream_, &graph), name_, "capturing a decode step");
  const cudaError_t err = cudaGraphInstantiate(&g.exec, graph, 0);
  cudaGraphDestroy(graph);
  check(err, name_, "instantiating a decode step's CUDA graph");
}

void CudaDevice::lm_head(const float* z, int64_t n, std::vector<float>& logits) {
  check(cudaSetDevice(spec_.index), name_, "selecting the device");
  logits.resize(static_cast<size_t>(std::max<int64_t>(n, 0)) * static_cast<size_t>(hp_.n_vocab));
  if (n <= 0) return;
  reserve_rows(1, n, 1);
  check(cudaMemcpyAsync(xgn_.get(), z, static_cast<size_t>(n * hp_.n_embd) * sizeof(float),
                        cudaMemcpyHostToDevice, stream_),
        name_, "uploading draft states");
  lm_head_rows(n, logits);
  sync("running the LM head");
}

void CudaDevice::lm_head_top(const float* z, int64_t n, std::span<const int32_t> wanted,
                             std::vector<std::vector<int32_t>>& best) {
  check(cudaSetDevice(spec_.index), name_, "selecting the device");
  best.clear();
  if (n <= 0) return;
  reserve_rows(1, n, 1);
  check(cudaMemcpyAsync(xgn_.get(), z, static_cast<size_t>(n * hp_.n_embd) * sizeof(float),
                        cudaMemcpyHostToDevice, stream_),
        name_, "uploading draft states");
  top_of_lm_head(n, wanted, best);
}

void CudaDevice::top_of_lm_head(int64_t n, std::span<const int32_t> wanted,
                                std::vector<std::vector<int32_t>>& best) {
  if (static_cast<int64_t>(wanted.size()) != n)
    throw Error(name_ + ": " + std::to_string(wanted.size()) + " top-token counts for " +
                std::to_string(n) + " rows");
  linear(xgn_.get(), w_->lm_head.get(), logits_.get(), n, hp_.n_vocab, hp_.n_embd,
         &w_->lm_head_blocks);
  apply_final_softcap(n);  // as the CPU's LM head (Device::lm_head_top)
  // The k best of a row, as top_tokens orders them.
  std::vector<kernels::CandidateFilter> filters;
  for (const int32_t k : wanted) filters.push_back(kernels::best_of(k));
  FilteredRows rows;
  filter_rows(n, hp_.n_vocab, filters, rows);
  best.assign(static_cast<size_t>(n), {});
  for (int64_t r = 0; r < n; ++r) {
    const LogitRow row = rows.row(r);
    const int32_t k = wanted[static_cast<size_t>(r)];
    if (!row.whole()) {
      best[static_cast<size_t>(r)].assign(row.ids.begin(), row.ids.end());
    } else if (k == 1) {  // a row without a usable maximum (NaN, infinities)
      best[static_cast<size_t>(r)] = {
          static_cast<int32_t>(kernels::argmax(row.logits.data(), hp_.n_vocab))};
    } else {
      best[static_cast<size_t>(r)] = top_tokens(row.logits.data(), hp_.n_vocab, k);
    }
  }
}

const CudaDevice::DraftWeights& CudaDevice::draft_weights(
    const std::shared_ptr<const DraftHead>& head) {
  if (auto it = draft_heads_.find(head.get());
      it != draft_heads_.end() && it->second.head == head) {
    it->second.last_used = ++draft_uses_;
    return it->second;
  }
  // Built aside and entered only once complete, so a failed upload leaves no half entry.
  DraftWeights kept;
  size_t w_floats = 0, b_floats = 0;
  for (const auto& w : head->w) w_floats += w.size();
  for (const auto& b : head->b) b_floats += b.size();
  kept.w.reserve(w_floats, name_, "a draft head's weights");
  kept.b.reserve(b_floats, name_, "a draft head's weights");
  size_t w_at = 0, b_at = 0;
  for (size_t k = 0; k < head->w.size(); ++k) {
    check(cudaMemcpyAsync(kept.w.get() + w_at, head->w[k].data(), head->w[k].size() * sizeof(float),
                          cudaMemcpyHostToDevice, stream_),
          name_, "uploading a draft head");
    check(cudaMemcpyAsync(kept.b.get() + b_at, head->b[k].data(), head->b[k].size() * sizeof(float),
                          cudaMemcpyHostToDevice, stream_),
          name_, "uploading a draft head");
    w_at += head->w[k].size();
    b_at += head->b[k].size();
  }
  if (head->is_mtp()) {
    const size_t n = head->vocab.size();
    kept.vocab.reserve(n, name_, "a draft head's vocabulary");
    kept.vocab_rows.reserve(n * static_cast<size_t>(hp_.n_embd), name_,
                            "a draft head's vocabulary");
    check(cudaMemcpyAsync(kept.vocab.get(), head->vocab.data(), n * sizeof(int32_t),
                          cudaMemcpyHostToDevice, stream_),
          name_, "uploading a draft head's vocabulary");
    launch(name_, "gathering a draft vocabulary's LM-head rows", [&] {
      kernels::launch_gather_rows_u16(w_->lm_head.get(), hp_.n_embd, kept.vocab.get(),
                                      static_cast<int64_t>(n), kept.vocab_rows.get(), stream_);
    });
    if (!head->fuse_w.empty()) {
      // W_f rounded to bf16 here (the products' weight type), uploaded on the stream its
      // products run on, as the vocabulary is (a pageable source is staged before the call
      // returns).
      std::vector<uint16_t> fuse(head->fuse_w.size());
      std::transform(head->fuse_w.begin(), head->fuse_w.end(), fuse.begin(),
                     [](float x) { return kernels::fp32_to_bf16(x); });
      kept.fuse_w.reserve(fuse.size(), name_, "a draft head's weights");
      check(cudaMemcpyAsync(kept.fuse_w.get(), fuse.data(), fuse.size() * sizeof(uint16_t),
                            cudaMemcpyHostToDevice, stream_),
            name_, "uploading a draft head's layer-tap fusion");
    }
  }
  kept.head = head;
  kept.last_used = ++draft_uses_;
  return draft_heads_[head.get()] = std::move(kept);
}

void CudaDevice::evict_draft_heads() {
  // After a call's work has finished (its sync): no kernel reads an evicted head any more.
  while (draft_heads_.size() > kMaxHeadsKept) {
    auto oldest = draft_heads_.begin();
    for (auto it = draft_heads_.begin(); it != draft_heads_.end(); ++it)
      if (it->second.last_used < oldest->second.last_used) oldest = it;
    draft_heads_.erase(oldest);
  }
}

void CudaDevice::medusa_top(std::span<const MedusaProposal> proposals,
                            std::span<const int32_t> wanted,
                            std::vector<std::vector<int32_t>>& best) {
  check(cudaSetDevice(spec_.index), name_, "selecting the device");
  const auto d = static_cast<size_t>(hp_.n_embd);
  int64_t rows = 0;
  for (const MedusaProposal& p : proposals) rows += p.levels;
  best.clear();
  if (static_cast<int64_t>(wanted.size()) != rows)
    throw Error(name_ + ": " + std::to_string(wanted.size()) + " top-token counts for " +
                std::to_string(rows) + " Medusa levels");
  if (rows <= 0) return;
  reserve_rows(1, std::max(rows, static_cast<int64_t>(proposals.size())), 1);
  // xg_: one hidden state per proposal. Row j of the levels reads its level's W and b and its
  // proposal's hidden state; the residual outputs z go to xgn_, the LM head's input.
  std::vector<const float*> h_w, h_b;
  std::vector<int32_t> h_src;
  for (size_t i = 0; i < proposals.size(); ++i) {
    const MedusaProposal& p = proposals[i];
    if (p.head->is_mtp() || p.head->info.n_embd != hp_.n_embd || p.levels > p.head->n_heads())
      throw Error(name_ + ": draft head '" + p.head->info.name + "' cannot propose " +
                  std::to_string(p.levels) + " Medusa levels for this model");
    const DraftWeights& weights = draft_weights(p.head);
    check(cudaMemcpyAsync(xg_.get() + i * d, p.hidden, d * sizeof(float), cudaMemcpyHostToDevice,
                          stream_),
          name_, "uploading draft states");
    for (int32_t level = 0; level < p.levels; ++level) {
      h_w.push_back(weights.w.get() + static_cast<size_t>(level) * d * d);
      h_b.push_back(weights.b.get() + static_cast<size_t>(level) * d);
      h_src.push_back(static_cast<int32_t>(i));
    }
  }
  medusa_w_.reserve(h_w.size(), name_, "draft-head rows");
  medusa_b_.reserve(h_b.size(), name_, "draft-head rows");
  medusa_src_.reserve(h_src.size(), name_, "draft-head rows");
  check(cudaMemcpyAsync(medusa_w_.get(), h_w.data(), h_w.size() * sizeof(h_w[0]),
                        cudaMemcpyHostToDevice, stream_),
        name_, "uploading draft-head rows");
  check(cudaMemcpyAsync(medusa_b_.get(), h_b.data(), h_b.size() * sizeof(h_b[0]),
                        cudaMemcpyHostToDevice, stream_),
        name_, "uploading draft-head rows");
  check(cudaMemcpyAsync(medusa_src_.get(), h_src.data(), h_src.size() * sizeof(h_src[0]),
                        cudaMemcpyHostToDevice, stream_),
        name_, "uploading draft-head rows");
  launch(name_, "Medusa residual blocks", [&] {
    kernels::launch_draft_residual(medusa_w_.get(), medusa_b_.get(), xg_.get(), medusa_src_.get(),
                                   nullptr, xgn_.get(), rows, hp_.n_embd, stream_);
  });
  top_of_lm_head(rows, wanted, best);  // ends with the stream's sync
  evict_draft_heads();
}

void CudaDevice::mtp_propose(std::span<const MtpProposal> proposals,
                             std::vector<std::vector<int32_t>>& drafts,
                             std::vector<std::vector<int32_t>>& parents) {
  check(cudaSetDevice(spec_.index), name_, "selecting the device");
  drafts.assign(proposals.size(), {});
  parents.assign(proposals.size(), {});
  // The proposals by head: each head's drafts step together, one row per proposal (a chain) or
  // per node of the level being expanded (a tree).
  std::map<const DraftHead*, std::vector<size_t>> by_head;
  for (size_t i = 0; i < proposals.size(); ++i) {
    const MtpProposal& p = proposals[i];
    if (!p.head->is_mtp() || p.head->info.n_embd != hp_.n_embd || p.max_nodes < 0 ||
        p.head->feature_width() > hidden_width() ||
        std::any_of(p.widths.begin(), p.widths.end(), [](int32_t w) { return w < 1; }))
      throw Error(name_ + ": draft head '" + p.head->info.name +
                  "' cannot draft that mtp tree for this model");
    if (!p.widths.empty() && p.max_nodes > 0) by_head[p.head.get()].push_back(i);
  }
  for (const auto& [key, all] : by_head) {
    const DraftWeights& weights = draft_weights(proposals[all.front()].head);
    // Chains (every width 1; a best-first chain is the chain itself) take the chain path, whose
    // tokens stay on the GPU; static and best-first trees go a level at a time.
    std::vector<size_t> chains, trees, best_first;
    for (const size_t i : all) {
      const MtpProposal& p = proposals[i];
      const bool chain =
          std::all_of(p.widths.begin(), p.widths.end(), [](int32_t w) { return w == 1; });
      (chain ? chains : p.best_first ? best_first : trees).push_back(i);
    }
    if (!chains.empty()) mtp_chain_group(proposals, chains, weights, drafts, parents);
    if (!trees.empty()) mtp_tree_group(proposals, trees, weights, drafts, parents);
    if (!best_first.empty()) mtp_best_first_group(proposals, best_first, weights, drafts, parents);
  }
  evict_draft_heads();  // every head's drafts have synced
}

void CudaDevice::upload_root_states(std::span<const MtpProposal> proposals,
                                    const std::vector<size_t>& members,
                                    const DraftWeights& weights) {
  const DraftHead& head = *weights.head;
  const auto d = static_cast<size_t>(hp_.n_embd);
  const auto m = members.size();
  const auto t_width = static_cast<size_t>(head.feature_width()) - d;  // 0 without taps
  h_roots_.resize(m * d);
  h_root_taps_.resize(m * t_width);
  for (size_t t = 0; t < m; ++t) {
    const float* f = proposals[members[t]].hidden;  // the head's features: h, then the taps
    float* root = h_roots_.data() + t * d;
    std::copy_n(f, d, root);
    if (t_width == 0) continue;
    for (size_t j = 0; j < d; ++j) root[j] += head.fuse_b[j];
    std::copy_n(f + d, t_width, h_root_taps_.data() + t * t_width);
  }
  check(cudaMemcpyAsync(xg_.get(), h_roots_.data(), h_roots_.size() * sizeof(float),
                        cudaMemcpyHostToDevice, stream_),
        name_, "uploading draft states");
  if (t_width == 0) return;
  root_taps_.reserve(m * t_width, name_, "draft features");
  if (act16_.reserve(m * t_width, name_, "draft features")) drop_graphs();  // linear's bf16 input
  check(cudaMemcpyAsync(root_taps_.get(), h_root_taps_.data(), h_root_taps_.size() * sizeof(float),
                        cudaMemcpyHostToDevice, stream_),
        name_, "uploading draft features");
  // g = (h + b_f) + W_f taps: the product into xgn_ (free until the first step writes z there).
  const auto rows = static_cast<int64_t>(m);
  linear(root_taps_.get(), weights.fuse_w.get(), xgn_.get(), rows, hp_.n_embd,
         static_cast<int64_t>(t_width));
  launch(name_, "fusing layer taps", [&] {
    kernels::launch_add_inplace(xg_.get(), xgn_.get(), rows * hp_.n_embd, stream_, overlap_);
  });
}

void CudaDevice::upload_draft_rows(const DraftWeights& weights, std::span<const int32_t> tokens,
                                   std::span<const int32_t> src) {
  const auto n = tokens.size();
  mtp_tokens_.reserve(n, name_, "draft tokens");
  medusa_w_.reserve(n, name_, "draft-head rows");
  medusa_b_.reserve(n, name_, "draft-head rows");
  medusa_src_.reserve(n, name_, "draft-head rows");
  const std::vector<const float*> h_w(n, weights.w.get());
  const std::vector<const float*> h_b(n, weights.b.get());
  auto upload = [&](auto* dst, const auto* host, const char* what) {
    check(cudaMemcpyAsync(dst, host, n * sizeof(*host), cudaMemcpyHostToDevice, stream_), name_,
          what);
  };
  upload(mtp_tokens_.get(), tokens.data(), "uploading draft tokens");
  upload(medusa_src_.get(), src.data(), "uploading draft-head rows");
  upload(medusa_w_.get(), h_w.data(), "uploading draft-head rows");
  upload(medusa_b_.get(), h_b.data(), "uploading draft-head rows");
}

void CudaDevice::mtp_step_rows(const DraftWeights& weights, const float* h, float* z, int64_t n) {
  const int64_t d = hp_.n_embd;
  // ĥ = h + SiLU(W [h; e(x)] + b) of each row's parent state and token, then its logits over V.
  kernels::launch_embedding(w_->embd_type, w_->embd.get(), mtp_tokens_.get(), x_.get(), n, d,
                            stream_, hp_.arch.embedding_scale);  // LlamaModel::embed's input
  kernels::launch_draft_residual(medusa_w_.get(), medusa_b_.get(), h, medusa_src_.get(), x_.get(),
                                 z, n, d, stream_);
  linear(z, weights.vocab_rows.get(), logits_.get(), n,
         static_cast<int64_t>(weights.head->vocab.size()), d);
}

void CudaDevice::mtp_chain_group(std::span<const MtpProposal> proposals,
                                 const std::vector<size_t>& members, const DraftWeights& weights,
                                 std::vector<std::vector<int32_t>>& drafts,
                                 std::vector<std::vector<int32_t>>& parents) {
  const auto m = static_cast<int64_t>(members.size());
  const auto v = static_cast<int64_t>(weights.head->vocab.size());
  auto length = [&](size_t i) {
    return std::min(static_cast<int32_t>(proposals[i].widths.size()), proposals[i].max_nodes);
  };
  int32_t steps = 0;
  for (const size_t i : members) steps = std::max(steps, length(i));
  // Rows: xg_ / xgn_ the states (h, then z: they swap each step), x_ the embeddings of the rows'
  // tokens, logits_ (m, |V|), argmax_ each row's best index into V. The tokens stay on the GPU
  // from step to step; all the drafts come down at the end.
  reserve_draft_rows(m, v);
  mtp_drafts_.reserve(static_cast<size_t>(m * steps), name_, "draft tokens");
  upload_root_states(proposals, members, weights);
  std::vector<int32_t> last, src;
  for (const size_t i : members) {
    src.push_back(static_cast<int32_t>(last.size()));
    last.push_back(proposals[i].last);
  }
  upload_draft_rows(weights, last, src);
  float* h = xg_.get();
  float* z = xgn_.get();
  launch(name_, "mtp chains", [&] {
    for (int32_t step = 0; step < steps; ++step) {
      mtp_step_rows(weights, h, z, m);
      kernels::launch_argmax_rows(logits_.get(), argmax_.get(), m, v, stream_);
      kernels::launch_gather_i32(weights.vocab.get(), argmax_.get(), m, mtp_tokens_.get(), stream_);
      check(cudaMemcpyAsync(mtp_drafts_.get() + static_cast<int64_t>(step) * m, mtp_tokens_.get(),
                            static_cast<size_t>(m) * sizeof(int32_t), cudaMemcpyDeviceToDevice,
                            stream_),
            name_, "keeping draft tokens");
      std::swap(h, z);
    }
  });
  std::vector<int32_t> all(static_cast<size_t>(m * steps));  // (steps, m)
  check(cudaMemcpyAsync(all.data(), mtp_drafts_.get(), all.size() * sizeof(int32_t),
                        cudaMemcpyDeviceToHost, stream_),
        name_, "downloading draft tokens");
  sync("drafting mtp chains");
  for (int64_t r = 0; r < m; ++r) {
    const size_t i = members[static_cast<size_t>(r)];
    for (int32_t step = 0; step < length(i); ++step) {
      drafts[i].push_back(all[static_cast<size_t>(step * m + r)]);
      parents[i].push_back(step - 1);
    }
  }
}

void CudaDevice::mtp_tree_group(std::span<const MtpProposal> proposals,
                                const std::vector<size_t>& members, const DraftWeights& weights,
                                std::vector<std::vector<int32_t>>& drafts,
                                std::vector<std::vector<int32_t>>& parents) {
  const auto v = static_cast<int64_t>(weights.head->vocab.size());
  const std::vector<int32_t>& vocab = weights.head->vocab;
  // Level by level: the frontier's rows (one per node whose children are drafted next) step
  // together; their best columns come back, and the host grows each proposal's tree in level
  // order exactly as DraftHead::mtp_propose does, stopping a proposal at its max_nodes.
  struct Row {
    size_t proposal;
    int32_t index;  // in drafts[proposal]; −1: the root (the last token)
    int32_t token;
  };
  // A level's rows: per proposal at most min(max_nodes, the widths' product above the level).
  int64_t most_rows = 0;
  for (size_t level = 0;; ++level) {
    int64_t level_rows = 0;
    bool any = false;
    for (const size_t i : members) {
      const MtpProposal& p = proposals[i];
      if (level >= p.widths.size()) continue;
      any = true;
      int64_t nodes = 1;
      for (size_t l = 0; l < level && nodes < p.max_nodes; ++l) nodes *= p.widths[l];
      level_rows += std::min<int64_t>(nodes, level == 0 ? 1 : p.max_nodes);
    }
    if (!any) break;
    most_rows = std::max(most_rows, level_rows);
  }
  reserve_draft_rows(most_rows, v);
  std::vector<Row> frontier;
  std::vector<int32_t> tokens, src;
  upload_root_states(proposals, members, weights);
  for (const size_t i : members) {
    src.push_back(static_cast<int32_t>(frontier.size()));
    frontier.push_back({i, -1, proposals[i].last});
  }
  std::vector<bool> full(proposals.size(), false);
  float* h = xg_.get();
  float* z = xgn_.get();
  for (size_t level = 0; !frontier.empty(); ++level) {
    const auto n = static_cast<int64_t>(frontier.size());
    tokens.clear();
    for (const Row& row : frontier) tokens.push_back(row.token);
    upload_draft_rows(weights, tokens, src);
    std::vector<kernels::CandidateFilter> filters;
    for (const Row& row : frontier)
      filters.push_back(kernels::best_of(proposals[row.proposal].widths[level]));
    FilteredRows best;
    launch(name_, "an mtp tree level", [&] { mtp_step_rows(weights, h, z, n); });
    filter_rows(n, v, filters, best);  // ends with the stream's sync
    std::vector<Row> next;
    std::vector<int32_t> next_src;
    for (size_t j = 0; j < frontier.size(); ++j) {
      const Row& row = frontier[j];
      const size_t p = row.proposal;
      if (full[p]) continue;
      const MtpProposal& proposal = proposals[p];
      const int32_t take = static_cast<int32_t>(std::min<int64_t>(proposal.widths[level], v));
      // The row's best `take` columns, best first, ties to the lower column.
      const LogitRow candidates = best.row(static_cast<int64_t>(j));
      for (const auto& [logit, column] : best_columns(candidates, v, take)) {
        if (static_cast<int32_t>(drafts[p].size()) == proposal.max_nodes) {
          full[p] = true;
          break;
        }
        const int32_t token = vocab[static_cast<size_t>(column)];
        if (level + 1 < proposal.widths.size()) {
          next.push_back({p, static_cast<int32_t>(drafts[p].size()), token});
          next_src.push_back(static_cast<int32_t>(j));
        }
        drafts[p].push_back(token);
        parents[p].push_back(row.index);
      }
    }
    frontier = std::move(next);
    src = std::move(next_src);
    std::swap(h, z);
  }
}

void CudaDevice::mtp_best_first_group(std::span<const MtpProposal> proposals,
                                      const std::vector<size_t>& members,
                                      const DraftWeights& weights,
                                      std::vector<std::vector<int32_t>>& drafts,
                                      std::vector<std::vector<int32_t>>& parents) {
  const auto v = static_cast<int64_t>(weights.head->vocab.size());
  const std::vector<int32_t>& vocab = weights.head->vocab;
  // Level by level, the nodes of the whole `widths` tree that can still be among a proposal's
  // max_nodes most probable ones (path probability: the product of the head's softmax over its
  // vocabulary from the last token down) are expanded together. A deeper node is never more
  // probable than its parent, so the best max_nodes so far only get better as nodes are found:
  // a node ranked below them now never enters, and the final best max_nodes are the ones
  // DraftHead::mtp_propose_best_first grows one by one (ties aside).
  struct Node {
    double log_p;
    int64_t order;  // ties: the node found first
    int32_t token;
    int32_t parent;     // index in the proposal's nodes; −1: the last token
    int32_t depth;      // 1: a child of the last token
    int32_t state_row;  // the row of its parent's state at the level that found it
  };
  const auto better = [](const Node& a, const Node& b) {
    return a.log_p > b.log_p || (a.log_p == b.log_p && a.order < b.order);
  };
  std::vector<std::vector<Node>> found(members.size());
  struct Row {
    size_t member;
    int32_t node;  // −1: the root
    double log_p;
    int32_t depth;
  };
  // A level expands at most max_nodes nodes per proposal (those ranking among its best).
  int64_t most_rows = 0;
  for (const size_t i : members) most_rows += std::max(proposals[i].max_nodes, 1);
  reserve_draft_rows(most_rows, v);
  row_lse_.reserve(static_cast<size_t>(most_rows), name_, "draft normalisers");
  std::vector<Row> rows;
  std::vector<int32_t> tokens, src;
  upload_root_states(proposals, members, weights);
  for (size_t t = 0; t < members.size(); ++t) {
    const MtpProposal& p = proposals[members[t]];
    rows.push_back({t, -1, 0.0, 0});
    tokens.push_back(p.last);
    src.push_back(static_cast<int32_t>(t));
  }
  float* h = xg_.get();
  float* z = xgn_.get();
  std::vector<float> lse;
  while (!rows.empty()) {
    const auto n = static_cast<int64_t>(rows.size());
    upload_draft_rows(weights, tokens, src);
    std::vector<kernels::CandidateFilter> filters(rows.size());
    for (size_t j = 0; j < rows.size(); ++j)
      filters[j] = kernels::best_of(
          proposals[members[rows[j].member]].widths[static_cast<size_t>(rows[j].depth)]);
    lse.resize(rows.size());
    launch(name_, "a best-first mtp tree level", [&] {
      mtp_step_rows(weights, h, z, n);
      kernels::launch_row_logsumexp(logits_.get(), n, v, row_lse_.get(), stream_);
    });
    check(cudaMemcpyAsync(lse.data(), row_lse_.get(), lse.size() * sizeof(float),
                          cudaMemcpyDeviceToHost, stream_),
          name_, "downloading draft normalisers");
    FilteredRows best;
    filter_rows(n, v, filters, best);  // ends with the stream's sync (lse is down too)
    // Each row's children, best first.
    std::vector<size_t> fresh_from(members.size());
    for (size_t t = 0; t < members.size(); ++t) fresh_from[t] = found[t].size();
    for (size_t j = 0; j < rows.size(); ++j) {
      const Row& row = rows[j];
      const int32_t take = static_cast<int32_t>(std::min<int64_t>(filters[j].top_k, v));
      const LogitRow candidates = best.row(static_cast<int64_t>(j));
      std::vector<Node>& nodes = found[row.member];
      for (const auto& [logit, column] : best_columns(candidates, v, take)) {
        // A child is never more probable than its parent, also after rounding (the pruning
        // relies on it); NaN (infinite logits) ranks last.
        double log_p = std::min(
            row.log_p, row.log_p + (static_cast<double>(logit) - static_cast<double>(lse[j])));
        if (std::isnan(log_p)) log_p = -std::numeric_limits<double>::infinity();
        nodes.push_back({log_p, static_cast<int64_t>(nodes.size()),
                         vocab[static_cast<size_t>(column)], row.node, row.depth + 1,
                         static_cast<int32_t>(j)});
      }
    }
    // The next level: the nodes just found that rank among their proposal's best max_nodes and
    // have children to draft.
    std::vector<Row> next;
    std::vector<int32_t> next_tokens, next_src;
    for (size_t t = 0; t < members.size(); ++t) {
      const MtpProposal& p = proposals[members[t]];
      std::vector<Node>& nodes = found[t];
      std::vector<int32_t> by_rank(nodes.size());
      std::iota(by_rank.begin(), by_rank.end(), 0);
      std::sort(by_rank.begin(), by_rank.end(), [&](int32_t a, int32_t b) {
        return better(nodes[static_cast<size_t>(a)], nodes[static_cast<size_t>(b)]);
      });
      const size_t keep = std::min(by_rank.size(), static_cast<size_t>(p.max_nodes));
      for (size_t r = 0; r < keep; ++r) {
        const auto at = static_cast<size_t>(by_rank[r]);
        const Node& node = nodes[at];
        if (at < fresh_from[t] || node.depth >= static_cast<int32_t>(p.widths.size())) continue;
        next.push_back({t, static_cast<int32_t>(at), node.log_p, node.depth});
        next_tokens.push_back(node.token);
        next_src.push_back(node.state_row);
      }
    }
    rows = std::move(next);
    tokens = std::move(next_tokens);
    src = std::move(next_src);
    std::swap(h, z);
  }
  // Each proposal's best max_nodes in level order: by depth, then by the parent's place, then
  // best first.
  for (size_t t = 0; t < members.size(); ++t) {
    const size_t i = members[t];
    std::vector<Node>& nodes = found[t];
    std::vector<int32_t> chosen(nodes.size());
    std::iota(chosen.begin(), chosen.end(), 0);
    std::sort(chosen.begin(), chosen.end(), [&](int32_t a, int32_t b) {
      return better(nodes[static_cast<size_t>(a)], nodes[static_cast<size_t>(b)]);
    });
    chosen.resize(std::min(chosen.size(), static_cast<size_t>(proposals[i].max_nodes)));
    std::vector<int32_t> place(nodes.size(), -1);
    std::vector<int32_t> ordered;
    for (int32_t depth = 1; ordered.size() < chosen.size(); ++depth) {
      std::vector<int32_t> level;
      for (const int32_t c : chosen)
        if (nodes[static_cast<size_t>(c)].depth == depth) level.push_back(c);
      // chosen is best first, so a stable sort by the parent's place keeps each parent's
      // children best first.
      std::stable_sort(level.begin(), level.end(), [&](int32_t a, int32_t b) {
        const int32_t pa = nodes[static_cast<size_t>(a)].parent;
        const int32_t pb = nodes[static_cast<size_t>(b)].parent;
        return (pa < 0 ? -1 : place[static_cast<size_t>(pa)]) <
               (pb < 0 ? -1 : place[static_cast<size_t>(pb)]);
      });
      for (const int32_t c : level) {
        place[static_cast<size_t>(c)] = static_cast<int32_t>(ordered.size());
        ordered.push_back(c);
      }
    }
    for (const int32_t c : ordered) {
      const Node& node = nodes[static_cast<size_t>(c)];
      drafts[i].push_back(node.token);
      parents[i].push_back(node.parent < 0 ? -1 : place[static_cast<size_t>(node.parent)]);
    }
  }
}

}  // namespace

std::unique_ptr<Device> make_cuda_device(DeviceSpec spec, const LlamaModel& model, int threads,
                                         int32_t kv_blocks, int32_t block_size,
                                         CudaOptions options) {
  if (spec.kind != DeviceKind::kCuda) throw Error(spec.name() + " is not a CUDA device");
  return std::make_unique<CudaDevice>(spec, model, threads, kv_blocks, block_size, options);
}

int cuda_fused_layers_grid(const Device& device) {
  const auto* cuda = dynamic_cast<const CudaDevice*>(&device);
  return cuda != nullptr ? cuda->fused_grid() : 0;
}

std::optional<FusedPhaseTimes> CudaDevice::fused_phase_times() {
  if (fused_grid_ == 0) return std::nullopt;
  cudaSetDevice(spec_.index);
  std::array<unsigned long long, kernels::kDecodeLayersClockSlots> ns{};
  check(cudaMemcpyAsync(ns.data(), fused_clock_.get(), sizeof(ns), cudaMemcpyDeviceToHost, stream_),
        name_, "reading the fused layers' clock");
  check(cudaMemsetAsync(fused_clock_.get(), 0, sizeof(ns), stream_), name_,
        "clearing the fused layers' clock");
  sync("reading the fused layers' clock");
  const auto steps = static_cast<int64_t>(ns[kernels::kDecodeLayersLaunchSlot]);
  if (steps == 0) return std::nullopt;
  const auto us = [&](int slot) {
    return static_cast<double>(ns[static_cast<size_t>(slot)]) / 1e3 / static_cast<double>(steps);
  };
  return FusedPhaseTimes{
      steps, us(0), us(1), us(2), us(3), us(4), us(kernels::kDecodeLayersTailSlot)};
}

std::optional<FusedPhaseTimes> cuda_fused_phase_times(Device& device) {
  auto* cuda = dynamic_cast<CudaDevice*>(&device);
  return cuda != nullptr ? cuda->fused_phase_times() : std::nullopt;
}

std::optional<double> cuda_last_step_gpu_ms(const Device& device) {
  const auto* cuda = dynamic_cast<const CudaDevice*>(&device);
  return cuda != nullptr ? cuda->last_step_gpu_ms() : std::nullopt;
}

std::pair<std::unique_ptr<Device>, std::unique_ptr<Device>> make_cuda_partitions(
    DeviceSpec prefill, DeviceSpec decode, const LlamaModel& model, int prefill_threads,
    int decode_threads, int32_t kv_slots, int32_t block_size, CudaOptions options) {
  check_partition_specs(prefill, decode);
  auto first =
      std::make_unique<CudaDevice>(prefill, model, prefill_threads, kv_slots, block_size, options);
  auto second = std::make_unique<CudaDevice>(decode, model, decode_threads, kv_slots, block_size,
                                             options, first->kv_tensors());
  return {std::move(first), std::move(second)};
}

#endif

}  // namespace tokenfab
