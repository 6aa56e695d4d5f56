// The CUDA Device's pass over one planned batch (cuda_model_impl.h): run, run_greedy and
// run_filtered; forward's uploads (block tables, positions, RoPE angles, KV slots, attention rows)
// and its routing of each sequence to the prompt or the decode attention; enqueue_forward (the
// embedding, the layers fused or layered, the final norm and LM head); the outputs' downloads;
// the step clock; and the CUDA graphs that decode-only steps replay.

#if TOKENFAB_HAVE_CUDA
#include <cuda_runtime.h>

#include <algorithm>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "core/common/error.h"
#include "core/common/log.h"
#include "core/device/cuda_model_impl.h"
#include "kernels/cpu/ops.h"
#include "kernels/cuda/argmax.cuh"
#include "kernels/cuda/embedding.cuh"
#include "kernels/cuda/rms_norm.cuh"

namespace tokenfab::cuda_backend {

namespace {

// Decode steps' CUDA graphs are captured per row count and per this many keys of context: the
// attention grid covers the bucket (about 1 µs of idle splits per 1,024 keys).
constexpr int32_t kGraphKeyBucket = 1024;

// Prompt chunks of at least this many tokens use the tiled prefill attention kernel (their rows
// share each key tile); shorter ones, and the rows of verified chains where they go to the decode
// kernel (CudaOptions::chains_on_decode_kernel), are decode rows.
constexpr int64_t kMinPrefillChunk = 4;

}  // namespace

void CudaDevice::drop_graphs() {
  for (auto& [key, g] : graphs_)
    if (g.exec != nullptr) cudaGraphExecDestroy(g.exec);
  graphs_.clear();
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

}  // namespace tokenfab::cuda_backend

#endif  // TOKENFAB_HAVE_CUDA
