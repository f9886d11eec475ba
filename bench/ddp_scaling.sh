#!/usr/bin/env bash
# Data-parallel scaling efficiency on this machine: Trainyard (bench/ddp_scaling.cc, real trainer
# processes, overlap on and off) against PyTorch DDP with Gloo (bench/ddp_torch.py), same model,
# global batch and optimizer, one CPU per rank.
# Usage: bench/ddp_scaling.sh BUILD_DIR [STEPS] [GLOBAL_BATCH]
# Efficiency = samples/s on 2 ranks / (2 * samples/s on 1 rank).
set -euo pipefail
build=${1:?usage: ddp_scaling.sh BUILD_DIR [STEPS] [GLOBAL_BATCH]}
steps=${2:-200}
batch=${3:-64}
here=$(cd "$(dirname "$0")" && pwd)
python=/usr/bin/python3
ours=$("$build/bin/ddp_scaling" --bin_dir="$build/bin" --steps="$steps" --batch="$batch" 2>/dev/null)
torch1=$("$python" "$here/ddp_torch.py" 1 "$steps" "$batch")
torch2=$("$python" "$here/ddp_torch.py" 2 "$steps" "$batch")
"$python" - "$ours" "$torch1" "$torch2" <<'PY'
import json, sys
ours = [json.loads(l) for l in sys.argv[1].splitlines() if l.strip()]
t1, t2 = json.loads(sys.argv[2]), json.loads(sys.argv[3])
one = next(r for r in ours if r["world"] == 1)["samples_per_second"]
print("| system | 1 rank (samples/s) | 2 ranks (samples/s) | scaling efficiency |")
print("| --- | ---: | ---: | ---: |")
for r in ours:
    if r["world"] == 2:
        name = "Trainyard, overlap " + ("on" if r["overlap"] else "off")
        eff = r["samples_per_second"] / (2 * one)
        print(f"| {name} | {one:.0f} | {r['samples_per_second']:.0f} | {eff:.2f} |")
eff = t2["samples_per_second"] / (2 * t1["samples_per_second"])
print(f"| PyTorch DDP (Gloo) | {t1['samples_per_second']:.0f} | {t2['samples_per_second']:.0f} "
      f"| {eff:.2f} |")
PY
