#pragma once
// How far the GPU tests (tests/gpu/test_cuda_model.cpp) let a GPU's results on the real model be
// from the exact forward pass (tests/model/reference_forward.h: the file's weights, double
// precision), and the prompts they check. The bounds are justified by a test that runs on every
// machine, tests/model/test_gpu_rounding.cpp: with the CUDA backend's roundings emulated in the
// reference pass (BF16 weights, BF16 or f32 matmul inputs, fp16 K/V) the logits on these prompts
// stay within them, with the margins that test prints.

namespace tokenfab::test {

// A GPU logit row may be this far from the exact row (relative L2 distance).
constexpr double kExactRel = 0.15;
// A GPU greedy token's exact logit may fall short of the exact best by this much (a near-tie the
// rounding can flip; any larger gap is an error).
constexpr double kTieLogits = 0.4;
// Greedy tokens generated per prompt.
constexpr int kRealSteps = 24;

// The prompts of the real-model GPU tests (raw text, BOS per the model).
inline constexpr const char* kRealPrompts[] = {
    "The capital of France is",
    "def fibonacci(n):\n    if n < 2:\n        return n\n    return",
    "Once upon a time, in a small village by the sea, there lived",
    "Water boils at one hundred degrees Celsius at sea level because",
    "A list of three primary colours:",
    "The committee met on Tuesday to review the budget for the coming year, the plans for the "
    "new library on the hill, and the long list of letters that residents had sent about",
};

}  // namespace tokenfab::test
