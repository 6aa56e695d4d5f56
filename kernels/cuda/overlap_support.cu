#include "kernels/cuda/overlap_support.cuh"

#include <cuda_runtime.h>

#include "kernels/cuda/cuda_check.cuh"
#include "kernels/cuda/launch_overlap.cuh"

namespace tokenfab::kernels {

namespace {

// Never launched: compiled with the same architectures as every other kernel of the library, its
// attributes say which virtual architecture the device runs them from.
__global__ void overlap_probe(int* out) {
  overlap_wait();
  if (out != nullptr) *out = 0;
}

}  // namespace

bool overlap_launches_supported(int device) {
  TOKENFAB_CUDA_CHECK(cudaSetDevice(device));
  int major = 0;
  TOKENFAB_CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
  if (major < 9) return false;
  cudaFuncAttributes attributes{};
  TOKENFAB_CUDA_CHECK(cudaFuncGetAttributes(&attributes, overlap_probe));
  return attributes.ptxVersion >= 90;  // major · 10 + minor of the PTX it was compiled from
}

}  // namespace tokenfab::kernels
