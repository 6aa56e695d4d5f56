// The CUDA Device (cuda_model.h): the KV pool in device memory and the forward pass of one planned
// batch, over the weights of cuda_weights.h. Everything of one device runs on its one stream, in
// order, so the pool's block copies, the pass and the logits' download need no other
// synchronisation; the step ends with one cudaStreamSynchronize, when the host needs the logits.
// This file: construction (the checks that the model and its KV pool fit), teardown, the pass's
// buffers, and the public functions of cuda_model.h; the class is in cuda_model_impl.h, which
// lists the files that hold its other parts.

#include "core/device/cuda_model.h"

#include <string>

#include "core/common/error.h"
#include "core/common/log.h"

#if TOKENFAB_HAVE_CUDA
#include <cuda_runtime.h>

#include <algorithm>
#include <exception>
#include <memory>
#include <optional>
#include <utility>

#include "core/device/cuda_model_impl.h"
#include "core/model/architecture.h"
#include "kernels/cuda/overlap_support.cuh"
#include "kernels/cuda/rope.cuh"
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

namespace cuda_backend {

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

}  // namespace cuda_backend

using cuda_backend::CudaDevice;

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
