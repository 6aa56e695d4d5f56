#!/usr/bin/env bash
# Sets everything up (tools/bootstrap.sh) and starts Tokenfab: for now the interactive terminal
# chat on the default model. Extra arguments go to `tokenfab-cli chat` (e.g. --model PATH).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$root/tools/bootstrap.sh"
exec "${TOKENFAB_BUILD_DIR:-$root/build}/bin/tokenfab-cli" chat "$@"
