#pragma once
// The machine's NVIDIA GPUs as the CUDA runtime reports them: what `tokenfab-cli devices` shows
// and what a CUDA device's memory budget and roofline will start from. Works in every build: one
// without CUDA, or a machine without a driver or a GPU, gets an empty list and the reason.

#include <cstdint>
#include <string>
#include <vector>

namespace tokenfab {

struct CudaDeviceInfo {
  int index = 0;  // cuda:<index>
  std::string name;
  uint64_t total_bytes = 0;
  uint64_t free_bytes = 0;  // at enumeration time
  int sm_count = 0;
  int cc_major = 0;  // compute capability, e.g. 9.0 for Hopper
  int cc_minor = 0;
  int memory_clock_khz = 0;  // peak memory clock (cudaDevAttrMemoryClockRate)
  int bus_width_bits = 0;    // global memory bus width (cudaDevAttrGlobalMemoryBusWidth)
  // Peak memory bandwidth, GB/s (1e9 bytes/s): clock × 2 (double data rate) × bus width / 8.
  double bandwidth_gbs = 0.0;
};

struct CudaInventory {
  bool built = false;       // this binary was built with CUDA support
  std::string reason;       // why `devices` is empty; empty when GPUs were found
  int driver_version = 0;   // e.g. 13000 for CUDA 13.0; 0 when there is no driver
  int runtime_version = 0;  // the CUDA runtime this binary was linked with
  std::vector<CudaDeviceInfo> devices;
  // peer_access[i][j]: device i can read and write device j's memory directly
  // (cudaDeviceCanAccessPeer); false on the diagonal. (n_devices, n_devices).
  std::vector<std::vector<bool>> peer_access;
};

// Enumerates the GPUs. Never throws for a missing driver or device (that is `reason`); a device
// whose properties cannot be read is left out and named in `reason`.
CudaInventory enumerate_cuda_devices();

}  // namespace tokenfab
