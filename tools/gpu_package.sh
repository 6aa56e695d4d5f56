#!/usr/bin/env bash
# Build machine: builds Release with CUDA (x86-64, sm_90) into build-gpu/, then gathers what a GPU
# machine needs to run the GPU checks (tools/gpu_check.sh) into gpu-bundle/ (git-ignored):
#   gpu-bundle/bin/         the `gpu`-labelled test executables and tokenfab-cli, stripped
#   gpu-bundle/lib.tar.gz   every shared library they load that a bare Ubuntu/Debian with the
#                           NVIDIA driver and the CUDA toolkit lacks (Qt, ICU, spdlog, fmt, SQLite,
#                           xxHash, OpenSSL, …), stripped; gzip, because ICU's data alone is 31 MB
#   gpu-bundle/MANIFEST.txt the commit, each file and where it came from
# Left out, as present on any such machine: the C library family (libc, libm, libdl, libpthread,
# librt, ld-linux), libstdc++ and libgcc_s, the driver's libcuda, and cuBLAS (libcublasLt alone
# is ~500 MB; the CUDA toolkit there provides it). The CUDA runtime is linked statically.
# The working tree plus this folder must fit the ~64 MiB that reaches a GPU machine: the total is
# printed, and the script fails above 48 MiB.
# Usage: tools/gpu_package.sh   (JOBS=N for parallel build jobs, default 2; BUILD_DIR=DIR to take
#        the binaries from an existing CUDA build folder configured for sm_90 instead of build-gpu/)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
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
mkdir -p "$bundle/bin"
staging="$(mktemp -d)"
trap 'rm -rf "$staging"' EXIT
mkdir -p "$staging/lib"
{
  echo "tokenfab GPU bundle, built $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(uname -m)"
  echo "commit $(git rev-parse HEAD 2>/dev/null || echo unknown)$(git diff --quiet HEAD 2>/dev/null || echo ' (with uncommitted changes)')"
  echo "CUDA $(nvcc --version | sed -n 's/.*release \([0-9.]*\).*/\1/p'), architectures sm_90"
  echo "binaries:"
} >"$bundle/MANIFEST.txt"

for exe in tokenfab-cli "${gpu_tests[@]}"; do
  strip --strip-unneeded -o "$bundle/bin/$exe" "$build/bin/$exe"
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

total=$(du -sb "$bundle" | cut -f1)
tree=$(git ls-files -z --cached --others --exclude-standard | xargs -0 du -cb 2>/dev/null | tail -1 | cut -f1)
echo "bundle $(du -sb "$bundle/bin" | cut -f1) bytes of binaries, $(du -sb "$bundle/lib.tar.gz" | cut -f1) bytes of libraries ($(du -sb "$staging/lib" | cut -f1) unpacked, ${#seen[@]} files)" >&2
echo "gpu-bundle: $total bytes ($((total / 1024 / 1024)) MiB); with the working tree ($tree bytes): $(((total + tree) / 1024 / 1024)) MiB of the 64 MiB that travel" >&2
echo "total $total bytes" >>"$bundle/MANIFEST.txt"
if [ "$total" -gt "$limit_bytes" ]; then
  echo "gpu_package: the bundle is over $((limit_bytes / 1024 / 1024)) MiB" >&2
  exit 1
fi
