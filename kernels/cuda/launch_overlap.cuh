#pragma once
// Overlapping launches (programmatic dependent launch, sm_90): a kernel launched with
// `overlap` may start while the kernel before it in the stream is still running, once every block
// of that kernel has called overlap_release() (or exited). It runs what depends on nothing earlier
// kernels write — index arithmetic, weight loads, reads of the step's uploaded tables — then
// overlap_wait(), which returns when the kernel before it has finished and its writes are
// visible, and only then reads activations or writes anything.
//
// Rules for a kernel launched this way:
//   - every block calls overlap_wait() before it reads data an earlier kernel of the stream writes
//     and before its first global write (also before an early return: the wait chain is what
//     makes "the previous kernel finished" mean "all earlier kernels finished");
//   - before the wait it reads only data no kernel of the stream writes: weights, norms, and the
//     per-step arrays copied in before the step's first kernel.
// A kernel launched without `overlap` waits for the previous one as usual; overlap_wait() then
// returns at once. Compiled for architectures before sm_90 both calls are nothing, and the host
// never asks then: it sets `overlap` only where overlap_launches_supported (overlap_support.cuh).

#include <cuda_runtime.h>

#include <utility>

#include "kernels/cuda/cuda_check.cuh"

namespace tokenfab::kernels {

// Returns when the kernel this one overlaps has finished and its memory is visible.
__device__ __forceinline__ void overlap_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

// Lets the next kernel of the stream, if it was launched with `overlap`, start its blocks.
__device__ __forceinline__ void overlap_release() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// kernel<<<grid, block, shared_bytes, stream>>>(args…), allowed to overlap the previous kernel
// when `overlap` (set it only on devices of compute capability 9.0 or later). Throws
// std::runtime_error when the launch fails.
template <typename... Params, typename... Args>
void launch_kernel_shared(void (*kernel)(Params...), dim3 grid, dim3 block, size_t shared_bytes,
                          cudaStream_t stream, bool overlap, Args&&... args) {
  cudaLaunchAttribute attribute{};
  attribute.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute.val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t config{};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = shared_bytes;
  config.stream = stream;
  config.attrs = overlap ? &attribute : nullptr;
  config.numAttrs = overlap ? 1 : 0;
  TOKENFAB_CUDA_CHECK(cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...));
}

// launch_kernel_shared without dynamic shared memory.
template <typename... Params, typename... Args>
void launch_kernel(void (*kernel)(Params...), dim3 grid, dim3 block, cudaStream_t stream,
                   bool overlap, Args&&... args) {
  launch_kernel_shared(kernel, grid, block, 0, stream, overlap, std::forward<Args>(args)...);
}

}  // namespace tokenfab::kernels
