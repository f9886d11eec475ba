#!/usr/bin/env bash
# Upload and download throughput of a checkpoint-sized file to s3rver on loopback: Trainyard's S3
# client (bench/s3_bench, multipart / parallel ranged GETs) against `aws s3 cp` of the same file
# to the same endpoint. Prints a Markdown table.
#
#   bench/s3_throughput.sh [BUILD_DIR] [SIZE_MIB]      (defaults: build, 1024)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$root/build}
size_mib=${2:-1024}
aws=$(command -v /usr/bin/aws || command -v aws)
[ -x "$build/bin/s3_bench" ] || { echo "build it first: cmake --build $build --target s3_bench" >&2; exit 1; }

work=$(mktemp -d /tmp/trainyard-s3-bench-XXXXXX)
cleanup() { [ -n "${s3rver_pid:-}" ] && kill "$s3rver_pid" 2>/dev/null; wait 2>/dev/null; rm -rf "$work"; }
trap cleanup EXIT
source "$root/bench/s3rver.sh"
start_s3rver "$work" bench
export AWS_CONFIG_FILE=/dev/null AWS_SHARED_CREDENTIALS_FILE=/dev/null

head -c $((size_mib << 20)) /dev/urandom >"$work/ckpt.bin"
now() { date +%s.%N; }
elapsed() { echo "$2 - $1" | bc -l; }

ours_put=$("$build/bin/s3_bench" put "$work/ckpt.bin" s3://bench/ours.bin)
ours_get=$("$build/bin/s3_bench" get s3://bench/ours.bin "$work/ours.out")
cmp -s "$work/ckpt.bin" "$work/ours.out" || { echo "our download differs" >&2; exit 1; }
rm -f "$work/ours.out"
t0=$(now); "$aws" --endpoint-url "$AWS_ENDPOINT_URL" s3 cp --only-show-errors "$work/ckpt.bin" s3://bench/aws.bin; t1=$(now)
"$aws" --endpoint-url "$AWS_ENDPOINT_URL" s3 cp --only-show-errors s3://bench/aws.bin "$work/aws.out"; t2=$(now)
cmp -s "$work/ckpt.bin" "$work/aws.out" || { echo "aws download differs" >&2; exit 1; }
aws_put=$(elapsed "$t0" "$t1"); aws_get=$(elapsed "$t1" "$t2")

row() {  # name ours_s aws_s
  printf '| %s | %.2f s (%.0f MiB/s) | %.2f s (%.0f MiB/s) | %.2f |\n' "$1" "$2" \
    "$(echo "$size_mib / $2" | bc -l)" "$3" "$(echo "$size_mib / $3" | bc -l)" \
    "$(echo "$3 / $2" | bc -l)"
}
echo "| ${size_mib} MiB to s3rver | Trainyard S3 client | aws s3 cp | ratio (aws time / ours) |"
echo "| --- | --- | --- | --- |"
row upload "$ours_put" "$aws_put"
row download "$ours_get" "$aws_get"
