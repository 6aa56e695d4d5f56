#!/usr/bin/env bash
# Reproduces the README's comparison with llama.cpp: the same GGUF file, the same thread count,
# the same machine, llama.cpp's `llama-bench -p 512 -n 128 -r 3` against `tokenfab-cli bench
# --prompt-tokens 512 --gen-tokens 128 --repetitions 3`.
#
# llama.cpp is the copy that the llama-cpp-python sdist vendors (vendor/llama.cpp), downloaded
# from PyPI and checked against the SHA-256 that PyPI's JSON API gives for it, then built with
# CMake (Release, GGML_NATIVE=ON without AMX: see below; CPU only; the llama-bench target alone)
# in build-llamacpp/ (git-ignored: none of llama.cpp's code is part of this repository). Steps
# already done are skipped, so a second run only benchmarks. Tokenfab itself must already be built
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
work_dir="${LLAMACPP_WORK_DIR:-$root/build-llamacpp}"
# The README's figures came from the llama.cpp that this release vendors.
llama_cpp_python_version="${LLAMA_CPP_PYTHON_VERSION:-0.3.36}"
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

need python3 "it downloads the sdist and writes the JSON (apt-get install python3)"
need cmake "it builds llama.cpp (apt-get install cmake)"
need c++ "llama.cpp needs a C++ compiler (apt-get install build-essential)"
need tar "it unpacks the sdist (apt-get install tar)"
need sha256sum "it hashes the model file (apt-get install coreutils)"

cli="$build_dir/bin/tokenfab-cli"
if ((!build_only)); then
  [[ -x "$cli" ]] || die "$cli not found: build Tokenfab first (tools/bootstrap.sh)"
  if [[ -n "$model" && ! -f "$model" ]]; then die "--model $model: no such file"; fi
fi

# --- llama.cpp: the sdist, verified, unpacked -------------------------------------------------

src_dir="$work_dir/llama_cpp_python-$llama_cpp_python_version"
llama_src="$src_dir/vendor/llama.cpp"
llama_build="$work_dir/build-$llama_cpp_python_version"
bench_bin="$llama_build/bin/llama-bench"
tarball="$work_dir/llama_cpp_python-$llama_cpp_python_version.tar.gz"
unpacked_stamp="$src_dir/.tokenfab-unpacked" # holds the verified sdist's SHA-256

# Downloads the sdist to $2 and prints its SHA-256, after checking it against the digest PyPI's
# JSON API states for that file.
download_sdist() {
  python3 - "$1" "$2" <<'PY'
import hashlib, json, os, sys, urllib.parse, urllib.request

version, dest = sys.argv[1], sys.argv[2]
def fail(message):
    sys.exit("compare_llamacpp: error: " + message)

def read_json(url):
    with urllib.request.urlopen(url, timeout=60) as response:
        return json.load(response)

# The release's own document, else the project's (whose "releases" lists every version's files).
api = f"https://pypi.org/pypi/llama-cpp-python/{version}/json"
try:
    files = read_json(api)["urls"]
except Exception:
    api = "https://pypi.org/pypi/llama-cpp-python/json"
    try:
        releases = read_json(api)["releases"]
    except Exception as e:
        fail(f"cannot read PyPI's JSON API ({api}): {e}")
    if version not in releases:
        fail(f"llama-cpp-python {version} is not on PyPI")
    files = releases[version]
sdists = [f for f in files if f.get("packagetype") == "sdist"]
if not sdists:
    fail(f"PyPI lists no sdist for llama-cpp-python {version}")
sdist = sdists[0]
url = urllib.parse.urljoin(api, sdist["url"])
expected = sdist["digests"]["sha256"]
print(f"compare_llamacpp: downloading {sdist['filename']} "
      f"({sdist.get('size', 0) / 1e6:.0f} MB) from {url}", file=sys.stderr)
part = dest + ".part"
digest = hashlib.sha256()
try:
    with urllib.request.urlopen(url, timeout=120) as response, open(part, "wb") as out:
        while chunk := response.read(1 << 20):
            digest.update(chunk)
            out.write(chunk)
except Exception as e:
    fail(f"downloading {url} failed: {e}")
if digest.hexdigest() != expected:
    os.remove(part)
    fail(f"{sdist['filename']}: SHA-256 {digest.hexdigest()}, but PyPI states {expected}")
os.replace(part, dest)
print(expected)
PY
}

mkdir -p "$work_dir"
if [[ -f "$unpacked_stamp" ]]; then
  sdist_sha256="$(cat "$unpacked_stamp")"
  log "llama-cpp-python $llama_cpp_python_version already unpacked in $src_dir"
else
  sdist_sha256="$(download_sdist "$llama_cpp_python_version" "$tarball")" ||
    die "could not get the llama-cpp-python $llama_cpp_python_version sdist (see above)"
  log "sdist verified (sha256 $sdist_sha256); unpacking into $src_dir"
  rm -rf "$src_dir"
  mkdir -p "$src_dir"
  tar -xzf "$tarball" -C "$src_dir" --strip-components=1 || die "unpacking $tarball failed"
  [[ -f "$llama_src/CMakeLists.txt" ]] ||
    die "the sdist has no vendor/llama.cpp/CMakeLists.txt: not the layout this script knows"
  echo "$sdist_sha256" >"$unpacked_stamp"
  rm -f "$tarball"
fi

# The llama.cpp commit the release pinned: its submodule's HEAD, which the sdist carries.
llama_commit=""
submodule_head="$src_dir/.git/modules/vendor/llama.cpp/HEAD"
if [[ -f "$submodule_head" ]] && grep -Eqx '[0-9a-f]{40}' "$submodule_head"; then
  llama_commit="$(cat "$submodule_head")"
fi

# --- llama.cpp: llama-bench, built --------------------------------------------------------------

# CPU only, Release, for this CPU (-march=native), and only what llama-bench needs.
cmake_flags=(-DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DGGML_CUDA=OFF -DBUILD_SHARED_LIBS=OFF
  -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF
  -DLLAMA_OPENSSL=OFF -DLLAMA_CURL=OFF)
# Without AMX: on a CPU that has it, -march=native compiles ggml's AMX matmuls, and in this
# llama.cpp GCC drops the stores that fill their on-stack tile configuration (only palette_id
# survives: seen with GCC 12, llama-cpp-python 0.3.36, on a Xeon with amx_int8), so the first
# tile instruction raises SIGILL. Those kernels cannot run, so they are left out; every other
# feature -march=native enables stays. On a CPU without AMX these flags change nothing.
cmake_flags+=("-DCMAKE_C_FLAGS=-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
  "-DCMAKE_CXX_FLAGS=-mno-amx-tile -mno-amx-int8 -mno-amx-bf16")
flags_stamp="$llama_build/.tokenfab-cmake-flags"
if [[ ! -f "$llama_build/CMakeCache.txt" || "$(cat "$flags_stamp" 2>/dev/null)" != "${cmake_flags[*]}" ]]; then
  generator=()
  if [[ ! -f "$llama_build/CMakeCache.txt" ]] && command -v ninja >/dev/null 2>&1; then
    generator=(-G Ninja)
  fi
  log "configuring llama.cpp${llama_commit:+ ${llama_commit:0:12}} in $llama_build"
  rm -f "$flags_stamp"
  cmake -S "$llama_src" -B "$llama_build" "${generator[@]}" "${cmake_flags[@]}" >&2 ||
    die "configuring llama.cpp failed (see above)"
  echo "${cmake_flags[*]}" >"$flags_stamp"
fi
log "building llama-bench (the first time takes minutes)"
cmake --build "$llama_build" --target llama-bench -j "$(nproc)" >&2 ||
  die "building llama-bench failed (see above)"
[[ -x "$bench_bin" ]] || die "the build finished but $bench_bin is missing"
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
