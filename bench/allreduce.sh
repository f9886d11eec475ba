#!/usr/bin/env bash
# All-reduce bus bandwidth: the Gloo communicator (bench/allreduce_bench.cc) against
# torch.distributed with the Gloo backend, 2 processes on this machine, rank r pinned to CPU r.
# Usage: bench/allreduce.sh BUILD_DIR [SECONDS_PER_SIZE]
# Prints a markdown table: size, both bus bandwidths in GB/s, and ours / torch.
set -euo pipefail
build=${1:?usage: allreduce.sh BUILD_DIR [SECONDS_PER_SIZE]}
[ -x "$build/bin/allreduce_bench" ] ||
  { echo "build it first: cmake --build $build --target allreduce_bench" >&2; exit 1; }
budget=${2:-2}
here=$(cd "$(dirname "$0")" && pwd)
python=/usr/bin/python3
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cpus=$(nproc)
pin() { if command -v taskset >/dev/null; then taskset -c $(( $1 % cpus )) "${@:2}"; else "${@:2}"; fi; }

# The machine is shared: the two systems take turns, twice each, and the best run of each size
# counts.
for round in 1 2; do
  mkdir -p "$work/ours$round" "$work/torch$round"
  pin 1 "$build/bin/allreduce_bench" --rank=1 --world=2 --dir="$work/ours$round" \
    --seconds_per_size="$budget" >/dev/null 2>&1 &
  pin 0 "$build/bin/allreduce_bench" --rank=0 --world=2 --dir="$work/ours$round" \
    --seconds_per_size="$budget" 2>/dev/null >>"$work/ours.jsonl"
  wait
  pin 1 "$python" "$here/allreduce_torch.py" 1 2 "$work/torch$round" 4096 268435456 "$budget" \
    >/dev/null &
  pin 0 "$python" "$here/allreduce_torch.py" 0 2 "$work/torch$round" 4096 268435456 "$budget" \
    >>"$work/torch.jsonl"
  wait
done
"$python" - "$work/ours.jsonl" "$work/torch.jsonl" <<'PY'
import json, sys
def best(path):
    out = {}
    for r in map(json.loads, open(path)):
        if r["bytes"] not in out or r["busbw_gbps"] > out[r["bytes"]]["busbw_gbps"]:
            out[r["bytes"]] = r
    return out
ours, torch = best(sys.argv[1]), best(sys.argv[2])
def size(b):
    return f"{b >> 20} MiB" if b >= 1 << 20 else f"{b >> 10} KiB"
print("| size | Trainyard Gloo (GB/s) | torch.distributed Gloo (GB/s) | ratio |")
print("| ---: | ---: | ---: | ---: |")
for b in sorted(ours):
    o, t = ours[b]["busbw_gbps"], torch[b]["busbw_gbps"]
    print(f"| {size(b)} | {o:.3f} | {t:.3f} | {o / t:.2f} |")
PY
