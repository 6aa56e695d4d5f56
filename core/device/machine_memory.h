#pragma once
// The memories of this machine a model can be placed in: the host's RAM and each GPU the CUDA
// runtime reports. What `tokenfab-cli models` and the GUI's Models page judge a model's fit against
// (core/model/model_memory.h). Enumerating GPUs starts the CUDA runtime: call it off the GUI
// thread.

#include <vector>

#include "core/model/model_memory.h"

namespace tokenfab {

// host_memory() first, then cuda:N for each GPU (none in a build without CUDA, or without a GPU).
std::vector<MemoryPlace> machine_memory();

}  // namespace tokenfab
