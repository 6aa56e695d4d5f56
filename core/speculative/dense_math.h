#pragma once
// Small f32 dense kernels for draft heads and their training: two GEMM shapes, a vectorised exp
// and a transpose. Single-threaded: callers split rows across their threads. Built for the
// baseline ISA with an AVX2+FMA clone chosen at load time (GCC target_clones), so one binary runs
// anywhere. All matrices are row-major with explicit leading dimensions (in elements).

#include <cstdint>

namespace tokenfab::dense {

// C (m, n) = A (m, k) · B (k, n), or C += … when `accumulate`.
void gemm_nn(int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, const float* b,
             int64_t ldb, float* c, int64_t ldc, bool accumulate);

// C (m, n) = A (m, k) · B (n, k)ᵀ, or C += … when `accumulate`. Rows of A against rows of B:
// a linear layer (B = weight, out × in) or logits over an embedding matrix (B = vocab × n_embd).
void gemm_nt(int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, const float* b,
             int64_t ldb, float* c, int64_t ldc, bool accumulate);

// T (cols, rows) = A (rows, cols)ᵀ.
void transpose(const float* a, int64_t rows, int64_t cols, int64_t lda, float* t, int64_t ldt);

float max_value(const float* x, int64_t n);  // -inf when n == 0
// x[i] ← exp(x[i] − shift) in place (relative error < 2e-7 for arguments ≥ −87; below that the
// result is flushed to e^−87); returns Σ x[i] in double.
double exp_shifted_sum(float* x, int64_t n, float shift);
// log Σ exp(x[i]), computed as max + log(exp_shifted_sum(x, n, max)); x is overwritten likewise.
double log_sum_exp(float* x, int64_t n);

}  // namespace tokenfab::dense
