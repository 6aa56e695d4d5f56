#pragma once
// Whether launch_kernel's `overlap` (launch_overlap.cuh) may be set for the kernels of this build
// on a device: overlapping launches need a GPU of compute capability 9.0 or later AND kernels
// compiled for sm_90 or later. A build for an older architecture (CMAKE_CUDA_ARCHITECTURES=80, say)
// still runs on such a GPU from its PTX, but there overlap_wait() compiled to nothing: a kernel
// allowed to start early would read its inputs before the kernel writing them had finished.

namespace tokenfab::kernels {

// For the device `device`; makes it the current device. Throws std::runtime_error when the
// runtime cannot answer.
bool overlap_launches_supported(int device);

}  // namespace tokenfab::kernels
