#!/usr/bin/env bash
# Build machine: builds Release with CUDA (x86-64, sm_90) into build-gpu/, then gathers what a GPU
# machine needs to run the GPU checks (tools/gpu_check.sh) into gpu-bundle/ (git-ignored):
#   gpu-bundle/bin.tar.gz   the `gpu`-labelled test executables and tokenfab-cli, stripped (gzip:
#                           their device code more than halves)
#   gpu-bundle/lib.tar.gz   every shared library they load that a bare Ubuntu/Debian with the
#                           NVIDIA driver and the CUDA toolkit lacks (Qt, ICU, spdlog, fmt, SQLite,
#                           xxHash, OpenSSL, …), stripped; gzip, because ICU's data alone is 31 MB
#   gpu-bundle/MANIFEST.txt the commit, each file and where it came from
# Left out, as present on any such machine: the C library family (libc, libm, libdl, libpthread,
# librt, ld-linux), libstdc++ and libgcc_s, the driver's libcuda, and cuBLAS (libcublasLt alone
# is ~500 MB; the CUDA toolkit there provides it). The CUDA runtime is linked statically.
# The working tree plus this folder must fit the ~64 MiB that reaches a GPU machine: the total is
# printed, and the script fails above 48 MiB.
# Usage: tools/gpu_package.sh [--model-parts [--head FILE]]
#   JOBS=N        parallel build jobs (default 2)
#   BUILD_DIR=DIR take the binaries from an existing CUDA build folder configured for sm_90
#                 instead of building build-gpu/
#   --model-parts also writes gpu-model/ (git-ignored): the embedded model from the user cache,
#                 checked against its pinned sha256, cut in two parts that each fit one call
#                 (part-1, part-2, SHA256), so that tools/gpu_check.sh can run the real-model
#                 tests and benchmarks there; the three calls that carry it are printed at the end
#   --head FILE   with --model-parts: a draft head of that model, as gpu-model/head.gguf, for the
#                 check's decode with and without a head
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
model_parts=0
head_file=""
while [ $# -gt 0 ]; do
  case "$1" in
    --model-parts) model_parts=1; shift ;;
    --head)
      [ $# -ge 2 ] || { echo "gpu_package: --head needs a file" >&2; exit 2; }
      head_file="$2"; shift 2 ;;
    *) echo "gpu_package: unknown argument $1 (usage: [--model-parts [--head FILE]])" >&2; exit 2 ;;
  esac
done
if [ -n "$head_file" ] && [ "$model_parts" = 0 ]; then
  echo "gpu_package: --head goes with --model-parts (a head needs its model there)" >&2
  exit 2
fi
if [ -n "$head_file" ] && [ ! -f "$head_file" ]; then
  echo "gpu_package: no head file $head_file" >&2
  exit 2
fi
build="${BUILD_DIR:-build-gpu}"
bundle=gpu-bundle
limit_bytes=$((48 * 1024 * 1024))

if [ -z "${BUILD_DIR:-}" ]; then
  cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DTOKENFAB_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
    -DTOKENFAB_GUI=OFF -DTOKENFAB_TESTS=ON >/dev/null
elif ! grep -q '^TOKENFAB_CUDA:BOOL=ON' "$build/CMakeCache.txt" 2>/dev/null; then
  echo "gpu_package: $build is not a configured build folder with TOKENFAB_CUDA=ON" >&2
  exit 1
fi
# The gpu-labelled tests, as CTest knows them after configuring.
mapfile -t gpu_tests < <(ctest --test-dir "$build" -N -L gpu | sed -n 's/^ *Test *#[0-9]*: *//p')
if [ "${#gpu_tests[@]}" -eq 0 ]; then
  echo "gpu_package: no test labelled gpu in $build (is TOKENFAB_CUDA on?)" >&2
  exit 1
fi
cmake --build "$build" -j"${JOBS:-2}" --target tokenfab-cli "${gpu_tests[@]}"

# Whether a library (by soname) is one the GPU machine already has.
is_system_library() {
  case "$1" in
    linux-vdso.so.* | ld-linux*.so.* | libc.so.* | libm.so.* | libdl.so.* | libpthread.so.* | \
      librt.so.* | libresolv.so.* | libutil.so.* | libstdc++.so.* | libgcc_s.so.* | \
      libcuda.so.* | libnvidia-*.so* | libcublas.so.* | libcublasLt.so.*)
      return 0 ;;
  esac
  return 1
}

rm -rf "$bundle"
mkdir -p "$bundle"
staging="$(mktemp -d)"
trap 'rm -rf "$staging"' EXIT
mkdir -p "$staging/lib" "$staging/bin"
{
  echo "tokenfab GPU bundle, built $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(uname -m)"
  echo "commit $(git rev-parse HEAD 2>/dev/null || echo unknown)$(git diff --quiet HEAD 2>/dev/null || echo ' (with uncommitted changes)')"
  echo "CUDA $(nvcc --version | sed -n 's/.*release \([0-9.]*\).*/\1/p'), architectures sm_90"
  echo "binaries:"
} >"$bundle/MANIFEST.txt"

for exe in tokenfab-cli "${gpu_tests[@]}"; do
  strip --strip-unneeded -o "$staging/bin/$exe" "$build/bin/$exe"
  echo "  bin/$exe" >>"$bundle/MANIFEST.txt"
done

echo "libraries (lib.tar.gz):" >>"$bundle/MANIFEST.txt"
# ldd lists the whole dependency closure of each binary; one copy of each library by soname.
declare -A seen=()
for exe in tokenfab-cli "${gpu_tests[@]}"; do
  while read -r soname path; do
    if [ "$path" = "not" ]; then
      echo "gpu_package: $exe needs $soname, which ldd cannot find here" >&2
      exit 1
    fi
    is_system_library "$soname" && continue
    [ -n "${seen[$soname]:-}" ] && continue
    seen[$soname]=1
    strip --strip-unneeded -o "$staging/lib/$soname" "$(readlink -f "$path")"
    echo "  $soname <- $path" >>"$bundle/MANIFEST.txt"
  done < <(ldd "$build/bin/$exe" | awk '$2 == "=>" { print $1, $3 }')
done
tar -C "$staging" -czf "$bundle/lib.tar.gz" lib
tar -C "$staging" -czf "$bundle/bin.tar.gz" bin

total=$(du -sb "$bundle" | cut -f1)
tree=$(git ls-files -z --cached --others --exclude-standard | xargs -0 du -cb 2>/dev/null | tail -1 | cut -f1)
echo "bundle $(du -sb "$bundle/bin.tar.gz" | cut -f1) bytes of binaries ($(du -sb "$staging/bin" | cut -f1) unpacked), $(du -sb "$bundle/lib.tar.gz" | cut -f1) bytes of libraries ($(du -sb "$staging/lib" | cut -f1) unpacked, ${#seen[@]} files)" >&2
echo "gpu-bundle: $total bytes ($((total / 1024 / 1024)) MiB); with the working tree ($tree bytes): $(((total + tree) / 1024 / 1024)) MiB of the 64 MiB that travel" >&2
echo "total $total bytes" >>"$bundle/MANIFEST.txt"
if [ "$total" -gt "$limit_bytes" ]; then
  echo "gpu_package: the bundle is over $((limit_bytes / 1024 / 1024)) MiB" >&2
  exit 1
fi

[ "$model_parts" = 1 ] || exit 0
# The embedded model where the CLI keeps it (core/model/model_files: TOKENFAB_HOME, else the XDG
# cache), checked against the hash tools/fetch_model.py pins, then cut in two halves.
model="${TOKENFAB_HOME:+$TOKENFAB_HOME/models}"
model="${model:-${XDG_CACHE_HOME:-$HOME/.cache}/tokenfab/models}/SmolLM2-135M-Instruct.Q4_1.gguf"
pinned="$(sed -n 's/^SHA256 = "\([0-9a-f]*\)"$/\1/p' tools/fetch_model.py)"
if [ ! -f "$model" ]; then
  echo "gpu_package: the embedded model is not at $model (tokenfab-cli fetch)" >&2
  exit 1
fi
if [ "$(sha256sum "$model" | cut -d' ' -f1)" != "$pinned" ]; then
  echo "gpu_package: $model does not have the pinned sha256 $pinned" >&2
  exit 1
fi
rm -rf gpu-model
mkdir gpu-model
# Two halves: each travels with the working tree (the second with the head too), so each must
# leave room for them (58 MiB parts once left 2.5 KB to spare with a 6 MiB tree).
model_bytes=$(stat -c %s "$model")
part1_bytes=$(((model_bytes + 1) / 2))
travel_limit=$((63 * 1024 * 1024))
head_bytes=0
[ -n "$head_file" ] && head_bytes=$(stat -c %s "$head_file")
if [ $((part1_bytes + head_bytes + tree)) -gt "$travel_limit" ]; then
  echo "gpu_package: half the model ($part1_bytes bytes), the head ($head_bytes bytes) and the working tree ($tree bytes) exceed 63 MiB" >&2
  exit 1
fi
head -c "$part1_bytes" "$model" >gpu-model/part-1
tail -c +"$((part1_bytes + 1))" "$model" >gpu-model/part-2
echo "$pinned" >gpu-model/SHA256
second='"gpu-model/part-2", "gpu-model/SHA256"'
if [ -n "$head_file" ]; then
  cp "$head_file" gpu-model/head.gguf
  second="$second, \"gpu-model/head.gguf\""
fi
cat >&2 <<EOT
gpu-model: the embedded model in two parts ($(du -b gpu-model/part-1 | cut -f1) + $(du -b gpu-model/part-2 | cut -f1) bytes)$([ -n "$head_file" ] && echo " and a head")
One call carries at most 64 MiB, and a warm GPU machine keeps ignored files between calls (for
30 s after each), so send them in three calls, each right after the last:
  1. carry ["gpu-model/part-1"], command: true
  2. carry [$second], command: true
  3. carry ["gpu-bundle"], command: tools/gpu_check.sh
EOT
