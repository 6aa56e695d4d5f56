#!/usr/bin/env bash
# GPU machine, from the repository root: the GPU time of a window of kernel launches of one
# tokenfab-cli command, measured by Nsight Compute (ncu, gpu__time_duration per kernel, clocks
# left alone), summed per kernel and grid size and printed as ONE JSON object on stdout:
#   {"command":…,"skip":…,"count":…,"launches":…,"total_us":…,
#    "kernels":[{"name":…,"calls":…,"total_us":…,"mean_us":…,"share":…}, …]}   (largest first)
# Usage: tools/gpu_profile.sh [--skip N] [--count N] -- TOKENFAB-CLI ARGUMENTS…
#   --skip N   launches to let run unprofiled first (default 20000: past a warm-up)
#   --count N  launches to profile (default 500: about one decode step of a 30-layer model)
# Uses gpu-bundle/ like tools/gpu_check.sh. ncu replays each profiled kernel, so keep the window
# small; the kernels of CUDA graphs are profiled one by one.
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
skip=20000
count=500
while [ $# -gt 0 ]; do
  case "$1" in
    --skip) skip="$2"; shift 2 ;;
    --count) count="$2"; shift 2 ;;
    --) shift; break ;;
    *) echo "gpu_profile: unknown option $1 (usage: --skip N --count N -- ARGS…)" >&2; exit 2 ;;
  esac
done
[ $# -gt 0 ] || { echo "gpu_profile: no tokenfab-cli arguments after --" >&2; exit 2; }
# shellcheck source=tools/gpu_env.sh
. "$root/tools/gpu_env.sh" || { echo "gpu_profile: $gpu_env_error" >&2; exit 1; }
ncu="$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -n 1)"
[ -n "$ncu" ] || { echo "gpu_profile: Nsight Compute (ncu) is not installed here" >&2; exit 1; }
csv="$(mktemp)"
"$ncu" --clock-control none --metrics gpu__time_duration.sum --launch-skip "$skip" \
  --launch-count "$count" --print-kernel-base function --csv --page raw \
  "$bundle_bin/tokenfab-cli" "$@" >"$csv" 2>"$csv.err"
rc=$?
if [ "$rc" -ne 0 ]; then
  echo "gpu_profile: ncu exited $rc" >&2
  tail -c 3000 "$csv.err" >&2
  tail -c 3000 "$csv" >&2
  exit 1
fi
python3 - "$csv" "$skip" "$count" "$*" <<'PY'
import csv, json, sys
path, skip, count, command = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
rows = list(csv.reader(line for line in open(path) if line.startswith('"')))
header = next(r for r in rows if "Kernel Name" in r)
name_col, time_col = header.index("Kernel Name"), header.index("gpu__time_duration.sum")
grid_col = header.index("Grid Size") if "Grid Size" in header else None
scale = {"nsecond": 1e-3, "ns": 1e-3, "usecond": 1.0, "us": 1.0, "msecond": 1e3, "ms": 1e3}
unit = 1e-3
kernels = {}
launches = 0
for r in rows[rows.index(header) + 1:]:
    if len(r) <= time_col:
        continue
    if r[time_col] in scale:  # the units row
        unit = scale[r[time_col]]
        continue
    try:
        t = float(r[time_col].replace(",", "")) * unit
    except ValueError:
        continue
    name = r[name_col] + (" grid " + r[grid_col] if grid_col is not None else "")
    k = kernels.setdefault(name, [0, 0.0])
    k[0] += 1
    k[1] += t
    launches += 1
total = sum(v[1] for v in kernels.values())
out = [{"name": n, "calls": c, "total_us": round(t, 3), "mean_us": round(t / c, 3),
        "share": round(t / total, 4) if total else 0}
       for n, (c, t) in sorted(kernels.items(), key=lambda kv: -kv[1][1])]
print(json.dumps({"command": command, "skip": skip, "count": count, "launches": launches,
                  "total_us": round(total, 3), "kernels": out}))
PY
