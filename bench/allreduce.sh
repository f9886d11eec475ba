#!/usr/bin/env bash
# All-reduce bus bandwidth: the Gloo communicator (bench/allreduce_bench.cc) against
# torch.distributed with the Gloo backend, 2 processes on this machine, rank r pinned to CPU r.
# With p2p: the point-to-point round trip instead (what a pipeline's stages send each other: our
# SendAsync and Recv against dist.isend and dist.recv).
# Usage: bench/allreduce.sh BUILD_DIR [SECONDS_PER_SIZE] [p2p]
# Prints a markdown table: size, both bandwidths in GB/s (for p2p, also the round trip in
# microseconds), and ours / torch.
set -euo pipefail
build=${1:?usage: allreduce.sh BUILD_DIR [SECONDS_PER_SIZE] [p2p]}
[ -x "$build/bin/allreduce_bench" ] ||
  { echo "build it first: cmake --build $build --target allreduce_bench" >&2; exit 1; }
budget=${2:-2}
mode=${3:-allreduce}
case "$mode" in
  allreduce) flags=() ;;
  p2p) flags=(--point_to_point) ;;
  *) echo "allreduce.sh: the third argument is p2p or nothing, got '$mode'" >&2; exit 2 ;;
esac
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
    --seconds_per_size="$budget" "${flags[@]}" >/dev/null 2>&1 &
  pin 0 "$build/bin/allreduce_bench" --rank=0 --world=2 --dir="$work/ours$round" \
    --seconds_per_size="$budget" "${flags[@]}" 2>/dev/null >>"$work/ours.jsonl"
  wait
  pin 1 "$python" "$here/allreduce_torch.py" 1 2 "$work/torch$round" 4096 268435456 "$budget" \
    "$mode" >/dev/null &
  pin 0 "$python" "$here/allreduce_torch.py" 0 2 "$work/torch$round" 4096 268435456 "$budget" \
    "$mode" >>"$work/torch.jsonl"
  wait
done
"$python" - "$work/ours.jsonl" "$work/torch.jsonl" "$mode" <<'PY'
import json, sys
def best(path):
    out = {}
    for r in map(json.loads, open(path)):
        if r["bytes"] not in out or r["gbps"] > out[r["bytes"]]["gbps"]:
            out[r["bytes"]] = r
    return out
ours, torch = best(sys.argv[1]), best(sys.argv[2])
p2p = sys.argv[3] == "p2p"
def size(b):
    return f"{b >> 20} MiB" if b >= 1 << 20 else f"{b >> 10} KiB"
if p2p:
    print("| size | Trainyard round trip (us) | GB/s | torch.distributed round trip (us) | GB/s | ratio |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: |")
else:
    print("| size | Trainyard Gloo (GB/s) | torch.distributed Gloo (GB/s) | ratio |")
    print("| ---: | ---: | ---: | ---: |")
for b in sorted(ours):
    o, t = ours[b], torch[b]
    ratio = o["gbps"] / t["gbps"]
    if p2p:
        print(f"| {size(b)} | {o['seconds_per_iter'] * 1e6:,.0f} | {o['gbps']:.3f} | "
              f"{t['seconds_per_iter'] * 1e6:,.0f} | {t['gbps']:.3f} | {ratio:.2f} |")
    else:
        print(f"| {size(b)} | {o['gbps']:.3f} | {t['gbps']:.3f} | {ratio:.2f} |")
PY
