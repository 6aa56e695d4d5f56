#include "kernels/cpu/cpu_features.h"

#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>

namespace tokenfab::kernels {

namespace {

CpuFeatures detect() {
  CpuFeatures f;
  __builtin_cpu_init();
  f.avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  f.avx512 = f.avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
             __builtin_cpu_supports("avx512vl");
  f.avx512_vnni = f.avx512 && __builtin_cpu_supports("avx512vnni");
  return f;
}

CpuFeatures capped(CpuFeatures f) {
  const char* force = std::getenv("TOKENFAB_FORCE_SCALAR");
  if (force != nullptr && std::strcmp(force, "1") == 0) return CpuFeatures{};
  const char* level = std::getenv("TOKENFAB_CPU_KERNELS");
  if (level == nullptr || *level == '\0' || std::strcmp(level, "avx512") == 0) return f;
  if (std::strcmp(level, "avx2") == 0) {
    f.avx512 = f.avx512_vnni = false;
    return f;
  }
  if (std::strcmp(level, "scalar") == 0) return CpuFeatures{};
  throw std::invalid_argument(std::string("TOKENFAB_CPU_KERNELS=") + level +
                              ": expected scalar, avx2 or avx512");
}

}  // namespace

const CpuFeatures& detected_cpu_features() {
  static const CpuFeatures features = detect();
  return features;
}

const CpuFeatures& cpu_features() {
  static const CpuFeatures features = capped(detected_cpu_features());
  return features;
}

bool use_avx2() {
  return cpu_features().avx2;
}
bool use_avx512_vnni() {
  return cpu_features().avx512_vnni;
}

const char* kernel_isa_name() {
  return use_avx512_vnni() ? "avx512-vnni" : use_avx2() ? "avx2" : "scalar";
}

}  // namespace tokenfab::kernels
