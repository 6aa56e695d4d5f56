// cuBLASLt is opened on first use, not linked (kernels/cuda/cublaslt_loader.h): a process that
// never multiplies on a GPU never maps the library, and the first use resolves every entry point.
// Needs the CUDA toolkit's libraries (it is built only with TOKENFAB_CUDA) but no GPU, so it is
// labelled unit and runs in CI.

#include <QtTest>
#include <fstream>
#include <string>

#include "kernels/cuda/cublaslt_loader.h"

using namespace tokenfab::kernels;

namespace {

bool mapped(const std::string& name) {
  std::ifstream maps("/proc/self/maps");
  std::string line;
  while (std::getline(maps, line))
    if (line.find(name) != std::string::npos) return true;
  return false;
}

}  // namespace

class CublasLtLoaderTest : public QObject {
  Q_OBJECT
 private slots:
  void opened_on_first_use_only() {
    const std::string name = cublaslt_library_name();
    QVERIFY2(name.rfind("libcublasLt.so.", 0) == 0, name.c_str());
    QVERIFY2(!mapped("libcublasLt"), "cuBLASLt is mapped before anything asked for it");
    const CublasLt& lt = cublaslt();
    QVERIFY(mapped("libcublasLt"));
    for (const void* fn : {reinterpret_cast<const void*>(lt.create),
                           reinterpret_cast<const void*>(lt.destroy),
                           reinterpret_cast<const void*>(lt.status_name),
                           reinterpret_cast<const void*>(lt.status_string),
                           reinterpret_cast<const void*>(lt.matmul_desc_create),
                           reinterpret_cast<const void*>(lt.matmul_desc_destroy),
                           reinterpret_cast<const void*>(lt.matmul_desc_set_attribute),
                           reinterpret_cast<const void*>(lt.matrix_layout_create),
                           reinterpret_cast<const void*>(lt.matrix_layout_destroy),
                           reinterpret_cast<const void*>(lt.preference_create),
                           reinterpret_cast<const void*>(lt.preference_destroy),
                           reinterpret_cast<const void*>(lt.preference_set_attribute),
                           reinterpret_cast<const void*>(lt.algo_get_heuristic),
                           reinterpret_cast<const void*>(lt.matmul)})
      QVERIFY(fn != nullptr);
    // A call that needs no GPU goes through to the library.
    QCOMPARE(std::string(lt.status_name(CUBLAS_STATUS_SUCCESS)), std::string("CUBLAS_STATUS_SUCCESS"));
    QCOMPARE(&cublaslt(), &lt);  // opened once
  }
};

QTEST_APPLESS_MAIN(CublasLtLoaderTest)
#include "test_cublaslt_loader.moc"
