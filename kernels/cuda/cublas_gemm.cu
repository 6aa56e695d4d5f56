#include "kernels/cuda/cublas_gemm.cuh"

#include <stdexcept>
#include <string>

#include "kernels/cuda/cublaslt_loader.h"
#include "kernels/cuda/cuda_check.cuh"

namespace tokenfab::kernels {

void check_cublas(cublasStatus_t status, const char* expr, const char* file, int line) {
  if (status == CUBLAS_STATUS_SUCCESS) return;
  throw std::runtime_error(std::string(file) + ":" + std::to_string(line) + ": " + expr +
                           " failed: " + cublaslt().status_name(status) + ": " +
                           cublaslt().status_string(status));
}

CublasGemm::CublasGemm(size_t workspace_bytes, int sm_count_target)
    : workspace_bytes_(workspace_bytes), sm_count_target_(sm_count_target) {
  TOKENFAB_CUBLAS_CHECK(cublaslt().create(&handle_));
  if (workspace_bytes_ > 0) {
    const cudaError_t err = cudaMalloc(&workspace_, workspace_bytes_);
    if (err != cudaSuccess) {
      cublaslt().destroy(handle_);
      check_cuda(err, "cudaMalloc(cuBLASLt workspace)", __FILE__, __LINE__);
    }
  }
}

CublasGemm::~CublasGemm() {
  // Destructors cannot throw: a failure here is ignored (the process is tearing down the device).
  for (auto& [shape, p] : plans_) {
    cublaslt().matrix_layout_destroy(p.c);
    cublaslt().matrix_layout_destroy(p.b);
    cublaslt().matrix_layout_destroy(p.a);
    cublaslt().matmul_desc_destroy(p.op);
  }
  cudaFree(workspace_);
  cublaslt().destroy(handle_);
}

// cuBLASLt is column-major. Row-major C (m, n) is column-major Cᵀ (n, m), and
// Cᵀ = B · Aᵀ: B row-major (n, k) is column-major (k, n) with ld k, taken transposed (op T);
// A row-major (m, k) is column-major (k, m) with ld k, taken as is. So cuBLASLt's "A" is our b,
// its "B" our a — the TN layout its tensor-core kernels prefer.
const CublasGemm::Plan& CublasGemm::plan_for(int64_t m, int64_t n, int64_t k) {
  const auto key = std::make_tuple(m, n, k);
  if (auto it = plans_.find(key); it != plans_.end()) return it->second;

  Plan p;
  TOKENFAB_CUBLAS_CHECK(cublaslt().matmul_desc_create(&p.op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t trans_a = CUBLAS_OP_T, trans_b = CUBLAS_OP_N;
  TOKENFAB_CUBLAS_CHECK(cublaslt().matmul_desc_set_attribute(p.op, CUBLASLT_MATMUL_DESC_TRANSA,
                                                             &trans_a, sizeof trans_a));
  TOKENFAB_CUBLAS_CHECK(cublaslt().matmul_desc_set_attribute(p.op, CUBLASLT_MATMUL_DESC_TRANSB,
                                                             &trans_b, sizeof trans_b));
  if (sm_count_target_ > 0)  // a hint: an older cuBLASLt without it plans for the whole GPU
    cublaslt().matmul_desc_set_attribute(p.op, CUBLASLT_MATMUL_DESC_SM_COUNT_TARGET,
                                         &sm_count_target_, sizeof sm_count_target_);
  TOKENFAB_CUBLAS_CHECK(cublaslt().matrix_layout_create(&p.a, CUDA_R_16BF, k, n, k));  // our b
  TOKENFAB_CUBLAS_CHECK(cublaslt().matrix_layout_create(&p.b, CUDA_R_16BF, k, m, k));  // our a
  TOKENFAB_CUBLAS_CHECK(cublaslt().matrix_layout_create(&p.c, CUDA_R_32F, n, m, n));

  cublasLtMatmulPreference_t pref = nullptr;
  TOKENFAB_CUBLAS_CHECK(cublaslt().preference_create(&pref));
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  cublasStatus_t status = cublaslt().preference_set_attribute(
      pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace_bytes_, sizeof workspace_bytes_);
  if (status == CUBLAS_STATUS_SUCCESS)
    status =
        cublaslt().algo_get_heuristic(handle_, p.op, p.a, p.b, p.c, p.c, pref, 1, &result, &found);
  cublaslt().preference_destroy(pref);
  if (status == CUBLAS_STATUS_SUCCESS && found == 0) status = CUBLAS_STATUS_NOT_SUPPORTED;
  if (status != CUBLAS_STATUS_SUCCESS) {
    cublaslt().matrix_layout_destroy(p.c);
    cublaslt().matrix_layout_destroy(p.b);
    cublaslt().matrix_layout_destroy(p.a);
    cublaslt().matmul_desc_destroy(p.op);
    check_cublas(
        status,
        ("cublasLtMatmulAlgoGetHeuristic for bf16 (" + std::to_string(m) + " x " +
         std::to_string(k) + ") · (" + std::to_string(n) + " x " + std::to_string(k) + ")ᵀ")
            .c_str(),
        __FILE__, __LINE__);
  }
  p.algo = result.algo;
  return plans_.emplace(key, p).first->second;
}

void CublasGemm::bf16_nt(const uint16_t* a, const uint16_t* b, float* c, int64_t m, int64_t n,
                         int64_t k, cudaStream_t stream, bool accumulate) {
  if (m < 0 || n < 0 || k <= 0 || k % 8 != 0)
    throw std::invalid_argument("CublasGemm::bf16_nt: shape (" + std::to_string(m) + ", " +
                                std::to_string(n) + ", " + std::to_string(k) +
                                "): k must be a positive multiple of 8");
  if (m == 0 || n == 0) return;
  const Plan& p = plan_for(m, n, k);
  const float alpha = 1.0f, beta = accumulate ? 1.0f : 0.0f;  // C and D are the same matrix
  TOKENFAB_CUBLAS_CHECK(cublaslt().matmul(handle_, p.op, &alpha, b, p.a, a, p.b, &beta, c, p.c, c,
                                          p.c, &p.algo, workspace_, workspace_bytes_, stream));
}

}  // namespace tokenfab::kernels
