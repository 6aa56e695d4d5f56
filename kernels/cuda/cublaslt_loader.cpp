#include "kernels/cuda/cublaslt_loader.h"

#include <dlfcn.h>

#include <stdexcept>
#include <string>

namespace tokenfab::kernels {

namespace {

#define TOKENFAB_STRINGIFY2(x) #x
#define TOKENFAB_STRINGIFY(x) TOKENFAB_STRINGIFY2(x)
constexpr const char* kLibrary = "libcublasLt.so." TOKENFAB_STRINGIFY(CUBLAS_VER_MAJOR);

template <typename Fn>
void resolve(void* library, const char* symbol, Fn& fn) {
  dlerror();
  void* p = dlsym(library, symbol);
  if (p == nullptr) {
    const char* why = dlerror();
    throw std::runtime_error(std::string(kLibrary) + " has no " + symbol + ": " +
                             (why != nullptr ? why : "not found"));
  }
  fn = reinterpret_cast<Fn>(p);
}

CublasLt load() {
  void* library = dlopen(kLibrary, RTLD_NOW | RTLD_LOCAL);
#ifdef TOKENFAB_CUDA_LIBRARY_DIR
  // Not on the loader's search path: the toolkit Tokenfab was built with.
  if (library == nullptr)
    library = dlopen((std::string(TOKENFAB_CUDA_LIBRARY_DIR) + "/" + kLibrary).c_str(),
                     RTLD_NOW | RTLD_LOCAL);
#endif
  if (library == nullptr) {
    const char* why = dlerror();
    throw std::runtime_error(std::string("cannot load ") + kLibrary +
                             " (cuBLAS of the CUDA toolkit, needed for matrix products on a "
                             "GPU): " + (why != nullptr ? why : "not found") +
                             "; put its folder on LD_LIBRARY_PATH");
  }
  // Kept open for the life of the process: the handles made through it live as long.
  CublasLt lt{};
  resolve(library, "cublasLtCreate", lt.create);
  resolve(library, "cublasLtDestroy", lt.destroy);
  resolve(library, "cublasLtGetStatusName", lt.status_name);
  resolve(library, "cublasLtGetStatusString", lt.status_string);
  resolve(library, "cublasLtMatmulDescCreate", lt.matmul_desc_create);
  resolve(library, "cublasLtMatmulDescDestroy", lt.matmul_desc_destroy);
  resolve(library, "cublasLtMatmulDescSetAttribute", lt.matmul_desc_set_attribute);
  resolve(library, "cublasLtMatrixLayoutCreate", lt.matrix_layout_create);
  resolve(library, "cublasLtMatrixLayoutDestroy", lt.matrix_layout_destroy);
  resolve(library, "cublasLtMatmulPreferenceCreate", lt.preference_create);
  resolve(library, "cublasLtMatmulPreferenceDestroy", lt.preference_destroy);
  resolve(library, "cublasLtMatmulPreferenceSetAttribute", lt.preference_set_attribute);
  resolve(library, "cublasLtMatmulAlgoGetHeuristic", lt.algo_get_heuristic);
  resolve(library, "cublasLtMatmul", lt.matmul);
  return lt;
}

}  // namespace

const char* cublaslt_library_name() { return kLibrary; }

const CublasLt& cublaslt() {
  static const CublasLt lt = load();  // a failed load throws and is tried again next time
  return lt;
}

}  // namespace tokenfab::kernels
