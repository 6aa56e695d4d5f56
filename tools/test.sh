#!/usr/bin/env bash
# Sets everything up (tools/bootstrap.sh) and runs every test except those labelled `gpu`.
# Tests run one at a time: the CPU kernels use all cores, and timings are not asserted.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$root/tools/bootstrap.sh"
cd "${TOKENFAB_BUILD_DIR:-$root/build}"
ctest -LE gpu --output-on-failure --timeout 900
