#!/usr/bin/env bash
# Sets everything up (tools/bootstrap.sh) and starts the Tokenfab desktop app on the default
# model. Extra arguments go to `tokenfab` (e.g. --model PATH, --devices cpu:0,cpu:1).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$root/tools/bootstrap.sh"
exec "${TOKENFAB_BUILD_DIR:-$root/build}/bin/tokenfab" "$@"
