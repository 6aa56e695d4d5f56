#pragma once
// cuBLASLt, opened when the first GPU matrix product is set up instead of linked into every
// binary: loading the library costs a process about 200 MB of private memory (its load-time
// relocations) and a tenth of a second, which a run on the CPU alone — the CLI, the app, every
// test — never needs. One function pointer per entry point Tokenfab calls.

#include <cublasLt.h>

namespace tokenfab::kernels {

struct CublasLt {
  decltype(&::cublasLtCreate) create;
  decltype(&::cublasLtDestroy) destroy;
  decltype(&::cublasLtGetStatusName) status_name;
  decltype(&::cublasLtGetStatusString) status_string;
  decltype(&::cublasLtMatmulDescCreate) matmul_desc_create;
  decltype(&::cublasLtMatmulDescDestroy) matmul_desc_destroy;
  decltype(&::cublasLtMatmulDescSetAttribute) matmul_desc_set_attribute;
  decltype(&::cublasLtMatrixLayoutCreate) matrix_layout_create;
  decltype(&::cublasLtMatrixLayoutDestroy) matrix_layout_destroy;
  decltype(&::cublasLtMatmulPreferenceCreate) preference_create;
  decltype(&::cublasLtMatmulPreferenceDestroy) preference_destroy;
  decltype(&::cublasLtMatmulPreferenceSetAttribute) preference_set_attribute;
  decltype(&::cublasLtMatmulAlgoGetHeuristic) algo_get_heuristic;
  decltype(&::cublasLtMatmul) matmul;
};

// "libcublasLt.so.N", N the major version of the toolkit Tokenfab was built with.
const char* cublaslt_library_name();

// Opens the library on first use (through the dynamic loader's search path, LD_LIBRARY_PATH
// included, then in the library folder of the toolkit Tokenfab was built with) and resolves
// every entry point; later calls return the same table. Throws
// std::runtime_error naming the library, or the missing entry point, and the loader's reason.
// Safe from several threads.
const CublasLt& cublaslt();

}  // namespace tokenfab::kernels
