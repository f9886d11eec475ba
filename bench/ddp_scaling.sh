#!/usr/bin/env bash
# Data-parallel scaling efficiency on this machine: Trainyard (bench/ddp_scaling.cc, real trainer
# processes, overlap on and off) against PyTorch DDP with Gloo (bench/ddp_torch.py), same model,
# global batch and optimizer, one CPU and one thread per rank.
# Usage: bench/ddp_scaling.sh BUILD_DIR [STEPS] [GLOBAL_BATCH] [RUNS]
# Each configuration runs RUNS times (default 3), alternating ours and the peer; the table shows
# the median. Efficiency = samples/s on 2 ranks / (2 * samples/s on 1 rank). "CPU/wall" is rank
# 0's CPU time over its wall time on 1 rank: about 1 when it keeps to its one core.
set -euo pipefail
build=${1:?usage: ddp_scaling.sh BUILD_DIR [STEPS] [GLOBAL_BATCH] [RUNS]}
[ -x "$build/bin/ddp_scaling" ] && [ -x "$build/bin/trainyard-trainer" ] ||
  { echo "build it first: cmake --build $build --target ddp_scaling trainyard-trainer" >&2; exit 1; }
steps=${2:-200}
batch=${3:-64}
runs=${4:-3}
here=$(cd "$(dirname "$0")" && pwd)
python=/usr/bin/python3
results=""
for _ in $(seq "$runs"); do
  results+=$("$build/bin/ddp_scaling" --bin_dir="$build/bin" --steps="$steps" --batch="$batch" \
    2>/dev/null | sed 's/^{/{"system": "ours", /')$'\n'
  for world in 1 2; do
    results+=$("$python" "$here/ddp_torch.py" "$world" "$steps" "$batch" |
      sed 's/^{/{"system": "torch", "overlap": true, /')$'\n'
  done
done
"$python" - "$results" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in sys.argv[1].splitlines() if l.strip()]
def pick(system, world, overlap=True):
    return [r for r in rows if r["system"] == system and r["world"] == world
            and r["overlap"] == overlap]
def rate(system, world, overlap=True):
    return statistics.median(r["samples_per_second"] for r in pick(system, world, overlap))
def load(system):
    return statistics.median(r["cpu_per_wall"] for r in pick(system, 1))
print("| system | 1 rank (samples/s) | 2 ranks (samples/s) | scaling efficiency | CPU/wall, 1 rank |")
print("| --- | ---: | ---: | ---: | ---: |")
for name, system, overlap in [("Trainyard, overlap on", "ours", True),
                              ("Trainyard, overlap off", "ours", False),
                              ("PyTorch DDP (Gloo)", "torch", True)]:
    one, two = rate(system, 1), rate(system, 2, overlap)
    print(f"| {name} | {one:.0f} | {two:.0f} | {two / (2 * one):.2f} | {load(system):.2f} |")
print(f"\nmedian of {len(pick('ours', 1))} runs; each run's samples/s:")
for name, system, world, overlap in [("Trainyard, 1 rank", "ours", 1, True),
                                     ("Trainyard, 2 ranks, overlap on", "ours", 2, True),
                                     ("Trainyard, 2 ranks, overlap off", "ours", 2, False),
                                     ("PyTorch, 1 rank", "torch", 1, True),
                                     ("PyTorch DDP, 2 ranks", "torch", 2, True)]:
    print(f"  {name}: " + " ".join(f"{r['samples_per_second']:.0f}"
                                   for r in pick(system, world, overlap)))
PY
