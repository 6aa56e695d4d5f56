#!/usr/bin/env bash
# Reproduces the README's comparison with llama.cpp: the same GGUF file, the same thread count,
# the same machine, llama.cpp's `llama-bench -p 512 -n 128 -r 3` against `tokenfab-cli bench
# --prompt-tokens 512 --gen-tokens 128 --repetitions 3`.
#
# llama.cpp is the copy that the llama-cpp-python sdist vendors (vendor/llama.cpp), downloaded
# from PyPI, verified and built (Release, GGML_NATIVE=ON without AMX, CPU only; the llama-bench
# target) in build-llamacpp/ by tools/llamacpp_build.sh, which this script sources. Steps already
# done are skipped, so a second run only benchmarks. Tokenfab itself must already be built
# (tools/bootstrap.sh).
#
# Prints ONE JSON object on stdout; progress and the tools' own logs go to stderr:
#   {"model":…,"model_sha256":…,"threads":…,"cpu":…,"date":…,
#    "llama_cpp":{"llama_cpp_python":…,"sdist_sha256":…,"commit":…,"build_commit":…,
#                 "build_number":…,"pp512_tok_s":{"avg":…,"stddev":…,"samples":[…]},
#                 "tg128_tok_s":{"avg":…,"stddev":…,"samples":[…]},"cmake_flags":[…],"command":…},
#    "tokenfab":{"prefill_tok_s":…,"decode_tok_s":…,"prefill_tok_s_runs":[…],
#                "decode_tok_s_runs":[…],"statistic":"median","command":…},
#    "ratio":{"prefill":…,"decode":…}}
# llama-bench reports the mean and standard deviation of its runs (after one untimed warm-up);
# tokenfab-cli bench the median of its runs; each ratio is Tokenfab's median over llama.cpp's mean.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build_dir="${TOKENFAB_BUILD_DIR:-$root/build}"
# llama.cpp's download and build: $llamacpp_python_version, $llamacpp_work_dir, llamacpp_build.
# shellcheck source=tools/llamacpp_build.sh
source "$root/tools/llamacpp_build.sh"
llama_cpp_python_version="$llamacpp_python_version"
work_dir="$llamacpp_work_dir"
prompt_tokens=512
gen_tokens=128
repetitions=3

usage() {
  cat <<EOF
Usage: tools/compare_llamacpp.sh [--model PATH] [--threads N] [--build-only]

Benchmarks one GGUF file with llama.cpp's llama-bench (pp${prompt_tokens}, tg${gen_tokens},
${repetitions} runs) and with \`tokenfab-cli bench\` (the same prompt and generation lengths,
${repetitions} runs) on the same number of threads, and prints one JSON object with both tools'
tokens/s side by side and their ratios. Progress goes to stderr.

The first run downloads the llama-cpp-python ${llama_cpp_python_version} sdist from PyPI (tens of
MB; its SHA-256 is checked against PyPI's), unpacks it and builds its vendored llama.cpp's
llama-bench (Release, GGML_NATIVE=ON without AMX, CPU only) in ${work_dir}
(several minutes on 2 cores); later runs reuse them.

Options:
  --model PATH   GGUF file to benchmark (default: the embedded model; \`tokenfab-cli fetch\`
                 prints its path and downloads it when it is absent)
  --threads N    threads for both tools (default: $(nproc), the hardware threads)
  --build-only   download and build llama-bench, then stop (no benchmark)
  -h, --help     this help

Environment:
  LLAMA_CPP_PYTHON_VERSION  llama-cpp-python release whose llama.cpp is built (default 0.3.36)
  TOKENFAB_BUILD_DIR        Tokenfab's build folder (default: build/ at the repository root)
  LLAMACPP_WORK_DIR         where the sdist is unpacked and built (default: build-llamacpp/)
EOF
}

log() { echo "compare_llamacpp: $*" >&2; }
die() {
  echo "compare_llamacpp: error: $*" >&2
  exit 1
}
need() { command -v "$1" >/dev/null 2>&1 || die "$1 not found; $2"; }

model=""
threads="$(nproc)"
build_only=0
while (($#)); do
  case "$1" in
    --model)
      (($# >= 2)) || die "--model needs a path"
      model="$2"
      shift 2
      ;;
    --threads)
      (($# >= 2)) || die "--threads needs a number"
      threads="$2"
      shift 2
      ;;
    --build-only)
      build_only=1
      shift
      ;;
    -h | --help)
      usage
      exit 0
      ;;
    *) die "unknown argument \"$1\" (see --help)" ;;
  esac
done
[[ "$threads" =~ ^[1-9][0-9]*$ ]] || die "--threads \"$threads\": expected a positive integer"

need python3 "it writes the JSON (apt-get install python3)"
need sha256sum "it hashes the model file (apt-get install coreutils)"

cli="$build_dir/bin/tokenfab-cli"
if ((!build_only)); then
  [[ -x "$cli" ]] || die "$cli not found: build Tokenfab first (tools/bootstrap.sh)"
  if [[ -n "$model" && ! -f "$model" ]]; then die "--model $model: no such file"; fi
fi

# --- llama.cpp: llama-bench, built (tools/llamacpp_build.sh) -------------------------------------

llamacpp_build llama-bench
bench_bin="$llamacpp_bin/llama-bench"
sdist_sha256="$llamacpp_sdist_sha256"
llama_commit="$llamacpp_commit"
cmake_flags=("${llamacpp_cmake_flags[@]}")
if ((build_only)); then
  log "llama-bench is ready: $bench_bin"
  exit 0
fi

# --- the benchmarks -----------------------------------------------------------------------------

if [[ -z "$model" ]]; then
  log "finding the embedded model (tokenfab-cli fetch; downloads it when absent)"
  model="$("$cli" fetch)" || die "tokenfab-cli fetch failed; pass --model PATH"
fi
[[ -f "$model" ]] || die "model file $model not found"
model="$(cd "$(dirname "$model")" && pwd)/$(basename "$model")"
model_sha256="$(sha256sum "$model" | cut -d' ' -f1)"

tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

llama_cmd=("$bench_bin" -m "$model" -t "$threads" -p "$prompt_tokens" -n "$gen_tokens"
  -r "$repetitions" -o json)
tokenfab_cmd=("$cli" bench --model "$model" --threads "$threads" --prompt-tokens "$prompt_tokens"
  --gen-tokens "$gen_tokens" --repetitions "$repetitions" --json)

log "llama.cpp: ${llama_cmd[*]}"
"${llama_cmd[@]}" >"$tmp/llama.json" || die "llama-bench failed (see above)"
log "Tokenfab: ${tokenfab_cmd[*]}"
"${tokenfab_cmd[@]}" >"$tmp/tokenfab.json" || die "tokenfab-cli bench failed (see above)"

python3 - "$tmp/llama.json" "$tmp/tokenfab.json" "$model" "$model_sha256" "$threads" \
  "$llama_cpp_python_version" "$sdist_sha256" "$llama_commit" "$prompt_tokens" "$gen_tokens" \
  "$(printf '%q ' "${llama_cmd[@]}")" "$(printf '%q ' "${tokenfab_cmd[@]}")" \
  "$(printf '%s\n' "${cmake_flags[@]}")" <<'PY'
import datetime, json, sys

(llama_path, tokenfab_path, model, model_sha256, threads, version, sdist_sha256, commit,
 prompt_tokens, gen_tokens, llama_command, tokenfab_command, cmake_flags) = sys.argv[1:]
prompt_tokens, gen_tokens = int(prompt_tokens), int(gen_tokens)

def fail(message):
    sys.exit("compare_llamacpp: error: " + message)

try:
    llama = json.load(open(llama_path))
    tokenfab = json.load(open(tokenfab_path))
except ValueError as e:
    fail(f"a benchmark did not print JSON: {e}")

def llama_test(n_prompt, n_gen):
    for t in llama:
        if t.get("n_prompt") == n_prompt and t.get("n_gen") == n_gen and not t.get("n_depth"):
            return {"avg": t["avg_ts"], "stddev": t["stddev_ts"], "samples": t.get("samples_ts")}
    fail(f"llama-bench printed no test with n_prompt={n_prompt}, n_gen={n_gen}")

pp = llama_test(prompt_tokens, 0)
tg = llama_test(0, gen_tokens)
cpu = None
with open("/proc/cpuinfo") as f:
    for line in f:
        if line.startswith("model name"):
            cpu = line.split(":", 1)[1].strip()
            break

report = {
    "model": model,
    "model_sha256": model_sha256,
    "threads": int(threads),
    "cpu": cpu,
    "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    "llama_cpp": {
        "llama_cpp_python": version,
        "sdist_sha256": sdist_sha256,
        "commit": commit or None,
        "build_commit": llama[0].get("build_commit"),
        "build_number": llama[0].get("build_number"),
        f"pp{prompt_tokens}_tok_s": pp,
        f"tg{gen_tokens}_tok_s": tg,
        "cmake_flags": cmake_flags.splitlines(),
        "command": llama_command.strip(),
    },
    "tokenfab": {
        "prefill_tok_s": tokenfab["prefill_tok_s"],
        "decode_tok_s": tokenfab["decode_tok_s"],
        "prefill_tok_s_runs": tokenfab.get("prefill_tok_s_runs"),
        "decode_tok_s_runs": tokenfab.get("decode_tok_s_runs"),
        "statistic": "median",
        "command": tokenfab_command.strip(),
    },
    "ratio": {
        "prefill": round(tokenfab["prefill_tok_s"] / pp["avg"], 3),
        "decode": round(tokenfab["decode_tok_s"] / tg["avg"], 3),
    },
}
print(json.dumps(report))
PY
