#include "core/device/cuda_device.h"

#include <string>
#include <utility>

#if TOKENFAB_HAVE_CUDA
#include <cuda_runtime.h>
#endif

namespace tokenfab {

#if TOKENFAB_HAVE_CUDA

namespace {

std::string cuda_error_text(const char* call, cudaError_t err) {
  return std::string(call) + " failed: " + cudaGetErrorName(err) + ": " + cudaGetErrorString(err);
}

// One device's description, or the first failing call's message (then `info` is incomplete).
std::string describe_device(int index, CudaDeviceInfo& info) {
  info.index = index;
  cudaDeviceProp prop{};
  if (cudaError_t err = cudaGetDeviceProperties(&prop, index); err != cudaSuccess)
    return cuda_error_text("cudaGetDeviceProperties", err);
  info.name = prop.name;
  info.total_bytes = prop.totalGlobalMem;
  info.sm_count = prop.multiProcessorCount;
  info.cc_major = prop.major;
  info.cc_minor = prop.minor;
  // CUDA 13 removed cudaDeviceProp::memoryClockRate; the device attribute still reports it (kHz).
  if (cudaError_t err =
          cudaDeviceGetAttribute(&info.memory_clock_khz, cudaDevAttrMemoryClockRate, index);
      err != cudaSuccess)
    return cuda_error_text("cudaDeviceGetAttribute(MemoryClockRate)", err);
  if (cudaError_t err =
          cudaDeviceGetAttribute(&info.bus_width_bits, cudaDevAttrGlobalMemoryBusWidth, index);
      err != cudaSuccess)
    return cuda_error_text("cudaDeviceGetAttribute(GlobalMemoryBusWidth)", err);
  info.bandwidth_gbs = 2.0 * info.memory_clock_khz * 1e3 * (info.bus_width_bits / 8.0) / 1e9;

  // Free memory needs a context on the device; it is created here once (the runtime's primary
  // context, which the backend will use anyway).
  if (cudaError_t err = cudaSetDevice(index); err != cudaSuccess)
    return cuda_error_text("cudaSetDevice", err);
  size_t free_bytes = 0, total_bytes = 0;
  if (cudaError_t err = cudaMemGetInfo(&free_bytes, &total_bytes); err != cudaSuccess)
    return cuda_error_text("cudaMemGetInfo", err);
  info.free_bytes = free_bytes;
  return {};
}

}  // namespace

CudaInventory enumerate_cuda_devices() {
  CudaInventory inv;
  inv.built = true;
  cudaRuntimeGetVersion(&inv.runtime_version);
  if (cudaError_t err = cudaDriverGetVersion(&inv.driver_version); err != cudaSuccess) {
    inv.reason = cuda_error_text("cudaDriverGetVersion", err);
    return inv;
  }
  if (inv.driver_version == 0) {
    inv.reason = "no NVIDIA driver is installed";
    return inv;
  }
  int count = 0;
  if (cudaError_t err = cudaGetDeviceCount(&count); err != cudaSuccess) {
    inv.reason = cuda_error_text("cudaGetDeviceCount", err);
    return inv;
  }
  if (count == 0) {
    inv.reason = "the driver reports no CUDA device";
    return inv;
  }
  int current = 0;
  cudaGetDevice(&current);
  for (int i = 0; i < count; ++i) {
    CudaDeviceInfo info;
    if (std::string err = describe_device(i, info); !err.empty()) {
      inv.reason += (inv.reason.empty() ? "" : "; ") + ("cuda:" + std::to_string(i) + ": " + err);
      continue;
    }
    inv.devices.push_back(std::move(info));
  }
  cudaSetDevice(current);  // enumeration leaves the caller's device as it was

  const size_t n = inv.devices.size();
  inv.peer_access.assign(n, std::vector<bool>(n, false));
  for (size_t a = 0; a < n; ++a) {
    for (size_t b = 0; b < n; ++b) {
      if (a == b) continue;
      int can = 0;
      if (cudaError_t err =
              cudaDeviceCanAccessPeer(&can, inv.devices[a].index, inv.devices[b].index);
          err != cudaSuccess) {
        inv.reason +=
            (inv.reason.empty() ? "" : "; ") + cuda_error_text("cudaDeviceCanAccessPeer", err);
        continue;
      }
      inv.peer_access[a][b] = can != 0;
    }
  }
  return inv;
}

#else

CudaInventory enumerate_cuda_devices() {
  CudaInventory inv;
  inv.reason = "this build has no CUDA support (configured with TOKENFAB_CUDA=OFF)";
  return inv;
}

#endif

}  // namespace tokenfab
