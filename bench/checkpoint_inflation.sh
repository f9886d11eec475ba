#!/usr/bin/env bash
# Step-time inflation while an asynchronous checkpoint of a model of MB megabytes uploads to
# s3rver on loopback (bench/s3_bench checkpoint). Prints one line of figures per run.
#
#   bench/checkpoint_inflation.sh [BUILD_DIR] [MB] [RUNS]      (defaults: build, 128, 3)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$root/build}
mb=${2:-128}
runs=${3:-3}
s3rver=$root/.tools/node_modules/.bin/s3rver
work=$(mktemp -d /tmp/trainyard-ckpt-bench-XXXXXX)
cleanup() { [ -n "${pid:-}" ] && kill "$pid" 2>/dev/null; wait 2>/dev/null; rm -rf "$work"; }
trap cleanup EXIT
mkdir -p "$work/data"
NODE_OPTIONS=--openssl-legacy-provider "$s3rver" -d "$work/data" -a 127.0.0.1 -p 0 -s \
  --configure-bucket bench >"$work/s3rver.log" 2>&1 &
pid=$!
for _ in $(seq 100); do grep -q "listening on" "$work/s3rver.log" 2>/dev/null && break; sleep 0.1; done
port=$(sed -n 's/.*listening on 127.0.0.1:\([0-9]*\).*/\1/p' "$work/s3rver.log")
export AWS_ENDPOINT_URL=http://127.0.0.1:$port AWS_ACCESS_KEY_ID=S3RVER AWS_SECRET_ACCESS_KEY=S3RVER
for i in $(seq "$runs"); do
  "$build/bin/s3_bench" checkpoint "s3://bench/run-$i" "$mb"
done
