#pragma once
// The stream of one partition of a GPU that serves as both the prefill and the decode device
// (DevicePartition). Where the driver allows it, each partition's stream belongs to a green
// context holding its own SMs: decode the first `decode_sms` (rounded up to the driver's
// granularity), prefill the rest, so a long prefill cannot occupy the SMs a decode step needs.
// Otherwise, or when no split is asked for, it is a plain stream in the primary context and the
// partitions differ only by stream priority. Either way it is one cudaStream_t that everything of
// the device (cudaMalloc'd memory, runtime launches, cuBLASLt, graph capture) uses as before.
//
// Plain C++: builds without CUDA (make_partition_stream then throws). CUstream_st* is the type of
// cudaStream_t and of CUstream.

#include <string>

#include "core/device/device.h"

struct CUstream_st;
struct CUgreenCtx_st;

namespace tokenfab {

// How a GPU of `total_sms` SMs divides between the decode and the prefill partition when decode
// asks for `decode_sms`: decode gets the least multiple of `alignment` that is at least
// max(decode_sms, min_partition); prefill gets the rest, which must reach min_partition too.
// min_partition and alignment are the driver's CUdevSmResource minSmPartitionSize and
// smCoscheduledAlignment (values below 1 count as 1). Pure arithmetic.
struct SmSplit {
  int decode = 0;       // SMs of the decode partition; 0: no split
  int prefill = 0;      // SMs of the prefill partition; 0: no split
  std::string why_not;  // why there is no split; empty when there is one
  bool split() const { return decode > 0; }
};
SmSplit plan_sm_split(int total_sms, int decode_sms, int min_partition, int alignment);

struct PartitionStreamRequest {
  int device = 0;  // CUDA runtime ordinal
  DevicePartition partition = DevicePartition::kWhole;
  // SMs the decode partition gets (0: no split, priority streams only); prefill gets the rest.
  // Both partitions of a GPU must pass the same value.
  int decode_sms = 0;
  std::string name;  // "cuda:0/decode", for errors
};

// A partition's stream, and its green context if it has one; destroys both. The stream's work
// must be finished (cudaStreamSynchronize) before destruction. Move-only.
class PartitionStream {
 public:
  PartitionStream() = default;
  ~PartitionStream();
  PartitionStream(PartitionStream&& o) noexcept;
  PartitionStream& operator=(PartitionStream&& o) noexcept;
  PartitionStream(const PartitionStream&) = delete;
  PartitionStream& operator=(const PartitionStream&) = delete;

  CUstream_st* stream() const { return stream_; }  // a cudaStream_t; nullptr when empty
  bool green() const { return green_ != nullptr; }
  // SMs this partition's kernels may use: its group with a green context, else the whole GPU's.
  int sms() const { return sms_; }
  // One line for the log: the partition's SMs and stream priority, or why there is no split.
  const std::string& note() const { return note_; }

 private:
  friend PartitionStream make_partition_stream(const PartitionStreamRequest& request, int priority);
  void release() noexcept;

  CUstream_st* stream_ = nullptr;
  CUgreenCtx_st* green_ = nullptr;  // owns stream_ when set
  int sms_ = 0;
  std::string note_;
};

// The stream for `request` at `priority` (cudaDeviceGetStreamPriorityRange's scale; lower is
// more urgent), with a green context when request.partition is kPrefill or kDecode, decode_sms
// splits the GPU (plan_sm_split) and the driver supports green contexts (CUDA 12.5 or later).
// Any failure on the green-context path falls back to a plain stream and says why in note().
// Leaves request.device current. Throws Error only when even a plain stream cannot be created,
// or in a build without CUDA.
PartitionStream make_partition_stream(const PartitionStreamRequest& request, int priority);

}  // namespace tokenfab
