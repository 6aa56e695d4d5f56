#pragma once
// Host-side CUDA error checking: a failed runtime call becomes a std::runtime_error naming the
// call, file:line and CUDA's own description. Never use it inside device code.

#include <cuda_runtime.h>

#include <stdexcept>
#include <string>

namespace tokenfab::kernels {

inline void check_cuda(cudaError_t err, const char* expr, const char* file, int line) {
  if (err == cudaSuccess) return;
  throw std::runtime_error(std::string(file) + ":" + std::to_string(line) + ": " + expr +
                           " failed: " + cudaGetErrorName(err) + ": " + cudaGetErrorString(err));
}

}  // namespace tokenfab::kernels

#define TOKENFAB_CUDA_CHECK(expr) ::tokenfab::kernels::check_cuda((expr), #expr, __FILE__, __LINE__)
