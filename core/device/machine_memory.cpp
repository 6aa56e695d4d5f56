#include "core/device/machine_memory.h"

#include <string>

#include "core/device/cuda_device.h"

namespace tokenfab {

std::vector<MemoryPlace> machine_memory() {
  std::vector<MemoryPlace> places = {host_memory()};
  for (const CudaDeviceInfo& d : enumerate_cuda_devices().devices)
    places.push_back({"cuda:" + std::to_string(d.index), d.total_bytes, d.free_bytes, false});
  return places;
}

}  // namespace tokenfab
