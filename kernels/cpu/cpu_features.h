#pragma once
// What the CPU can do, read once at start-up; kernels pick their variant from it.

namespace tokenfab::kernels {

struct CpuFeatures {
  bool avx2 = false;         // with FMA and F16C
  bool avx512 = false;       // F, BW, VL
  bool avx512_vnni = false;  // with the above
};

// What the CPU has, whatever the kernels are allowed to use.
const CpuFeatures& detected_cpu_features();

// What the kernels may use: the detected features, capped by the environment —
// TOKENFAB_FORCE_SCALAR=1 (every dispatch falls back to the scalar reference) or
// TOKENFAB_CPU_KERNELS=scalar|avx2|avx512 (the widest kernels to use, e.g. to compare two
// variants on one machine). An unknown TOKENFAB_CPU_KERNELS value throws std::invalid_argument
// naming it (front ends call this once at start-up, where the message reaches the user).
const CpuFeatures& cpu_features();
bool use_avx2();
bool use_avx512_vnni();
// "avx512-vnni", "avx2" or "scalar": the widest variant the matmul kernels dispatch to.
const char* kernel_isa_name();

}  // namespace tokenfab::kernels
