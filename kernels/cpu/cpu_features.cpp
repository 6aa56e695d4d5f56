#include "kernels/cpu/cpu_features.h"

#include <cstdlib>
#include <cstring>

namespace tokenfab::kernels {

static CpuFeatures detect() {
  CpuFeatures f;
  __builtin_cpu_init();
  f.avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  f.avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
             __builtin_cpu_supports("avx512vl");
  f.avx512_vnni = f.avx512 && __builtin_cpu_supports("avx512vnni");
  const char* force = std::getenv("TOKENFAB_FORCE_SCALAR");
  if (force != nullptr && std::strcmp(force, "1") == 0) f = CpuFeatures{};
  return f;
}

const CpuFeatures& cpu_features() {
  static const CpuFeatures features = detect();
  return features;
}

bool use_avx2() { return cpu_features().avx2; }

}  // namespace tokenfab::kernels
