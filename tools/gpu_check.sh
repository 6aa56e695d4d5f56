#!/usr/bin/env bash
# GPU machine, from the repository root: runs the `gpu`-labelled tests, `tokenfab-cli devices
# --json` and the GPU benchmarks from gpu-bundle/ (made by tools/gpu_package.sh on the build
# machine) and prints ONE JSON object on stdout:
#   {"tests":{"passed":…,"failed":…,"skipped":…,"suites":[{"name":…,"exit":…,"passed":…,
#    "failed":…,"skipped":…}],"output":"…"},"devices":{…},"benchmarks":{"model":…,"bench":{…},
#    "batch_bench_1":{…},"batch_bench_32":{…},"batch_bench_256":{…},"bench_llama3_8b":{…},
#    "bench_serial_launches":{…},"bench_decode_blocks":{…},"bench_gemv_split_k_on":{…},
#    "bench_llama3_8b_gemv_split_k_on":{…},"bench_tiled_prompt_attention":{…},
#    "bench_fused_epilogues":{…},"batch_bench_256_fused_epilogues":{…},
#    "bench_verify_rows_chains_on_decode_kernel":{…},"bench_new_variants":{…},
#    "bench_fused_layers":{…},
#    "batch_bench_1_fused_layers":{…},"bench_llama3_8b_fused_layers":{…},
#    "bench_verify_rows_fused_layers":{…},"batch_bench_32_fused_layers":{…},
#    "serve_bench_1_fused_layers":{…},"fused_smoke":{…},"fused_tensor_cores_smoke":{…},
#    "bench_fused_tensor_cores":{…},"bench_verify_rows_fused_tensor_cores":{…},
#    "batch_bench_32_fused_tensor_cores":{…},"batch_bench_256_fused_tensor_cores":{…},
#    "bench_llama3_8b_fused_tensor_cores":{…},"serve_bench_256_fused_tensor_cores":{…},
#    "serve_bench_1":{…},"serve_bench_32":{…},"serve_bench_256":{…},"bench_verify_rows":{…},
#    "generate_code_prompts":[{"prompt":…,"config":…,"lossless":…,"decode_tok_s":…,
#    "accept_per_step":…,"output_tokens":…,"error":…},…],"heads_eval_code":{"chain_4":{…},
#    "adaptive":{…},"tree":{…},"adaptive_fused_layers":{…},"adaptive_fused_tensor_cores":{…},
#    "tree_fused_tensor_cores":{…}} or null,"profile_decode_step":{…} or null,
#    "profile_decode_step_256":{…} or null},
#    "sanitizer":{"tool":"memcheck","suite":"test_cuda_gemv","exit":…,
#    "summary":"…","tail":"…"} or null,"real_model":"…","cublas":"…","elapsed_s":…}
# The benchmarks run on cuda:0 with the embedded model when its file is here (TOKENFAB_HOME, the
# XDG cache, or the parts gpu_package.sh --model-parts sent in gpu-model/), else with its synthetic
# twin (`tokenfab-cli synth`, same shape and types); the decode with a draft head needs the real
# model and gpu-model/head.gguf (null otherwise).
# Needs only the NVIDIA driver and the CUDA toolkit's cuBLAS there (no Qt, no network): the other
# libraries come from the bundle. Progress goes to stderr. Each suite is cut off after
# SUITE_TIMEOUT_S seconds (default 300: the real-model and lossless tests check against a
# double-precision forward pass on the CPU), so the whole check ends in under 8 minutes.
# GPU_CHECK_LOG=FILE appends each suite's and each benchmark's whole output to FILE as it ends, so
# that a check cut short still leaves what it saw.
# gpu-bundle/ is git-ignored: name it among the paths carried to the GPU machine.
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
suite_timeout="${SUITE_TIMEOUT_S:-300}"
log="${GPU_CHECK_LOG:-/dev/null}"
start=$(date +%s)

# A JSON string literal of $1 (control characters other than tab and newline dropped).
json_string() {
  printf '"'
  printf '%s' "$1" | tr -d '\000-\010\013\014\016-\037' |
    sed -e 's/\\/\\\\/g' -e 's/"/\\"/g' -e 's/\t/\\t/g' | awk 'NR > 1 { printf "\\n" } { printf "%s", $0 }'
  printf '"'
}

fail() {  # one JSON summary even when the check cannot run
  printf '{"error":%s,"tests":{"passed":0,"failed":0,"skipped":0,"suites":[],"output":""},"devices":null}\n' \
    "$(json_string "$1")"
  exit 1
}

# shellcheck source=tools/gpu_env.sh
. "$root/tools/gpu_env.sh" || fail "$gpu_env_error"

# The embedded model, when tools/gpu_package.sh --model-parts sent it in parts: joined into a
# temporary TOKENFAB_HOME (the tests and benchmarks look there) once its sha256 is the pinned one.
real_model="absent (no gpu-model/ parts: the real-model tests skip, the benchmarks use a twin)"
if [ -f "$root/gpu-model/part-1" ] && [ -f "$root/gpu-model/part-2" ]; then
  mkdir -p "$libs/home/models"
  joined="$libs/home/models/SmolLM2-135M-Instruct.Q4_1.gguf"
  cat "$root/gpu-model/part-1" "$root/gpu-model/part-2" >"$joined"
  if [ "$(sha256sum "$joined" | cut -d' ' -f1)" = "$(cat "$root/gpu-model/SHA256" 2>/dev/null)" ]; then
    export TOKENFAB_HOME="$libs/home"
    real_model="joined from gpu-model/, sha256 as pinned"
  else
    rm -f "$joined"
    real_model="error: the parts in gpu-model/ do not make the file of the pinned sha256"
  fi
fi

# Each variant of the fused decode layers first, in one short run: a fault there (a kernel that
# traps, leaving its process's CUDA context unusable) must not take the rest of the check with
# it. If a variant's run fails, the tests skip its rows (TOKENFAB_SKIP_FUSED_LAYERS for
# --fused-layers on, TOKENFAB_SKIP_FUSED_TENSOR_CORES for tensor-cores) and its benchmarks are
# left out, each saying why.
fused_smoke_run() {  # the --fused-layers value, the variable to export if the run fails
  local value="$1" var="$2" out rc
  echo "gpu_check: fused decode layers ($value), a short run" >&2
  out="$(timeout 120 "$bundle_bin/tokenfab-cli" bench --device cuda:0 --synthetic smollm2-135m \
    --prompt-tokens 64 --gen-tokens 32 --repetitions 1 --fused-layers "$value" --json 2>/tmp/gpu_check_fused.err)"
  rc=$?
  printf '===== fused smoke %s (exit %d)\n%s\n%s\n' "$value" "$rc" "$out" "$(cat /tmp/gpu_check_fused.err)" >>"$log"
  if [ "$rc" -ne 0 ] || [ -z "$out" ]; then
    export "$var=the fused decode layers' short run ($value) failed (exit $rc): $(tail -c 300 /tmp/gpu_check_fused.err | tr '\n' ' ')"
    out="{\"error\":$(json_string "${!var}")}"
  fi
  printf '%s' "$out" >/tmp/gpu_check_fused.json
}
fused_smoke_run on TOKENFAB_SKIP_FUSED_LAYERS
fused_smoke="$(cat /tmp/gpu_check_fused.json)"
fused_smoke_run tensor-cores TOKENFAB_SKIP_FUSED_TENSOR_CORES
fused_tc_smoke="$(cat /tmp/gpu_check_fused.json)"

suites_json=""
output=""
passed=0
failed=0
skipped=0
for exe in "$bundle_bin"/test_*; do
  name="$(basename "$exe")"
  echo "gpu_check: $name" >&2
  missing="$(ldd "$exe" 2>&1 | grep 'not found')"
  text="$(timeout "$suite_timeout" "$exe" 2>&1)"
  rc=$?
  [ "$rc" -eq 124 ] && text="$text
gpu_check: $name killed after ${suite_timeout} s"
  printf '===== %s (exit %d)\n%s\n' "$name" "$rc" "$text" >>"$log"
  [ -n "$missing" ] && text="gpu_check: missing libraries:
$missing
$text"
  # Qt Test's last line of counts: "Totals: 3 passed, 1 failed, 0 skipped, …".
  totals="$(printf '%s\n' "$text" | grep '^Totals:' | tail -n 1)"
  p=$(printf '%s' "$totals" | sed -n 's/.* \([0-9]*\) passed.*/\1/p')
  f=$(printf '%s' "$totals" | sed -n 's/.* \([0-9]*\) failed.*/\1/p')
  s=$(printf '%s' "$totals" | sed -n 's/.* \([0-9]*\) skipped.*/\1/p')
  p=${p:-0}
  s=${s:-0}
  # A suite that crashed or timed out before its totals counts as one failure.
  if [ -z "$totals" ] || { [ "$rc" -ne 0 ] && [ "${f:-0}" -eq 0 ]; }; then f=$((${f:-0} + 1)); fi
  passed=$((passed + p))
  failed=$((failed + f))
  skipped=$((skipped + s))
  suites_json="$suites_json${suites_json:+,}{\"name\":$(json_string "$name"),\"exit\":$rc,\"passed\":$p,\"failed\":$f,\"skipped\":$s}"
  # Failures and skips in full; passing lines are summed up by the counts.
  output="$output===== $name (exit $rc)
$(printf '%s\n' "$text" | grep -v '^PASS   :' | tail -c 6000)
"
done

# The GEMV suite again under compute-sanitizer's memcheck (where the toolkit has it): every load
# of the quantized layouts and of the overlapped launches inside its buffers.
sanitizer_json=null
sanitizer="$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null)"
if [ -n "$sanitizer" ] && [ -x "$bundle_bin/test_cuda_gemv" ]; then
  echo "gpu_check: compute-sanitizer memcheck test_cuda_gemv" >&2
  text="$(timeout "$suite_timeout" "$sanitizer" --tool memcheck --error-exitcode 3 "$bundle_bin/test_cuda_gemv" 2>&1)"
  rc=$?
  printf '===== memcheck test_cuda_gemv (exit %d)\n%s\n' "$rc" "$text" >>"$log"
  summary="$(printf '%s\n' "$text" | grep 'ERROR SUMMARY' | tail -n 1)"
  sanitizer_json="{\"tool\":\"memcheck\",\"suite\":\"test_cuda_gemv\",\"exit\":$rc,\"summary\":$(json_string "$summary"),\"tail\":$(json_string "$(printf '%s\n' "$text" | grep -v '^PASS   :' | tail -c 3000)")}"
fi

devices="$(timeout 60 "$bundle_bin/tokenfab-cli" devices --json 2>/dev/null)"
rc=$?
if [ "$rc" -ne 0 ] || [ -z "$devices" ]; then
  devices="{\"error\":$(json_string "tokenfab-cli devices --json exited $rc: $(timeout 60 "$bundle_bin/tokenfab-cli" devices --json 2>&1 | tail -c 2000)")}"
fi

# GPU benchmarks (each a JSON object, or {"error":…} naming why it did not run).
cli="$bundle_bin/tokenfab-cli"
model="${TOKENFAB_HOME:-${XDG_CACHE_HOME:-$HOME/.cache}/tokenfab}/models/SmolLM2-135M-Instruct.Q4_1.gguf"
model_kind="embedded"
if [ ! -f "$model" ]; then
  model="$libs/smollm2-135m-synthetic.gguf"
  model_kind="synthetic smollm2-135m, q4_1"
  timeout 120 "$cli" synth --shape smollm2-135m --type q4_1 --out "$model" >/dev/null 2>&1 ||
    model_kind="none: tokenfab-cli synth failed"
fi
run_bench() {  # name, seconds allowed, then the tokenfab-cli arguments
  local name="$1" limit="$2" out rc
  shift 2
  case " $* " in *" --fused-layers on "*)
    if [ -n "${TOKENFAB_SKIP_FUSED_LAYERS:-}" ]; then
      printf '{"error":%s}' "$(json_string "left out: $TOKENFAB_SKIP_FUSED_LAYERS")"
      return
    fi ;;
  *" --fused-layers tensor-cores "*)
    if [ -n "${TOKENFAB_SKIP_FUSED_TENSOR_CORES:-}" ]; then
      printf '{"error":%s}' "$(json_string "left out: $TOKENFAB_SKIP_FUSED_TENSOR_CORES")"
      return
    fi ;;
  esac
  echo "gpu_check: $name" >&2
  out="$(timeout "$limit" "$cli" "$@" --json 2>/tmp/gpu_check_bench.err)"
  rc=$?
  printf '===== %s (exit %d)\n%s\n%s\n' "$name" "$rc" "$out" "$(cat /tmp/gpu_check_bench.err)" >>"$log"
  if [ "$rc" -ne 0 ] || [ -z "$out" ]; then
    out="{\"error\":$(json_string "exit $rc: $(tail -c 2000 /tmp/gpu_check_bench.err)")}"
  fi
  printf '%s' "$out"
}
bench_json="$(run_bench bench 120 bench --model "$model" --device cuda:0 --prompt-tokens 512 --gen-tokens 256)"
batch1_json="$(run_bench batch-bench-1 120 batch-bench --model "$model" --device cuda:0 --streams 1 --prompt-tokens 128 --gen-tokens 256)"
# The same with every kernel launched after the previous one has finished (no overlapping
# launches): what the overlap buys. (Its batch and 8B runs, and the 8B shape on the file's
# blocks, were measured on 2026-12-04 and left out since, to keep the check under 8 minutes.)
bench_serial_json="$(run_bench bench-serial-launches 120 bench --model "$model" --device cuda:0 --prompt-tokens 512 --gen-tokens 256 --launch-overlap off)"
# Decode GEMVs over the file's own blocks instead of the BF16 copies (CudaOptions::block_gemv).
bench_blocks_json="$(run_bench bench-decode-blocks 120 bench --model "$model" --device cuda:0 --prompt-tokens 512 --gen-tokens 256 --decode-weights blocks)"
batch32_json="$(run_bench batch-bench-32 120 batch-bench --model "$model" --device cuda:0 --streams 32 --prompt-tokens 128 --gen-tokens 256)"
batch256_json="$(run_bench batch-bench-256 120 batch-bench --model "$model" --device cuda:0 --streams 256 --prompt-tokens 128 --gen-tokens 256 --token-budget 4096)"
# The Llama 3 8B shape at batch 1 against the HBM roofline (a Q4_0 file is written quicker than a
# BF16 one; the GPU holds BF16 weights either way).
bench8b_json="$(run_bench bench-llama3-8b 240 bench --device cuda:0 --synthetic llama3-8b --prompt-tokens 128 --gen-tokens 64 --repetitions 1)"
# The variants written since the last GPU run (2026-12-04), each off by default (the code of that
# run) until a run verifies it; the gpu tests hold each to the code it replaces
# (test_cuda_model's new_gpu_variants_agree_with_the_last_verified_ones and the kernels' own
# comparisons), and these runs time each against the defaults above. Narrow matrices' rows split
# over four warps against whole rows per warp (the default), at SmolLM2's and Llama 3 8B's shapes.
bench_split_json="$(run_bench bench-gemv-split-k-on 120 bench --model "$model" --device cuda:0 --prompt-tokens 512 --gen-tokens 256 --gemv-split-k on)"
bench8b_split_json="$(run_bench bench-llama3-8b-gemv-split-k-on 240 bench --device cuda:0 --synthetic llama3-8b --prompt-tokens 128 --gen-tokens 64 --repetitions 1 --gemv-split-k on)"
# The tiled prompt attention against the key-by-key kernel: the 512-token prompt's pass
# (prefill_gpu_ms, ttft_ms; 19 ms with the key-by-key kernel on 2026-12-04).
bench_tiled_json="$(run_bench bench-tiled-prompt-attention 120 bench --model "$model" --device cuda:0 --prompt-tokens 512 --gen-tokens 256 --tiled-prompt-attention on)"
# The many-row steps' glue in 10 launches a layer instead of 14: the prompt's pass and 256
# streams' decode steps (cuBLASLt's GEMMs).
bench_epilogues_json="$(run_bench bench-fused-epilogues 120 bench --model "$model" --device cuda:0 --prompt-tokens 512 --gen-tokens 256 --fused-epilogues on)"
batch256_epilogues_json="$(run_bench batch-bench-256-fused-epilogues 120 batch-bench --model "$model" --device cuda:0 --streams 256 --prompt-tokens 128 --gen-tokens 256 --token-budget 4096 --fused-epilogues on)"
# Verified chains of up to 8 rows on the decode kernel (and their graphs) against chains of 4+
# rows attended as prompt chunks (bench_verify_rows below: 18 ms a step from 4 rows on
# 2026-12-04).
verify_chains_json="$(run_bench bench-verify-rows-chains-on-decode-kernel 120 bench --model "$model" --device cuda:0 --prompt-tokens 512 --gen-tokens 64 --repetitions 2 --verify-rows 1,2,3,4,5,8 --chains-on-decode-kernel on)"
# All four together (the code as written since, before they went back to off).
bench_new_json="$(run_bench bench-new-variants 120 bench --model "$model" --device cuda:0 --prompt-tokens 512 --gen-tokens 256 --gemv-split-k on --tiled-prompt-attention on --chains-on-decode-kernel on --fused-epilogues on)"
# Steps of decode rows in one cooperative kernel (CudaOptions::fused_layers) against five
# launches a layer (fourteen above 8 rows, ten with --fused-epilogues on): single stream, the 8B shape, verifying steps of 1 to 64
# rows, and 32 streams.
bench_fused_json="$(run_bench bench-fused-layers 120 bench --model "$model" --device cuda:0 --prompt-tokens 512 --gen-tokens 256 --fused-layers on)"
batch1_fused_json="$(run_bench batch-bench-1-fused-layers 120 batch-bench --model "$model" --device cuda:0 --streams 1 --prompt-tokens 128 --gen-tokens 256 --fused-layers on)"
bench8b_fused_json="$(run_bench bench-llama3-8b-fused-layers 240 bench --device cuda:0 --synthetic llama3-8b --prompt-tokens 128 --gen-tokens 64 --repetitions 1 --fused-layers on)"
verify_fused_json="$(run_bench bench-verify-rows-fused-layers 120 bench --model "$model" --device cuda:0 --prompt-tokens 512 --gen-tokens 64 --repetitions 2 --verify-rows 1,2,3,4,5,8,16,34,64 --fused-layers on)"
batch32_fused_json="$(run_bench batch-bench-32-fused-layers 120 batch-bench --model "$model" --device cuda:0 --streams 32 --prompt-tokens 128 --gen-tokens 256 --fused-layers on)"
# The same with the fused kernel's products on tensor cores (steps of up to 256 rows, so 256
# streams too).
bench_tc_json="$(run_bench bench-fused-tensor-cores 120 bench --model "$model" --device cuda:0 --prompt-tokens 512 --gen-tokens 256 --fused-layers tensor-cores)"
bench8b_tc_json="$(run_bench bench-llama3-8b-fused-tensor-cores 240 bench --device cuda:0 --synthetic llama3-8b --prompt-tokens 128 --gen-tokens 64 --repetitions 1 --fused-layers tensor-cores)"
verify_tc_json="$(run_bench bench-verify-rows-fused-tensor-cores 120 bench --model "$model" --device cuda:0 --prompt-tokens 512 --gen-tokens 64 --repetitions 2 --verify-rows 1,2,3,4,5,8,16,34,64 --fused-layers tensor-cores)"
batch32_tc_json="$(run_bench batch-bench-32-fused-tensor-cores 120 batch-bench --model "$model" --device cuda:0 --streams 32 --prompt-tokens 128 --gen-tokens 256 --fused-layers tensor-cores)"
batch256_tc_json="$(run_bench batch-bench-256-fused-tensor-cores 120 batch-bench --model "$model" --device cuda:0 --streams 256 --prompt-tokens 128 --gen-tokens 256 --token-budget 4096 --fused-layers tensor-cores)"
# The engine on the GPU: serve-bench at 1, 32 and 256 requests in flight (greedy).
serve_bench() {  # name, concurrency, requests, temperature, device options…
  local name="$1" concurrency="$2" requests="$3" temperature="$4"
  shift 4
  run_bench "$name" 120 --log-level info serve-bench --model "$model" "$@" --concurrency "$concurrency" \
    --requests "$requests" --prompt-len 64:128 --max-tokens 256 --temperature "$temperature" \
    --kv-mem 4096 --token-budget 4096 --max-running 256
}
serve1_json="$(serve_bench serve-bench-1 1 8 0 --devices cuda:0)"
serve1_fused_json="$(serve_bench serve-bench-1-fused-layers 1 8 0 --devices cuda:0 --fused-layers on)"
serve32_json="$(serve_bench serve-bench-32 32 64 0 --devices cuda:0)"
serve256_json="$(serve_bench serve-bench-256 256 512 0 --devices cuda:0)"
serve256_tc_json="$(serve_bench serve-bench-256-fused-tensor-cores 256 512 0 --devices cuda:0 --fused-layers tensor-cores)"
# Sampled requests (temperature 0.8, top-k 40, min-p 0.05): each row's candidates come back
# instead of its logits.
serve256_sampled_json="$(serve_bench serve-bench-256-sampled 256 512 0.8 --devices cuda:0)"
# The GPU as two partitions (prefill and decode), sharing its SMs, then with 66 SMs of the
# decode partition's own (green contexts).
serve32_partitions_json="$(serve_bench serve-bench-32-partitions 32 64 0 --prefill cuda:0 --decode cuda:0)"
serve32_partitions_sms_json="$(serve_bench serve-bench-32-partitions-66-sms 32 64 0 --prefill cuda:0 --decode cuda:0 --decode-sms 66)"
# What each partition got (the device log's one line each: SMs, green context or why not).
partition_notes="$(grep -ho 'cuda:0/[a-z]*: [a-z]* partition: .*' /tmp/gpu_check_bench.err | head -2 | tr '\n' ';')"
# What a speculative verifying step costs against a one-row step (one sequence, all rows' logits).
verify_json="$(run_bench bench-verify-rows 120 bench --model "$model" --device cuda:0 --prompt-tokens 512 --gen-tokens 64 --repetitions 2 --verify-rows 1,2,3,4,5,8,16,64)"
# Greedy decode on cuda:0 of the first code validation prompts with the draft head sent in
# gpu-model/ (real model only), as chat would: no head, the adaptive chain (the default) and the
# static tree; then the same three with the fused decode layers (-fused) and with them on tensor
# cores (-tc). Each run says whether its tokens are those of the run without a head (of its kind
# of layers: lossless) and its decode tok/s and ACCEPT/STEP. (heads_eval_code below still runs a
# fixed chain of 4 over all the prompts.) The engine routes verified chains as on 2026-12-04
# (CudaOptions::chains_on_decode_kernel off: a chain of 4+ rows attended as a prompt chunk, which
# can part from the plain run at a near-tie); the fused runs take chains row by row.
head_runs=null
if [ -f "$root/gpu-model/head.gguf" ] && [ -n "${TOKENFAB_HOME:-}" ]; then
  prompts_dir="$libs/prompts"
  mkdir -p "$prompts_dir"
  # Entries are separated by %% lines; the header's # lines come before the first.
  awk -v dir="$prompts_dir" 'BEGIN { n = 0; cur = "" }
    /^#/ && n == 0 && cur == "" { next }
    /^%%$/ { print cur > (dir "/" n); close(dir "/" n); n++; cur = ""; next }
    { cur = cur (cur == "" ? "" : "\n") $0 }' "$root/resources/domains/code/validation.txt"
  # A number field of the generate JSON in $out, or nothing.
  field() { printf '%s' "$out" | grep -o "\"$1\":[-0-9.e+]*" | head -n 1 | cut -d: -f2; }
  head_runs=""
  for i in 0 1 2 3; do
    [ -f "$prompts_dir/$i" ] || continue
    prompt="$(cat "$prompts_dir/$i")"
    plain_ids=""
    for config in none chain tree none-fused chain-fused tree-fused none-tc chain-tc tree-tc; do
      case "$config" in
        none) args=() ;;
        chain) args=(--head "$root/gpu-model/head.gguf") ;;
        tree) args=(--head "$root/gpu-model/head.gguf" --spec tree) ;;
        none-fused) args=(--fused-layers on) ;;
        chain-fused) args=(--head "$root/gpu-model/head.gguf" --fused-layers on) ;;
        tree-fused) args=(--head "$root/gpu-model/head.gguf" --spec tree --fused-layers on) ;;
        none-tc) args=(--fused-layers tensor-cores) ;;
        chain-tc) args=(--head "$root/gpu-model/head.gguf" --fused-layers tensor-cores) ;;
        tree-tc) args=(--head "$root/gpu-model/head.gguf" --spec tree --fused-layers tensor-cores) ;;
      esac
      out="$(run_bench "generate-$i-$config" 60 generate --model "$model" --devices cuda:0 \
        --chat "$prompt" --max-tokens 256 --temperature 0 "${args[@]}")"
      ids="$(printf '%s' "$out" | grep -o '"ids":\[[^]]*\]')"
      case "$config" in none | none-fused | none-tc) plain_ids="$ids" ;; esac
      same=false
      [ -n "$ids" ] && [ "$ids" = "$plain_ids" ] && same=true
      head_runs="$head_runs${head_runs:+,}{\"prompt\":$i,\"config\":\"$config\",\"lossless\":$same,\"decode_tok_s\":$(field decode_tok_s | grep . || echo null),\"accept_per_step\":$(field accept_per_step | grep . || echo null),\"output_tokens\":$(field output_tokens | grep . || echo null),\"error\":$(printf '%s' "$out" | grep -q '^{"error"' && printf '%s' "$out" | sed 's/^{"error":\(.*\)}$/\1/' || echo null)}"
    done
  done
  head_runs="[$head_runs]"
fi
# The same head over all the code validation prompts on cuda:0 (`heads eval`, which refuses a run
# whose outputs with the head differ from those without): a fixed chain of 4, the adaptive chain
# and the static tree.
heads_eval_json=null
if [ -f "$root/gpu-model/head.gguf" ] && [ -n "${TOKENFAB_HOME:-}" ]; then
  heads_eval() {  # name, then more heads eval arguments
    local name="$1"
    shift
    run_bench "$name" 120 heads eval --model "$model" --head "$root/gpu-model/head.gguf" \
      --prompt-set code --max-tokens 128 --devices cuda:0 --no-record "$@"
  }
  heads_eval_json="{\"chain_4\":$(heads_eval heads-eval-chain-4),\"adaptive\":$(heads_eval heads-eval-adaptive --adaptive),\"tree\":$(heads_eval heads-eval-tree --spec tree),\"adaptive_fused_layers\":$(heads_eval heads-eval-adaptive-fused-layers --adaptive --fused-layers on),\
\"adaptive_fused_tensor_cores\":$(heads_eval heads-eval-adaptive-fused-tensor-cores --adaptive --fused-layers tensor-cores),\
\"tree_fused_tensor_cores\":$(heads_eval heads-eval-tree-fused-tensor-cores --spec tree --fused-layers tensor-cores)}"
fi
# Where a decode step's time goes: each kernel of one step past the warm-up, timed by Nsight
# Compute, where the machine has it (null otherwise): a single stream's step (about 160
# launches), and a step of 256 streams (about 310: cuBLASLt's GEMMs and the kernels between).
profile() {  # name, launches to skip, launches to profile, then tokenfab-cli arguments…
  local name="$1" skip="$2" count="$3" out rc
  shift 3
  echo "gpu_check: profile $name" >&2
  out="$(timeout 150 "$root/tools/gpu_profile.sh" --skip "$skip" --count "$count" -- "$@" --json \
    2>/tmp/gpu_check_profile.err)"
  rc=$?
  printf '===== profile %s (exit %d)\n%s\n%s\n' "$name" "$rc" "$out" "$(cat /tmp/gpu_check_profile.err)" >>"$log"
  if [ "$rc" -ne 0 ] || [ -z "$out" ]; then
    out="{\"error\":$(json_string "exit $rc: $(tail -c 2000 /tmp/gpu_check_profile.err)")}"
  fi
  printf '%s' "$out"
}
profile_json=null
profile256_json=null
if command -v ncu >/dev/null || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu >/dev/null 2>&1; then
  profile_json="$(profile decode-step 20000 160 bench --model "$model" --device cuda:0 \
    --prompt-tokens 512 --gen-tokens 128 --repetitions 1)"
  profile256_json="$(profile decode-step-256 20000 310 batch-bench --model "$model" --device cuda:0 \
    --streams 256 --prompt-tokens 128 --gen-tokens 256 --token-budget 4096)"
fi
benchmarks="{\"model\":$(json_string "$model_kind"),\"bench\":$bench_json,\"batch_bench_1\":$batch1_json,\"batch_bench_32\":$batch32_json,\"batch_bench_256\":$batch256_json,\"bench_llama3_8b\":$bench8b_json,\"bench_serial_launches\":$bench_serial_json,\"bench_decode_blocks\":$bench_blocks_json,\"bench_gemv_split_k_on\":$bench_split_json,\"bench_llama3_8b_gemv_split_k_on\":$bench8b_split_json,\"bench_tiled_prompt_attention\":$bench_tiled_json,\"bench_fused_epilogues\":$bench_epilogues_json,\"batch_bench_256_fused_epilogues\":$batch256_epilogues_json,\"bench_verify_rows_chains_on_decode_kernel\":$verify_chains_json,\"bench_new_variants\":$bench_new_json,\"bench_fused_layers\":$bench_fused_json,\"batch_bench_1_fused_layers\":$batch1_fused_json,\"bench_llama3_8b_fused_layers\":$bench8b_fused_json,\"bench_verify_rows_fused_layers\":$verify_fused_json,\"batch_bench_32_fused_layers\":$batch32_fused_json,\"serve_bench_1_fused_layers\":$serve1_fused_json,\"serve_bench_1\":$serve1_json,\"serve_bench_32\":$serve32_json,\"serve_bench_256\":$serve256_json,\"serve_bench_256_sampled\":$serve256_sampled_json,\"serve_bench_32_partitions\":$serve32_partitions_json,\"serve_bench_32_partitions_66_sms\":$serve32_partitions_sms_json,\"partition_notes\":$(json_string "$partition_notes"),\"fused_smoke\":$fused_smoke,\"fused_tensor_cores_smoke\":$fused_tc_smoke,\"bench_fused_tensor_cores\":$bench_tc_json,\"bench_verify_rows_fused_tensor_cores\":$verify_tc_json,\"batch_bench_32_fused_tensor_cores\":$batch32_tc_json,\"batch_bench_256_fused_tensor_cores\":$batch256_tc_json,\"bench_llama3_8b_fused_tensor_cores\":$bench8b_tc_json,\"serve_bench_256_fused_tensor_cores\":$serve256_tc_json,\"bench_verify_rows\":$verify_json,\"generate_code_prompts\":$head_runs,\"heads_eval_code\":$heads_eval_json,\"profile_decode_step\":$profile_json,\"profile_decode_step_256\":$profile256_json}"

printf '{"real_model":%s,"tests":{"passed":%d,"failed":%d,"skipped":%d,"suites":[%s],"output":%s},"sanitizer":%s,"devices":%s,"benchmarks":%s,"cublas":%s,"elapsed_s":%d}\n' \
  "$(json_string "$real_model")" "$passed" "$failed" "$skipped" "$suites_json" "$(json_string "$output")" "$sanitizer_json" "$devices" \
  "$benchmarks" "$(json_string "${cublas_dir:-not found}")" "$(($(date +%s) - start))"
[ "$failed" -eq 0 ]
