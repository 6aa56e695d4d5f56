#!/usr/bin/env bash
# llama.cpp, built by hand for comparisons with Tokenfab: the copy that the llama-cpp-python sdist
# vendors (vendor/llama.cpp), downloaded from PyPI and checked against the SHA-256 that PyPI's JSON
# API gives for it, then built with CMake (Release, GGML_NATIVE=ON without AMX: see below; CPU
# only) in build-llamacpp/ (git-ignored: none of llama.cpp's code is part of this repository).
# Steps already done are skipped: a later call only builds targets that are missing or stale.
#
# Run it:     tools/llamacpp_build.sh TARGET…   builds those targets (e.g. llama-bench
#             llama-quantize llama-perplexity llama-completion llama-server) and prints the bin
#             folder
# Source it:  source tools/llamacpp_build.sh; llamacpp_build TARGET…
#             then $llamacpp_bin is the bin folder, and $llamacpp_python_version,
#             $llamacpp_sdist_sha256, $llamacpp_commit (may be empty) and the array
#             $llamacpp_cmake_flags describe what was built. Errors exit the calling script.
# Progress and the build's log go to stderr.
#
# Environment:
#   LLAMA_CPP_PYTHON_VERSION  llama-cpp-python release whose llama.cpp is built (default 0.3.36)
#   LLAMACPP_WORK_DIR         where the sdist is unpacked and built (default: build-llamacpp/)

llamacpp_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
llamacpp_work_dir="${LLAMACPP_WORK_DIR:-$llamacpp_root/build-llamacpp}"
# The README's figures came from the llama.cpp that this release vendors.
llamacpp_python_version="${LLAMA_CPP_PYTHON_VERSION:-0.3.36}"
llamacpp_src_dir="$llamacpp_work_dir/llama_cpp_python-$llamacpp_python_version"
llamacpp_src="$llamacpp_src_dir/vendor/llama.cpp"
llamacpp_build_dir="$llamacpp_work_dir/build-$llamacpp_python_version"
llamacpp_bin="$llamacpp_build_dir/bin"
llamacpp_sdist_sha256=""
llamacpp_commit=""

# CPU only, Release, for this CPU (-march=native); the tools and llama-server (no examples, tests
# or unified app). In this llama.cpp the server is a tool: tools/CMakeLists.txt adds tools/server
# (and tools/ui, tools/cli) only when LLAMA_BUILD_SERVER is on, inside LLAMA_BUILD_TOOLS (on by
# default). Its web UI is left empty: LLAMA_BUILD_UI off (no npm build) and LLAMA_USE_PREBUILT_UI
# off (no download of prebuilt assets from a Hugging Face bucket at build time); the HTTP API
# works without it. No HTTPS (LLAMA_OPENSSL off) and no model downloads (LLAMA_CURL off). None of
# these options changes ggml's compile flags, so switching them keeps a built ggml.
llamacpp_cmake_flags=(-DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DGGML_CUDA=OFF
  -DBUILD_SHARED_LIBS=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF
  -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF
  -DLLAMA_BUILD_APP=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_CURL=OFF)
# Without AMX: on a CPU that has it, -march=native compiles ggml's AMX matmuls, and in this
# llama.cpp GCC drops the stores that fill their on-stack tile configuration (only palette_id
# survives: seen with GCC 12, llama-cpp-python 0.3.36, on a Xeon with amx_int8), so the first
# tile instruction raises SIGILL. Those kernels cannot run, so they are left out; every other
# feature -march=native enables stays. On a CPU without AMX these flags change nothing.
llamacpp_cmake_flags+=("-DCMAKE_C_FLAGS=-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
  "-DCMAKE_CXX_FLAGS=-mno-amx-tile -mno-amx-int8 -mno-amx-bf16")

llamacpp_log() { echo "llamacpp_build: $*" >&2; }
llamacpp_die() {
  echo "llamacpp_build: error: $*" >&2
  exit 1
}
llamacpp_need() { command -v "$1" >/dev/null 2>&1 || llamacpp_die "$1 not found; $2"; }

# Downloads the sdist of release $1 to $2 and prints its SHA-256, after checking it against the
# digest PyPI's JSON API states for that file.
llamacpp_download_sdist() {
  python3 - "$1" "$2" <<'PY'
import hashlib, json, os, sys, urllib.parse, urllib.request

version, dest = sys.argv[1], sys.argv[2]
def fail(message):
    sys.exit("llamacpp_build: error: " + message)

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
print(f"llamacpp_build: downloading {sdist['filename']} "
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

# The sdist, verified and unpacked into $llamacpp_src_dir (once); sets $llamacpp_sdist_sha256
# and $llamacpp_commit.
llamacpp_unpack() {
  local tarball="$llamacpp_work_dir/llama_cpp_python-$llamacpp_python_version.tar.gz"
  local stamp="$llamacpp_src_dir/.tokenfab-unpacked" # holds the verified sdist's SHA-256
  mkdir -p "$llamacpp_work_dir"
  if [[ -f "$stamp" ]]; then
    llamacpp_sdist_sha256="$(cat "$stamp")"
    llamacpp_log "llama-cpp-python $llamacpp_python_version already unpacked in $llamacpp_src_dir"
  else
    llamacpp_sdist_sha256="$(llamacpp_download_sdist "$llamacpp_python_version" "$tarball")" ||
      llamacpp_die "could not get the llama-cpp-python $llamacpp_python_version sdist (see above)"
    llamacpp_log "sdist verified (sha256 $llamacpp_sdist_sha256); unpacking into $llamacpp_src_dir"
    rm -rf "$llamacpp_src_dir"
    mkdir -p "$llamacpp_src_dir"
    tar -xzf "$tarball" -C "$llamacpp_src_dir" --strip-components=1 ||
      llamacpp_die "unpacking $tarball failed"
    [[ -f "$llamacpp_src/CMakeLists.txt" ]] ||
      llamacpp_die "the sdist has no vendor/llama.cpp/CMakeLists.txt: not the layout this script knows"
    echo "$llamacpp_sdist_sha256" >"$stamp"
    rm -f "$tarball"
  fi
  # The llama.cpp commit the release pinned: its submodule's HEAD, which the sdist carries.
  local head="$llamacpp_src_dir/.git/modules/vendor/llama.cpp/HEAD"
  if [[ -f "$head" ]] && grep -Eqx '[0-9a-f]{40}' "$head"; then
    llamacpp_commit="$(cat "$head")"
  fi
}

# Configures $llamacpp_build_dir with $llamacpp_cmake_flags (again only when they changed).
llamacpp_configure() {
  local stamp="$llamacpp_build_dir/.tokenfab-cmake-flags"
  if [[ -f "$llamacpp_build_dir/CMakeCache.txt" &&
    "$(cat "$stamp" 2>/dev/null)" == "${llamacpp_cmake_flags[*]}" ]]; then
    return
  fi
  local generator=()
  if [[ ! -f "$llamacpp_build_dir/CMakeCache.txt" ]] && command -v ninja >/dev/null 2>&1; then
    generator=(-G Ninja)
  fi
  llamacpp_log "configuring llama.cpp${llamacpp_commit:+ ${llamacpp_commit:0:12}} in $llamacpp_build_dir"
  rm -f "$stamp"
  cmake -S "$llamacpp_src" -B "$llamacpp_build_dir" "${generator[@]}" "${llamacpp_cmake_flags[@]}" >&2 ||
    llamacpp_die "configuring llama.cpp failed (see above)"
  echo "${llamacpp_cmake_flags[*]}" >"$stamp"
}

# Builds llama.cpp targets (at low priority: the first build takes minutes on a few cores).
llamacpp_build() {
  (($#)) || llamacpp_die "llamacpp_build: name at least one target (e.g. llama-bench, llama-server)"
  llamacpp_need python3 "it downloads the sdist (apt-get install python3)"
  llamacpp_need cmake "it builds llama.cpp (apt-get install cmake)"
  llamacpp_need c++ "llama.cpp needs a C++ compiler (apt-get install build-essential)"
  llamacpp_need tar "it unpacks the sdist (apt-get install tar)"
  llamacpp_unpack
  llamacpp_configure
  llamacpp_log "building $* (the first time takes minutes)"
  nice -n 10 cmake --build "$llamacpp_build_dir" --target "$@" -j "$(nproc)" >&2 ||
    llamacpp_die "building $* failed (see above)"
  local target
  for target in "$@"; do
    [[ -x "$llamacpp_bin/$target" ]] ||
      llamacpp_die "the build finished but $llamacpp_bin/$target is missing"
  done
}

if [[ "${BASH_SOURCE[0]}" == "$0" ]]; then
  set -euo pipefail
  llamacpp_usage() {
    cat <<EOF
Usage: tools/llamacpp_build.sh TARGET…

Builds llama.cpp targets (e.g. llama-bench llama-quantize llama-perplexity llama-completion
llama-server) from the llama-cpp-python ${llamacpp_python_version} sdist (downloaded from PyPI
and checked against its SHA-256 on the first run) in ${llamacpp_build_dir},
and prints the folder that holds the binaries. Progress goes to stderr.
EOF
  }
  case "${1:-}" in
    -h | --help)
      llamacpp_usage
      exit 0
      ;;
    "")
      llamacpp_usage >&2
      exit 2
      ;;
  esac
  llamacpp_build "$@"
  echo "$llamacpp_bin"
fi
