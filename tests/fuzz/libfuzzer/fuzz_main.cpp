// libFuzzer entry of one target (TOKENFAB_FUZZ_TARGET names it; tests/fuzz/fuzz_targets.h).
#include <cstddef>
#include <cstdint>

#include "core/common/log.h"
#include "tests/fuzz/fuzz_targets.h"

// The loaders' warnings about odd inputs would be most of the output (and of the time).
extern "C" int LLVMFuzzerInitialize(int*, char***) {
  tokenfab::set_log_level("off");
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const tokenfab::fuzz::Target target = tokenfab::fuzz::target_named(TOKENFAB_FUZZ_TARGET);
  target({data, size});
  return 0;
}
