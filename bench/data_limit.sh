#!/usr/bin/env bash
# Training from local shards under a memory limit, as a worker's cgroup holds a rank to its
# resources.memory. The real training loop (data_bench --mode=train: RunTrainer, one LibTorch
# thread, a small MLP) over DATA_GIB of uint8 shards (3072 features a sample, 10 classes,
# 64 MiB shards), for STEPS updates of 256 samples, each run from a cold page cache (dropped
# before it), inside a cgroup v1 memory controller limit made here (root only):
#   - unlimited: no cgroup, the default order (one permutation of all samples);
#   - container: the limit, the default order, no resources.memory and no data memory (a
#     coordinator from before it fixed one: the trainer only warns), for a tenth of the steps;
#   - container-fixed: the limit, no resources.memory, the job's data memory what the coordinator
#     fixes at its first placement (Job.data_memory_bytes): the task memory an agent in that
#     container offers (its limit less a reserve of 5 % between 256 MiB and 1 GiB);
#   - window: the limit with resources.memory set to it: the trainer chooses data.shuffle_window;
#   - for each limit of LIMITS_MIB (default: one eighth of the data set up to its size), window.
# Prints one JSON line per run: samples/s (median of the progress lines), data wait share, peak
# resident memory, the cgroup's peak, and the window the trainer chose.
# Usage: bench/data_limit.sh BUILD_DIR [DATA_GIB] [LIMIT_MIB] [STEPS] [WORK_DIR]
set -euo pipefail
build=${1:?usage: data_limit.sh BUILD_DIR [DATA_GIB] [LIMIT_MIB] [STEPS] [WORK_DIR]}
data_gib=${2:-6}
limit_mib=${3:-2048}
steps=${4:-1500}
work=$(mktemp -d "${5:-/tmp}/data_limit.XXXXXX")
[ -x "$build/bin/data_bench" ] || { echo "build it first: cmake --build $build --target data_bench" >&2; exit 1; }
[ "$(id -u)" = 0 ] || { echo "data_limit.sh: needs root (it makes cgroups and drops the page cache)" >&2; exit 1; }
memory_root=$(awk '$9 == "cgroup" && $NF ~ /(^|,)memory(,|$)/ {print $5; exit}' /proc/self/mountinfo)
[ -n "$memory_root" ] || { echo "data_limit.sh: no cgroup v1 memory controller mounted" >&2; exit 1; }
own=$(sed -n 's/^[0-9]*:memory:\(.*\)$/\1/p' /proc/self/cgroup)
group="$memory_root$own/trainyard-data-limit.$$"
cleanup() { rmdir "$group" 2>/dev/null || true; rm -rf "$work"; }
trap cleanup EXIT
width=3072
shards=$(( data_gib * 16 ))
samples=$(( (data_gib << 30) / width ))

job() {  # job NAME MEMORY_MIB (0: no resources.memory) STEPS
  cat <<YAML
name: $1
model:
  builtin: mlp
  args: {inputs: $width, hidden: [16], classes: 10}
data:
  train: "$work/data/train-*.safetensors"
  features: x
  labels: y
  feature_scale: 0.00392156862745098
batch_size: 256
optimizer: {name: sgd, lr: 0.01}
max_steps: $3
log_every_steps: $(( $3 / 15 ))
seed: 1
YAML
  [ "$2" = 0 ] || echo "resources: {memory: ${2}MiB}"
}

run() {  # run NAME LIMIT_MIB (0: none) MEMORY_MIB [STEPS] [DATA_MEMORY_MIB]
  job "$1" "$3" "${4:-$steps}" >"$work/$1.yaml"
  sync; echo 3 >/proc/sys/vm/drop_caches
  local out
  if [ "$2" = 0 ]; then
    out=$("$build/bin/data_bench" --mode=train --spec="$work/$1.yaml" \
      --data_memory=$(( ${5:-0} << 20 )) 2>"$work/$1.log")
    peak=0
  else
    mkdir -p "$group"
    echo $(( $2 << 20 )) >"$group/memory.limit_in_bytes"
    echo 0 >"$group/memory.max_usage_in_bytes"
    out=$(sh -c "echo \$\$ >'$group/cgroup.procs' && exec '$build/bin/data_bench' --mode=train --spec='$work/$1.yaml' --data_memory=$(( ${5:-0} << 20 ))" 2>"$work/$1.log")
    peak=$(( $(cat "$group/memory.max_usage_in_bytes") >> 20 ))
  fi
  window=$(sed -n 's/.*data.shuffle_window is \([0-9]*\) samples.*/\1/p' "$work/$1.log" | head -1)
  echo "{\"run\": \"$1\", \"limit_mib\": $2, \"cgroup_peak_mib\": $peak, \"window\": ${window:-0}, \"result\": $out}"
}

mkdir "$work/data"
echo "generating $data_gib GiB ($samples samples) in $shards shards ..." >&2
"$build/bin/data_bench" --mode=gen --dir="$work/data" --samples="$samples" --width="$width" \
  --shards="$shards" >&2
run unlimited 0 0
# The default order under the limit is far slower: a tenth of the steps.
run container "$limit_mib" 0 $(( steps / 10 ))
reserve=$(( limit_mib / 20 )); [ $reserve -lt 256 ] && reserve=256; [ $reserve -gt 1024 ] && reserve=1024
run container-fixed "$limit_mib" 0 "$steps" $(( limit_mib - reserve ))
run window "$limit_mib" "$limit_mib"
for limit in ${LIMITS_MIB:-$(( (data_gib << 10) / 8 )) $(( (data_gib << 10) / 4 )) $(( (data_gib << 10) / 2 )) $(( data_gib << 10 ))}; do
  run "window-$limit" "$limit" "$limit"
done
