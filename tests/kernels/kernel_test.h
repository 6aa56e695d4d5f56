#pragma once
// Qt Test suite for kernels/cpu. Every fast path is checked against a slow, obviously-right
// reference written here (or against the scalar kernel, once that has been checked so). Slots
// are defined in one file per theme:
//   test_kernels_formats.cpp    block formats from hand-built bytes and gguf.quants' golden
//                               blocks, fp16/bf16 conversions, describe_bad_block
//   test_kernels_quantize.cpp   quantizers (weights and activations)
//   test_kernels_gemv_blocks.cpp  the quantized GPU GEMV's weight layout, built on the host
//   test_kernels_gemm.cpp       gemm_scalar / gemm_avx2 / x8 kernels, matmul()
//   test_kernels_ops.cpp        rms_norm, rope, silu_mul, fp16 rows, softmax, argmax
//   test_kernels_attention.cpp  attention_scalar / attention_avx2
//   test_kernels_thread_pool.cpp  ThreadPool
//   test_kernels_main.cpp       main()

#include <QMetaType>
#include <QObject>
#include <cstdint>
#include <random>
#include <vector>

#include "kernels/cpu/quant_types.h"

Q_DECLARE_METATYPE(tokenfab::kernels::WeightType)

class KernelTest : public QObject {
  Q_OBJECT

 private slots:
  void initTestCase();

  // test_kernels_formats.cpp
  void dequantizes_hand_built_q4_0();
  void dequantizes_hand_built_q4_1();
  void dequantizes_hand_built_q8_0();
  void dequantizes_hand_built_f16();
  void dequantizes_hand_built_bf16();
  void fp16_round_trips_every_value();
  void fp16_rounds_to_nearest_even();
  void bf16_round_trips_and_rounds_to_nearest_even();
  void block_sizes_match_ggml();
  void dequantizes_hand_built_q5_0();
  void dequantizes_hand_built_q5_1();
  void dequantizes_hand_built_q2_k();
  void dequantizes_hand_built_q3_k();
  void dequantizes_hand_built_q4_k();
  void dequantizes_hand_built_q5_k();
  void dequantizes_hand_built_q6_k();
  void dequantizes_hand_built_iq4_nl();
  void dequantizes_hand_built_iq4_xs();
  void dequantizes_golden_blocks_data();
  void dequantizes_golden_blocks();
  void describe_bad_block_names_the_block_data();
  void describe_bad_block_names_the_block();
  void describe_bad_block_ignores_float_types();

  // test_kernels_quantize.cpp
  void quantize_dequantize_error_is_bounded_data();
  void quantize_dequantize_error_is_bounded();
  void q8a_avx2_matches_scalar_bitwise_data();
  void q8a_avx2_matches_scalar_bitwise();
  void q8a_scalar_error_is_bounded();
  void searched_quantizers_error_is_bounded_data();
  void searched_quantizers_error_is_bounded();
  void searched_quantizers_beat_plain_max_scaling_data();
  void searched_quantizers_beat_plain_max_scaling();
  void searched_quantizers_are_blockwise_and_keep_zeros_data();
  void searched_quantizers_are_blockwise_and_keep_zeros();

  // test_kernels_gemv_blocks.cpp
  void gemv_blocks_equal_dequantized_rows_data();
  void gemv_blocks_equal_dequantized_rows();
  void gemv_blocks_refuse_what_has_no_quantized_form();

  // test_kernels_gemm.cpp
  void gemm_matches_reference_data();
  void gemm_matches_reference();
  void matmul_matches_per_job_gemm_data();
  void matmul_matches_per_job_gemm();
  void matmul_rejects_what_it_cannot_compute();

  // test_kernels_ops.cpp
  void rms_norm_matches_formula();
  void rope_matches_formula_and_keeps_norms();
  void rope_variants_match_formula();
  void gelu_and_softcap_match_formula();
  void silu_mul_avx2_matches_scalar();
  void fp16_row_avx2_matches_scalar();
  void softmax_matches_formula_and_sums_to_one();
  void argmax_finds_the_first_maximum();

  // test_kernels_attention.cpp
  void attention_scalar_matches_double_reference_data();
  void attention_scalar_matches_double_reference();
  void attention_avx2_matches_scalar_data();
  void attention_avx2_matches_scalar();
  void attention_decode_split_matches_reference_data();
  void attention_decode_split_matches_reference();

  // test_kernels_thread_pool.cpp
  void thread_pool_runs_each_index_once();
  void thread_pool_split_covers_range();
  void thread_pool_survives_many_runs_data();
  void thread_pool_survives_many_runs();
  void thread_pool_wakes_after_sleeping();
};

namespace tokenfab::kernels::test {

// Unit roundoff of f32 (half an ulp of 1).
inline constexpr double kF32Eps = 1.0 / (1 << 24);

// n floats, uniform in [lo, hi).
inline std::vector<float> uniform_floats(std::mt19937& rng, size_t n, float lo, float hi) {
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

// n fp16 values: uniform in [lo, hi), then rounded to fp16.
inline std::vector<uint16_t> uniform_halves(std::mt19937& rng, size_t n, float lo, float hi) {
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<uint16_t> v(n);
  for (uint16_t& h : v) h = fp32_to_fp16(dist(rng));
  return v;
}

}  // namespace tokenfab::kernels::test
