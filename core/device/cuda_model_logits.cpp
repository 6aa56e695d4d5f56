// The CUDA Device's logits (cuda_model_impl.h): the LM head over given states (lm_head,
// lm_head_top), the final soft-cap, and each logit row's sampling candidates or top tokens
// computed on the GPU (filter_rows, top_of_lm_head).

#if TOKENFAB_HAVE_CUDA
#include <cuda_runtime.h>

#include <algorithm>
#include <span>
#include <string>
#include <vector>

#include "core/common/error.h"
#include "core/device/cuda_model_impl.h"
#include "kernels/cpu/ops.h"
#include "kernels/cuda/argmax.cuh"
#include "kernels/cuda/softcap.cuh"

namespace tokenfab::cuda_backend {

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

void CudaDevice::apply_final_softcap(int64_t rows) {
  const float cap = hp_.arch.final_softcap;
  if (cap <= 0.0f || rows <= 0) return;
  launch(name_, "soft-capping logits", [&] {
    kernels::launch_softcap(logits_.get(), rows * hp_.n_vocab, cap, stream_, overlap_);
  });
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

}  // namespace tokenfab::cuda_backend

#endif  // TOKENFAB_HAVE_CUDA
