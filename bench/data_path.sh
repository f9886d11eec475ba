#!/usr/bin/env bash
# Feeding a model from sharded safetensors: Trainyard's trainer against PyTorch on the same
# shards, model (an MLP), batch and optimizer, one LibTorch thread in each training process.
# Usage: bench/data_path.sh BUILD_DIR [SAMPLES] [WIDTH] [RUNS] [STEPS]
#   (defaults 2,000,000 samples of 784 features, 3 runs, 20,000 steps; the DataLoader peer runs
#   at most 3,000, its rate being steady long before)
#   - end to end: data_bench --mode=train (the real training loop, shards streamed through a
#     shuffle window, uint8 features scaled per batch) against data_torch.py dataloader (a
#     map-style Dataset, DataLoader with 2 workers) and data_torch.py memory (every tensor in
#     memory, batches sliced); the page cache is dropped before each run when this user may
#     (root), so that Trainyard and the DataLoader read from disk and the in-memory peer loads
#     from it;
#   - the data path alone: data_bench --mode=read over one epoch against `dd` of the same files,
#     both from a dropped page cache.
# RUNS (default 3) alternate the systems; the table shows medians.
set -euo pipefail
build=${1:?usage: data_path.sh BUILD_DIR [SAMPLES] [WIDTH] [RUNS] [STEPS]}
samples=${2:-2000000}
width=${3:-784}
runs=${4:-3}
steps=${5:-20000}
dataloader_steps=$(( steps < 3000 ? steps : 3000 ))  # its rate is steady long before
[ -x "$build/bin/data_bench" ] ||
  { echo "build it first: cmake --build $build --target data_bench" >&2; exit 1; }
here=$(cd "$(dirname "$0")" && pwd)
python=/usr/bin/python3
dir=$(mktemp -d "${TMPDIR:-/tmp}/data_path.XXXXXX")
trap 'rm -rf "$dir"' EXIT
mkdir "$dir/shards"
"$build/bin/data_bench" --mode=gen --dir="$dir/shards" --samples="$samples" --width="$width" \
  --shards=8 >/dev/null
cat >"$dir/job.yaml" <<YAML
name: data-bench
model:
  builtin: mlp
  args: {inputs: $width, hidden: [256, 128], classes: 10}
data:
  train: $dir/shards/train-*.safetensors
  features: x
  labels: y
  feature_scale: 0.00392156862745098
  shuffle_window: $((samples / 8))
batch_size: 128
optimizer: {name: sgd, lr: 0.01}
max_steps: $steps
log_every_steps: 100
seed: 1
YAML
drop() { sync; echo 3 >/proc/sys/vm/drop_caches 2>/dev/null || true; }
results=""
for _ in $(seq "$runs"); do
  drop
  results+=$("$build/bin/data_bench" --mode=train --spec="$dir/job.yaml" 2>/dev/null)$'\n'
  for mode in dataloader memory; do
    drop
    mode_steps=$steps
    [ "$mode" = dataloader ] && mode_steps=$dataloader_steps
    results+=$("$python" "$here/data_torch.py" "$mode" "$dir/shards/train-*.safetensors" \
      --inputs="$width" --steps="$mode_steps")$'\n'
  done
  drop
  results+=$("$build/bin/data_bench" --mode=read --spec="$dir/job.yaml" 2>/dev/null)$'\n'
  drop
  start=$(date +%s.%N)
  for f in "$dir"/shards/*.safetensors; do dd if="$f" of=/dev/null bs=16M status=none; done
  end=$(date +%s.%N)
  bytes=$(cat "$dir"/shards/*.safetensors | wc -c)
  results+=$(printf '{"mode": "dd", "seconds": %s, "bytes": %s}' "$(awk "BEGIN{print $end - $start}")" \
    "$bytes")$'\n'
done
"$python" - "$results" "$samples" "$width" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in sys.argv[1].splitlines() if l.strip()]
samples, width = int(sys.argv[2]), int(sys.argv[3])
def med(mode, key):
    return statistics.median(r[key] for r in rows if r["mode"] == mode)
ours = med("train", "samples_per_second")
print(f"{samples:,} samples of {width} uint8 features in 8 shards; MLP {width}-256-128-10, "
      "batch 128, SGD; medians of", len([r for r in rows if r["mode"] == "train"]), "runs\n")
print("| feeding | samples/s | Trainyard / it |")
print("| --- | ---: | ---: |")
print(f"| Trainyard trainer, shards streamed (window of one shard) | {ours:.0f} | 1.00 |")
for mode, name in [("dataloader", "PyTorch Dataset + DataLoader(num_workers=2)"),
                   ("memory", "PyTorch, all tensors in memory, batches sliced")]:
    theirs = med(mode, "samples_per_second")
    print(f"| {name} | {theirs:.0f} | {ours / theirs:.2f} |")
print(f"\nTrainyard's share of step time waiting for batches: {med('train', 'data_wait_share'):.1%};"
      f" peak RSS {med('train', 'peak_rss_mib'):.0f} MiB\n")
read = med("read", "samples_per_second")
mib = med("read", "mib_per_second")
dd = statistics.median(r["bytes"] / r["seconds"] / 2**20 for r in rows if r["mode"] == "dd")
print("| data path alone, one epoch from a dropped page cache | samples/s | MiB/s |")
print("| --- | ---: | ---: |")
print(f"| Trainyard batches (data_bench read) | {read:.0f} | {mib:.0f} |")
print(f"| dd of the same files, bs=16M | | {dd:.0f} |")
print(f"\nTrainyard's data path at {mib / dd:.2f} of the disk's sequential read.\n")
print("each run:")
for mode, key in [("train", "samples_per_second"), ("dataloader", "samples_per_second"),
                  ("memory", "samples_per_second"), ("read", "mib_per_second")]:
    print(f"  {mode} {key}: " + " ".join(f"{r[key]:.0f}" for r in rows if r["mode"] == mode))
print("  dd MiB/s: " + " ".join(f"{r['bytes'] / r['seconds'] / 2**20:.0f}" for r in rows
                                if r["mode"] == "dd"))
PY
