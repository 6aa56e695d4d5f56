#!/usr/bin/env bash
# One-step setup on Debian 12: installs the build and test dependencies (apt, only what is
# missing), configures and builds Tokenfab in ./build (Release; CUDA when nvcc is present), and
# fetches the default model into the user cache when it is absent. Safe to run again: each step
# is skipped when already done.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build_dir="${TOKENFAB_BUILD_DIR:-$root/build}"

packages=(
  build-essential cmake ninja-build pkg-config git
  qt6-base-dev qt6-charts-dev libqt6opengl6-dev libgl-dev
  libspdlog-dev libcli11-dev nlohmann-json3-dev libxxhash-dev libsqlite3-dev libssl-dev
  libcpp-httplib-dev
  python3 python3-pip python3-venv
  xvfb xauth
  help2man lintian desktop-file-utils appstream shared-mime-info
)

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
if ((${#missing[@]})); then
  echo "bootstrap: installing ${missing[*]}" >&2
  sudo_cmd=()
  if [ "$(id -u)" -ne 0 ]; then sudo_cmd=(sudo); fi
  "${sudo_cmd[@]}" apt-get update -qq
  DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2
fi

jobs="$(nproc)"
if [ ! -f "$build_dir/build.ninja" ]; then
  cmake -S "$root" -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=Release >&2
fi
cmake --build "$build_dir" -j "$jobs" >&2

# The default model: fetched once, verified by SHA-256; offline machines get a clear message and
# can still use --model PATH.
if ! "$build_dir/bin/tokenfab-cli" fetch >/dev/null; then
  echo "bootstrap: the default model could not be fetched; pass --model PATH to use your own GGUF file" >&2
  exit 1
fi
