#!/usr/bin/env bash
# A trainer's memory does not grow with its data set. Two runs of the real training loop
# (data_bench --mode=train: RunTrainer, one LibTorch thread) over one epoch of uint8 shards
# (3072 features a sample, 10 classes) with a small MLP:
#   - local: LOCAL_GIB of shards on this machine's disk (default 30, more than its memory);
#   - s3: S3_GIB of shards (default 4) in s3rver on loopback, streamed through a worker cache of
#     CACHE_MIB (default 512), whose disk use is sampled every second.
# Prints each run's peak resident memory, samples/s and, for s3, the cache's largest size and
# the bytes fetched.
# Usage: bench/data_bounds.sh BUILD_DIR [LOCAL_GIB] [S3_GIB] [CACHE_MIB] [WORK_DIR]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:?usage: data_bounds.sh BUILD_DIR [LOCAL_GIB] [S3_GIB] [CACHE_MIB] [WORK_DIR]}
local_gib=${2:-30}
s3_gib=${3:-4}
cache_mib=${4:-512}
work=$(mktemp -d "${5:-/tmp}/data_bounds.XXXXXX")
for t in data_bench s3_bench; do
  [ -x "$build/bin/$t" ] || { echo "build it first: cmake --build $build --target $t" >&2; exit 1; }
done
cleanup() { [ -n "${pid:-}" ] && kill "$pid" 2>/dev/null; wait 2>/dev/null || true; rm -rf "$work"; }
trap cleanup EXIT
width=3072
job() {  # job NAME GLOB SAMPLES_PER_SHARD PREFETCH
  cat <<YAML
name: $1
model:
  builtin: mlp
  args: {inputs: $width, hidden: [16], classes: 10}
data:
  train: "$2"
  features: x
  labels: y
  feature_scale: 0.00392156862745098
  shuffle_window: $3
  prefetch_shards: $4
batch_size: 256
optimizer: {name: sgd, lr: 0.01}
epochs: 1
log_every_steps: 500
seed: 1
YAML
}

if [ "$local_gib" != 0 ]; then
  samples=$(( (local_gib << 30) / width ))
  shards=$(( local_gib * 2 ))  # about 512 MiB each
  mkdir "$work/local"
  echo "generating $local_gib GiB ($samples samples) in $shards shards ..." >&2
  "$build/bin/data_bench" --mode=gen --dir="$work/local" --samples="$samples" --width="$width" \
    --shards="$shards" >&2
  job local "$work/local/train-*.safetensors" $((samples / shards)) 2 >"$work/local.yaml"
  sync; echo 3 >/proc/sys/vm/drop_caches 2>/dev/null || true
  echo "local, $local_gib GiB: $("$build/bin/data_bench" --mode=train --spec="$work/local.yaml" 2>/dev/null)"
  rm -rf "$work/local"
fi

if [ "$s3_gib" != 0 ]; then
  s3rver=$root/.tools/node_modules/.bin/s3rver
  mkdir -p "$work/s3" "$work/gen" "$work/cache"
  NODE_OPTIONS=--openssl-legacy-provider "$s3rver" -d "$work/s3" -a 127.0.0.1 -p 0 -s \
    --configure-bucket data >"$work/s3rver.log" 2>&1 &
  pid=$!
  for _ in $(seq 100); do grep -q "listening on" "$work/s3rver.log" 2>/dev/null && break; sleep 0.1; done
  port=$(sed -n 's/.*listening on 127.0.0.1:\([0-9]*\).*/\1/p' "$work/s3rver.log")
  [ -n "$port" ] || { echo "s3rver did not start" >&2; exit 1; }
  export AWS_ENDPOINT_URL=http://127.0.0.1:$port AWS_ACCESS_KEY_ID=S3RVER \
    AWS_SECRET_ACCESS_KEY=S3RVER AWS_REGION=us-east-1
  samples=$(( (s3_gib << 30) / width ))
  shards=$(( s3_gib * 16 ))  # about 64 MiB each
  echo "generating and uploading $s3_gib GiB ($samples samples) in $shards shards ..." >&2
  "$build/bin/data_bench" --mode=gen --dir="$work/gen" --samples="$samples" --width="$width" \
    --shards="$shards" >&2
  for f in "$work"/gen/*.safetensors; do
    "$build/bin/s3_bench" put "$f" "s3://data/ds/$(basename "$f")" >/dev/null
    rm "$f"
  done
  job s3 "s3://data/ds/train-*.safetensors" $((samples / shards)) 2 >"$work/s3.yaml"
  largest=0
  ( while :; do du -s --block-size=1 "$work/cache" | cut -f1; sleep 1; done ) >"$work/du.log" &
  sampler=$!
  result=$(TRAINYARD_CACHE_DIR="$work/cache" TRAINYARD_DATA_CACHE_BYTES=$((cache_mib << 20)) \
    "$build/bin/data_bench" --mode=train --spec="$work/s3.yaml" 2>"$work/s3.err") ||
    { cat "$work/s3.err" >&2; exit 1; }
  kill "$sampler"
  largest=$(sort -n "$work/du.log" | tail -1)
  fetched=$(sed -n 's/.*data: fetched \([0-9]*\) bytes.*/\1/p' "$work/s3.err")
  echo "s3, $s3_gib GiB, cache $cache_mib MiB: $result; cache at most $((largest >> 20)) MiB;" \
    "fetched $((fetched >> 20)) MiB"
fi
