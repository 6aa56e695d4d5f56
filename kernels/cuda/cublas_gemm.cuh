#pragma once
// Matrix products through cuBLASLt: C (f32) = A (bf16) · Bᵀ (bf16), FP32 accumulate — the
// layout of a linear layer (activations A (m, k) times weights B (n, k), both row-major).

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <tuple>

namespace tokenfab::kernels {

// cuBLAS status → std::runtime_error naming the call, file:line and cuBLAS's description.
void check_cublas(cublasStatus_t status, const char* expr, const char* file, int line);

class CublasGemm {
 public:
  // On the current device: a cuBLASLt handle and a workspace of `workspace_bytes` (cudaMalloc).
  // sm_count_target > 0: the products run on that many SMs (a green-context partition of the
  // GPU), so cuBLASLt chooses and sizes its kernels for them (CUBLASLT_MATMUL_DESC_SM_COUNT_TARGET;
  // ignored where this cuBLASLt lacks the attribute); 0: the whole GPU.
  // Throws std::runtime_error when the handle or the workspace cannot be had.
  explicit CublasGemm(size_t workspace_bytes = size_t{32} << 20, int sm_count_target = 0);
  ~CublasGemm();
  CublasGemm(const CublasGemm&) = delete;
  CublasGemm& operator=(const CublasGemm&) = delete;

  // c (m, n) f32 = a (m, k) bf16 · b (n, k) bf16 ᵀ; all row-major, device memory, bf16 as raw
  // bits. k must be a multiple of 8 (16-byte rows, what cuBLASLt's tensor-core kernels need).
  // With `accumulate`, c += a · bᵀ instead (c is read; the f32 sum of the product and c is
  // rounded once: a residual add in the product's epilogue). The first call of a shape picks
  // cuBLASLt's heuristic algorithm and keeps it (the only allocation); later calls of that shape
  // only launch. Asynchronous on `stream`. Throws std::invalid_argument for a bad shape,
  // std::runtime_error when cuBLASLt fails or has no algorithm for the shape.
  void bf16_nt(const uint16_t* a, const uint16_t* b, float* c, int64_t m, int64_t n, int64_t k,
               cudaStream_t stream, bool accumulate = false);

 private:
  // One shape's descriptors and chosen algorithm.
  struct Plan {
    cublasLtMatmulDesc_t op = nullptr;
    cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
    cublasLtMatmulAlgo_t algo{};
  };
  const Plan& plan_for(int64_t m, int64_t n, int64_t k);

  cublasLtHandle_t handle_ = nullptr;
  void* workspace_ = nullptr;
  size_t workspace_bytes_ = 0;
  int32_t sm_count_target_ = 0;
  std::map<std::tuple<int64_t, int64_t, int64_t>, Plan> plans_;
};

}  // namespace tokenfab::kernels

#define TOKENFAB_CUBLAS_CHECK(expr) \
  ::tokenfab::kernels::check_cublas((expr), #expr, __FILE__, __LINE__)
