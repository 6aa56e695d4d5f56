#!/usr/bin/env bash
# Sets everything up (tools/bootstrap.sh), fetches Gemma 3 270M, and runs every test except those
# labelled `gpu`.
# Tests run one at a time: the CPU kernels use all cores, and timings are not asserted.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build_dir="${TOKENFAB_BUILD_DIR:-$root/build}"
"$root/tools/bootstrap.sh"
# The second real model, which the family tests run on (they fail, naming it, when it is absent).
# Running the tests accepts its license, the Gemma Terms of Use (https://ai.google.dev/gemma/terms).
"$build_dir/bin/tokenfab-cli" fetch gemma3-270m --accept-license >/dev/null
cd "$build_dir"
ctest -LE gpu --output-on-failure --timeout 900
