# Sourced by the GPU machine's scripts (tools/gpu_check.sh, tools/gpu_profile.sh) from the
# repository root: unpacks gpu-bundle/bin.tar.gz and lib.tar.gz into a temporary folder (removed
# on exit) and sets LD_LIBRARY_PATH to its libraries and to the CUDA toolkit's cuBLAS(Lt). Sets
# `bundle`, `libs`, `bundle_bin` (the binaries' folder), `cublas_dir`; returns 1, with
# gpu_env_error set, when the bundle is missing or broken.
bundle="$root/gpu-bundle"
gpu_env_error=""
if [ ! -f "$bundle/bin.tar.gz" ] || [ ! -f "$bundle/lib.tar.gz" ]; then
  gpu_env_error="no gpu-bundle/ here: run tools/gpu_package.sh on the build machine and carry gpu-bundle"
  return 1
fi
libs="$(mktemp -d)"
trap 'rm -rf "$libs"' EXIT
if ! tar -C "$libs" -xzf "$bundle/lib.tar.gz" || ! tar -C "$libs" -xzf "$bundle/bin.tar.gz"; then
  gpu_env_error="cannot unpack gpu-bundle/lib.tar.gz and bin.tar.gz"
  return 1
fi
bundle_bin="$libs/bin"

# cuBLAS(Lt) is not in the bundle (~500 MB): the CUDA toolkit's, else a pip-installed copy.
cublas_dir=""
for dir in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib /usr/local/cuda-*/lib64 \
  /usr/lib/x86_64-linux-gnu; do
  if [ -e "$dir/libcublasLt.so.13" ]; then
    cublas_dir="$dir"
    break
  fi
done
if [ -z "$cublas_dir" ]; then
  found="$(find /opt /usr/local /usr/lib -maxdepth 8 -name libcublasLt.so.13 2>/dev/null | head -n 1)"
  [ -n "$found" ] && cublas_dir="$(dirname "$found")"
fi
export LD_LIBRARY_PATH="$libs/lib${cublas_dir:+:$cublas_dir}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export QT_QPA_PLATFORM=offscreen
return 0
