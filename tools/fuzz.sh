#!/usr/bin/env bash
# Fuzzes what the app reads from users' files (tests/fuzz/fuzz_targets.h): builds the libFuzzer
# targets with clang, ASan and UBSan into build-fuzz/ (git-ignored), writes their seeds, and runs
# each target for SECONDS (default 300), one per core at a time. The corpus grows in
# build-fuzz/fuzz/corpus/<target>/ from run to run. An input that makes a target fail is copied to
# tests/fuzz/regressions/<target>/ and the script exits 1: fix the fault, and commit the input, so
# that test_fuzz_replay keeps it fixed in every build.
# Usage: tools/fuzz.sh [SECONDS] [TARGET…]   (targets: gguf_file model_file head_file tokenizer_text
#   sampler_rows database_file quant_blocks chat_template openai_request)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
seconds="${1:-300}"
shift || true
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(gguf_file model_file head_file tokenizer_text sampler_rows database_file
  quant_blocks chat_template openai_request)
build="$root/build-fuzz"
jobs="$(nproc)"

command -v clang++ >/dev/null || { echo "fuzz: clang++ is needed (apt install clang libclang-rt-dev)" >&2; exit 2; }
cmake -S "$root" -B "$build" -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo -DTOKENFAB_FUZZ=ON -DTOKENFAB_CUDA=OFF -DTOKENFAB_GUI=OFF \
  -DTOKENFAB_TESTS=OFF >/dev/null
cmake --build "$build" -j "$jobs" --target fuzz_seeds "${targets[@]/#/fuzz_}"

work="$build/fuzz"
rm -rf "$work/seeds"
"$build/bin/fuzz_seeds" "$work/seeds"
status=0
run_one() {  # target
  local t="$1"
  mkdir -p "$work/corpus/$t" "$work/artifacts/$t"
  "$build/bin/fuzz_$t" "$work/corpus/$t" "$work/seeds/$t" -max_len=131072 -timeout=20 \
    -rss_limit_mb=4096 -max_total_time="$seconds" -artifact_prefix="$work/artifacts/$t/" \
    -print_final_stats=1 >"$work/$t.log" 2>&1
}
pids=()
names=()
for t in "${targets[@]}"; do
  run_one "$t" &
  pids+=($!)
  names+=("$t")
  if [ ${#pids[@]} -ge "$jobs" ]; then
    wait "${pids[0]}" || true
    pids=("${pids[@]:1}")
  fi
done
for p in "${pids[@]}"; do wait "$p" || true; done

for t in "${names[@]}"; do
  runs="$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$work/$t.log" | grep -o '[0-9]*$' || true)"
  found=("$work/artifacts/$t"/*)
  if [ -e "${found[0]}" ]; then
    mkdir -p "$root/tests/fuzz/regressions/$t"
    cp "${found[@]}" "$root/tests/fuzz/regressions/$t/"
    echo "fuzz: $t: ${#found[@]} failing input(s) copied to tests/fuzz/regressions/$t/ (log: $work/$t.log)"
    status=1
  else
    echo "fuzz: $t: no fault in ${runs:-?} inputs over ${seconds} s"
  fi
done
exit "$status"
