#pragma once
// Element-wise and normalisation ops of the Llama forward pass, in f32. Each has a plain scalar
// reference (`*_scalar`); the dispatched entry point uses AVX2 where it pays.

#include <cstdint>

namespace tokenfab::kernels {

// y = x / sqrt(mean(x²) + eps) * w, over n elements.
void rms_norm(const float* x, const float* w, float* y, int64_t n, float eps);

// Rotation tables for one position: angle_i = pos · base^(-2i/rot_dim), i < rot_dim/2.
void rope_table(int64_t pos, int rot_dim, float base, float* cos_out, float* sin_out);
// The same with the scalings some families use: angle_i = pos · pos_scale · base^(-2i/rot_dim) /
// factors[i] (factors null: all 1), and cos, sin multiplied by attn_factor.
void rope_table_scaled(int64_t pos, int rot_dim, float base, float pos_scale, const float* factors,
                       float attn_factor, float* cos_out, float* sin_out);
// GGUF/llama convention: within each head, pairs (x[2i], x[2i+1]) for 2i < rot_dim are rotated.
// x: (n_heads, head_dim).
void rope(float* x, int n_heads, int head_dim, int rot_dim, const float* cos_t, const float* sin_t);
// The halves convention (GPT-NeoX; qwen, gemma, phi3): pairs (x[i], x[i + rot_dim/2]).
void rope_halves(float* x, int n_heads, int head_dim, int rot_dim, const float* cos_t,
                 const float* sin_t);

// gate = gelu(gate) * up, n elements, GELU's tanh approximation:
// gelu(g) = g/2 · (1 + tanh(√(2/π) · (g + 0.044715 g³))).
void gelu_tanh_mul(float* gate, const float* up, int64_t n);

// x ← cap · tanh(x / cap), n elements (cap > 0): Gemma 2's soft-capping.
void softcap(float* x, int64_t n, float cap);

// gate = silu(gate) * up, n elements.
void silu_mul(float* gate, const float* up, int64_t n);
void silu_mul_scalar(float* gate, const float* up, int64_t n);
void silu_mul_avx2(float* gate, const float* up, int64_t n);

// fp32 → fp16, round to nearest even (F16C when present). Both give identical bits for every
// value except NaN, whose payload may differ (both give a NaN of the same sign).
void fp32_to_fp16_row(const float* x, uint16_t* y, int64_t n);
void fp32_to_fp16_row_avx2(const float* x, uint16_t* y, int64_t n);

// Index of the largest value, the lowest one among equal maxima; NaNs are skipped (0 when every
// value is NaN or n == 0). The greedy sampler's hot loop: a 49k vocabulary per decoded token.
int64_t argmax(const float* x, int64_t n);
int64_t argmax_scalar(const float* x, int64_t n);
int64_t argmax_avx2(const float* x, int64_t n);

// y += x.
void add_inplace(float* y, const float* x, int64_t n);

// In-place softmax over n values (used by tests and attention's reference).
void softmax_scalar(float* x, int64_t n);

}  // namespace tokenfab::kernels
