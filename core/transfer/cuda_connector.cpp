// The CUDA KvConnector backends (kv_connector.h): cuda_p2p and host_staged, and "cuda", which takes
// the peer path where the two GPUs allow it and host staging otherwise.
//
// A layer crosses in one copy. The source's blocks of that layer are packed into one contiguous
// buffer (kv_blocks_pack.cuh) on the source GPU, or gathered with memcpy into pinned memory from
// a host pool. The buffer then moves:
//   peer         cudaMemcpyPeerAsync into a buffer on the destination GPU, or nothing at all
//                when both pools are on one GPU (its two partitions);
//   host staged  into pinned host memory and from there to the destination GPU.
// Finally it is unpacked into the destination's blocks.
// Buffers are double-buffered by layer parity, and events order the streams of the two GPUs:
// layer l + 1 is packed and sent while layer l is still being unpacked, and a buffer is reused
// only once the layer that last used it has been unpacked. The connector's thread waits for the
// GPUs once, at the end of the transfer. Bytes and layers_done therefore count layers as they are
// queued on the GPUs; the transfer is done, with its duration, only once they have all landed.

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "core/common/error.h"
#include "core/transfer/kv_connector.h"

#if TOKENFAB_HAVE_CUDA
#include <cuda_runtime.h>

#include <array>
#include <charconv>
#include <cstring>
#include <map>
#include <utility>
#include <vector>

#include "core/transfer/queued_connector.h"
#include "kernels/cuda/kv_blocks_pack.cuh"
#endif

namespace tokenfab {

#if !TOKENFAB_HAVE_CUDA

std::unique_ptr<KvConnector> make_cuda_connector(std::string_view backend) {
  throw Error("KV connector \"" + std::string(backend) +
              "\" needs the CUDA backend, which this build does not have");
}

#else

namespace {

enum class Path : uint8_t { kAuto, kPeer, kHostStaged };

// The GPU index of a store named "cuda:N" (or "cuda:N/…", a partition); −1 for any other name.
int cuda_index(std::string_view name) {
  if (name.substr(0, 5) != "cuda:") return -1;
  int index = -1;
  const char* begin = name.data() + 5;
  const auto r = std::from_chars(begin, name.data() + name.size(), index);
  return r.ec == std::errc() && r.ptr != begin ? index : -1;
}

#define TOKENFAB_TRY_CUDA(expr)                                                          \
  do {                                                                                   \
    const cudaError_t tokenfab_err_ = (expr);                                            \
    if (tokenfab_err_ != cudaSuccess)                                                    \
      return std::string(#expr) + " failed: " + cudaGetErrorString(tokenfab_err_);      \
  } while (0)

// Device memory that grows, on one GPU.
struct GpuBuffer {
  void* data = nullptr;
  size_t bytes = 0;
  std::string reserve(int device, size_t want) {
    if (want <= bytes) return {};
    TOKENFAB_TRY_CUDA(cudaSetDevice(device));
    if (data != nullptr) cudaFree(data);
    data = nullptr;
    bytes = 0;
    TOKENFAB_TRY_CUDA(cudaMalloc(&data, want));
    bytes = want;
    return {};
  }
};

// What the connector keeps per GPU between transfers. A GPU can be both ends (two partitions of
// it), so the source and destination roles have buffers of their own.
struct GpuSide {
  cudaStream_t stream = nullptr;
  GpuBuffer src_ids, dst_ids;                // the transfer's block ids on this GPU
  std::array<GpuBuffer, 2> src_buf, dst_buf;  // packed layers, by parity
};

class CudaConnector final : public QueuedConnector {
 public:
  explicit CudaConnector(Path path) : path_(path) { start(); }
  ~CudaConnector() override;

  std::string_view backend() const override {
    return path_ == Path::kPeer ? "cuda_p2p" : path_ == Path::kHostStaged ? "host_staged" : "cuda";
  }

 protected:
  void check_store(const KvBlockStore& store) const override;
  std::string begin_transfer(const KvTransferSpec& spec) override;
  std::string copy_layer(const KvTransferSpec& spec, int32_t layer) override;
  std::string end_transfer(const KvTransferSpec& spec) override;

 private:
  std::string side(int device, GpuSide*& out);
  std::string upload_ids(int device, GpuSide& s, GpuBuffer& buffer, const std::vector<int32_t>& ids);
  std::string pinned(size_t bytes);
  void destroy_events();

  const Path path_;
  // Connector thread only.
  std::map<int, GpuSide> gpus_;
  std::array<void*, 2> host_{nullptr, nullptr};  // pinned staging, by parity
  size_t host_bytes_ = 0;
  // The current transfer.
  int src_dev_ = -1, dst_dev_ = -1;  // −1: a host pool
  bool peer_ = false;                // moved GPU to GPU (or not at all: one GPU)
  size_t layer_bytes_ = 0;           // one packed layer: K and V of every block
  std::array<cudaEvent_t, 2> copied_{nullptr, nullptr};    // on the source: the buffer left
  std::array<cudaEvent_t, 2> unpacked_{nullptr, nullptr};  // on the destination: it landed
  std::array<bool, 2> used_{false, false};                 // unpacked_[p] has been recorded
};

CudaConnector::~CudaConnector() {
  stop();
  destroy_events();
  for (auto& [device, s] : gpus_) {
    cudaSetDevice(device);
    if (s.stream != nullptr) cudaStreamSynchronize(s.stream);
    for (GpuBuffer* b : {&s.src_ids, &s.dst_ids, &s.src_buf[0], &s.src_buf[1], &s.dst_buf[0],
                         &s.dst_buf[1]})
      if (b->data != nullptr) cudaFree(b->data);
    if (s.stream != nullptr) cudaStreamDestroy(s.stream);
  }
  for (void* h : host_)
    if (h != nullptr) cudaFreeHost(h);
}

void CudaConnector::destroy_events() {
  for (auto* events : {&copied_, &unpacked_})
    for (cudaEvent_t& e : *events) {
      if (e != nullptr) cudaEventDestroy(e);
      e = nullptr;
    }
}

void CudaConnector::check_store(const KvBlockStore& store) const {
  if (store.memory() == KvMemory::kCuda) {
    if (cuda_index(store.device()) < 0)
      throw Error("the " + std::string(backend()) + " connector cannot tell which GPU \"" +
                  std::string(store.device()) + "\" is (expected a name cuda:N)");
    return;
  }
  if (path_ == Path::kPeer)
    throw Error("the cuda_p2p connector copies between GPUs; " + std::string(store.device()) +
                " holds its KV in host memory (use host_staged)");
}

std::string CudaConnector::side(int device, GpuSide*& out) {
  GpuSide& s = gpus_[device];
  if (s.stream == nullptr) {
    TOKENFAB_TRY_CUDA(cudaSetDevice(device));
    TOKENFAB_TRY_CUDA(cudaStreamCreateWithFlags(&s.stream, cudaStreamNonBlocking));
  }
  out = &s;
  return {};
}

std::string CudaConnector::upload_ids(int device, GpuSide& s, GpuBuffer& buffer,
                                      const std::vector<int32_t>& ids) {
  if (std::string e = buffer.reserve(device, ids.size() * sizeof(int32_t)); !e.empty()) return e;
  TOKENFAB_TRY_CUDA(cudaSetDevice(device));
  TOKENFAB_TRY_CUDA(cudaMemcpyAsync(buffer.data, ids.data(), ids.size() * sizeof(int32_t),
                                    cudaMemcpyHostToDevice, s.stream));
  // The ids live in pageable memory the caller keeps; the copy has read them once the stream has.
  TOKENFAB_TRY_CUDA(cudaStreamSynchronize(s.stream));
  return {};
}

std::string CudaConnector::pinned(size_t bytes) {
  if (bytes <= host_bytes_) return {};
  for (void*& h : host_) {
    if (h != nullptr) cudaFreeHost(h);
    h = nullptr;
  }
  host_bytes_ = 0;
  for (void*& h : host_) TOKENFAB_TRY_CUDA(cudaMallocHost(&h, bytes));
  host_bytes_ = bytes;
  return {};
}

std::string CudaConnector::begin_transfer(const KvTransferSpec& spec) {
  src_dev_ = spec.src->memory() == KvMemory::kCuda ? cuda_index(spec.src->device()) : -1;
  dst_dev_ = spec.dst->memory() == KvMemory::kCuda ? cuda_index(spec.dst->device()) : -1;
  if (src_dev_ < 0 && dst_dev_ < 0)
    return "both pools are in host memory; that is the loopback connector's work";
  layer_bytes_ = 2 * spec.src->block_bytes() * spec.src_blocks.size();
  peer_ = false;
  if (src_dev_ >= 0 && dst_dev_ >= 0 && path_ != Path::kHostStaged) {
    int can = src_dev_ == dst_dev_ ? 1 : 0;
    if (!can) TOKENFAB_TRY_CUDA(cudaDeviceCanAccessPeer(&can, dst_dev_, src_dev_));
    if (!can && path_ == Path::kPeer)
      return "cuda:" + std::to_string(dst_dev_) + " has no peer access to cuda:" +
             std::to_string(src_dev_) + " (use the host_staged connector)";
    if (can && src_dev_ != dst_dev_) {
      TOKENFAB_TRY_CUDA(cudaSetDevice(dst_dev_));
      const cudaError_t err = cudaDeviceEnablePeerAccess(src_dev_, 0);
      if (err == cudaErrorPeerAccessAlreadyEnabled) {
        cudaGetLastError();  // not an error here: an earlier transfer enabled it
      } else if (err != cudaSuccess) {
        return std::string("enabling peer access failed: ") + cudaGetErrorString(err);
      }
    }
    peer_ = can != 0;
  }
  destroy_events();
  used_ = {false, false};
  if (src_dev_ >= 0) {
    GpuSide* s = nullptr;
    if (std::string e = side(src_dev_, s); !e.empty()) return e;
    if (std::string e = upload_ids(src_dev_, *s, s->src_ids, spec.src_blocks); !e.empty()) return e;
    for (int p = 0; p < 2; ++p) {
      if (std::string e = s->src_buf[p].reserve(src_dev_, layer_bytes_); !e.empty()) return e;
      TOKENFAB_TRY_CUDA(cudaSetDevice(src_dev_));
      TOKENFAB_TRY_CUDA(cudaEventCreateWithFlags(&copied_[p], cudaEventDisableTiming));
    }
  }
  if (dst_dev_ >= 0) {
    GpuSide* s = nullptr;
    if (std::string e = side(dst_dev_, s); !e.empty()) return e;
    if (std::string e = upload_ids(dst_dev_, *s, s->dst_ids, spec.dst_blocks); !e.empty()) return e;
    for (int p = 0; p < 2; ++p) {
      // One GPU: the destination unpacks straight from the source's buffer.
      if (!(peer_ && src_dev_ == dst_dev_))
        if (std::string e = s->dst_buf[p].reserve(dst_dev_, layer_bytes_); !e.empty()) return e;
      TOKENFAB_TRY_CUDA(cudaSetDevice(dst_dev_));
      TOKENFAB_TRY_CUDA(cudaEventCreateWithFlags(&unpacked_[p], cudaEventDisableTiming));
    }
  }
  if (!peer_)
    if (std::string e = pinned(layer_bytes_); !e.empty()) return e;
  return {};
}

std::string CudaConnector::copy_layer(const KvTransferSpec& spec, int32_t layer) {
  const int p = layer % 2;
  const int64_t n = static_cast<int64_t>(spec.src_blocks.size());
  const size_t block_bytes = spec.src->block_bytes();
  const int64_t block_halves = static_cast<int64_t>(block_bytes / sizeof(uint16_t));
  auto halves = [](std::byte* b) { return reinterpret_cast<uint16_t*>(b); };
  GpuSide* src = src_dev_ >= 0 ? &gpus_[src_dev_] : nullptr;
  GpuSide* dst = dst_dev_ >= 0 ? &gpus_[dst_dev_] : nullptr;
  void* dst_buf = dst != nullptr ? dst->dst_buf[p].data : nullptr;
  try {
    // 1. The layer, packed: on the source GPU, or gathered into pinned memory from a host pool.
    if (src != nullptr) {
      TOKENFAB_TRY_CUDA(cudaSetDevice(src_dev_));
      // The buffers of this parity are free once the layer two back has been unpacked.
      if (used_[p]) TOKENFAB_TRY_CUDA(cudaStreamWaitEvent(src->stream, unpacked_[p], 0));
      kernels::launch_kv_pack_blocks(halves(spec.src->k_block(layer, 0)),
                                     halves(spec.src->v_block(layer, 0)),
                                     static_cast<const int32_t*>(src->src_ids.data), n,
                                     block_halves, static_cast<uint16_t*>(src->src_buf[p].data),
                                     src->stream);
    } else {
      if (used_[p]) TOKENFAB_TRY_CUDA(cudaEventSynchronize(unpacked_[p]));
      auto* out = static_cast<std::byte*>(host_[p]);
      for (int64_t i = 0; i < n; ++i) {
        const int32_t b = spec.src_blocks[static_cast<size_t>(i)];
        std::memcpy(out + (2 * i) * block_bytes, spec.src->k_block(layer, b), block_bytes);
        std::memcpy(out + (2 * i + 1) * block_bytes, spec.src->v_block(layer, b), block_bytes);
      }
    }
    // 2. Across.
    if (peer_) {
      if (src_dev_ == dst_dev_) {
        dst_buf = src->src_buf[p].data;
      } else {
        TOKENFAB_TRY_CUDA(cudaMemcpyPeerAsync(dst_buf, dst_dev_, src->src_buf[p].data, src_dev_,
                                              layer_bytes_, src->stream));
      }
      TOKENFAB_TRY_CUDA(cudaEventRecord(copied_[p], src->stream));
    } else if (src != nullptr) {
      TOKENFAB_TRY_CUDA(cudaMemcpyAsync(host_[p], src->src_buf[p].data, layer_bytes_,
                                        cudaMemcpyDeviceToHost, src->stream));
      TOKENFAB_TRY_CUDA(cudaEventRecord(copied_[p], src->stream));
    }
    // 3. Unpacked into the destination's blocks: on its GPU, or scattered from pinned memory.
    if (dst != nullptr) {
      TOKENFAB_TRY_CUDA(cudaSetDevice(dst_dev_));
      if (src != nullptr) TOKENFAB_TRY_CUDA(cudaStreamWaitEvent(dst->stream, copied_[p], 0));
      if (!peer_)
        TOKENFAB_TRY_CUDA(cudaMemcpyAsync(dst_buf, host_[p], layer_bytes_, cudaMemcpyHostToDevice,
                                          dst->stream));
      kernels::launch_kv_unpack_blocks(static_cast<const uint16_t*>(dst_buf),
                                       static_cast<const int32_t*>(dst->dst_ids.data), n, block_halves,
                                       halves(spec.dst->k_block(layer, 0)),
                                       halves(spec.dst->v_block(layer, 0)), dst->stream);
      TOKENFAB_TRY_CUDA(cudaEventRecord(unpacked_[p], dst->stream));
      used_[p] = true;
    } else {
      TOKENFAB_TRY_CUDA(cudaEventSynchronize(copied_[p]));
      const auto* in = static_cast<const std::byte*>(host_[p]);
      for (int64_t i = 0; i < n; ++i) {
        const int32_t b = spec.dst_blocks[static_cast<size_t>(i)];
        std::memcpy(spec.dst->k_block(layer, b), in + (2 * i) * block_bytes, block_bytes);
        std::memcpy(spec.dst->v_block(layer, b), in + (2 * i + 1) * block_bytes, block_bytes);
      }
    }
  } catch (const std::exception& e) {  // a launcher's error
    return e.what();
  }
  return {};
}

std::string CudaConnector::end_transfer(const KvTransferSpec&) {
  for (const int device : {src_dev_, dst_dev_}) {
    const auto it = gpus_.find(device);
    if (it == gpus_.end() || it->second.stream == nullptr) continue;
    TOKENFAB_TRY_CUDA(cudaSetDevice(device));
    TOKENFAB_TRY_CUDA(cudaStreamSynchronize(it->second.stream));
  }
  return {};
}

}  // namespace

std::unique_ptr<KvConnector> make_cuda_connector(std::string_view backend) {
  if (backend == "cuda_p2p") return std::make_unique<CudaConnector>(Path::kPeer);
  if (backend == "host_staged") return std::make_unique<CudaConnector>(Path::kHostStaged);
  if (backend == "cuda") return std::make_unique<CudaConnector>(Path::kAuto);
  throw Error("unknown CUDA KV connector \"" + std::string(backend) + "\"");
}

#endif

}  // namespace tokenfab
