#pragma once
// What the CPU can do, read once at start-up; kernels pick their variant from it.

namespace tokenfab::kernels {

struct CpuFeatures {
  bool avx2 = false;  // with FMA and F16C
  bool avx512 = false;  // F, BW, VL
  bool avx512_vnni = false;
};

const CpuFeatures& cpu_features();
// Honours TOKENFAB_FORCE_SCALAR=1 (every dispatch falls back to the scalar reference).
bool use_avx2();

}  // namespace tokenfab::kernels
