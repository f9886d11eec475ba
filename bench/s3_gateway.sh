#!/usr/bin/env bash
# What the agent's S3 gateway costs a trainer: a checkpoint-sized file put and got straight to
# s3rver on loopback, then through the gateway (bench/s3_gateway_bench), ROUNDS times each.
# Prints a Markdown table of the medians.
#
#   bench/s3_gateway.sh [BUILD_DIR] [SIZE_MIB] [ROUNDS]      (defaults: build, 256, 3)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$root/build}
size_mib=${2:-256}
rounds=${3:-3}
[ -x "$build/bin/s3_gateway_bench" ] ||
  { echo "build it first: cmake --build $build --target s3_gateway_bench" >&2; exit 1; }

work=$(mktemp -d /tmp/trainyard-gateway-bench-XXXXXX)
cleanup() { [ -n "${s3rver_pid:-}" ] && kill "$s3rver_pid" 2>/dev/null; wait 2>/dev/null; rm -rf "$work"; }
trap cleanup EXIT
source "$root/bench/s3rver.sh"
start_s3rver "$work" bench

head -c $((size_mib << 20)) /dev/urandom >"$work/ckpt.bin"
for r in $(seq "$rounds"); do
  "$build/bin/s3_gateway_bench" "$work/ckpt.bin" "s3://bench/round-$r" >>"$work/times"
done
median() {  # mode column
  awk -v m="$1" -v c="$2" '$1 == m { print $c }' "$work/times" | sort -g |
    awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'
}
dp=$(median direct 2); dg=$(median direct 3); gp=$(median gateway 2); gg=$(median gateway 3)
echo "| ${size_mib} MiB, median of ${rounds} | straight to s3rver | through the gateway | ratio (straight / gateway) |"
echo "| --- | --- | --- | --- |"
printf '| upload | %.2f s | %.2f s | %.2f |\n' "$dp" "$gp" "$(echo "$dp / $gp" | bc -l)"
printf '| download | %.2f s | %.2f s | %.2f |\n' "$dg" "$gg" "$(echo "$dg / $gg" | bc -l)"
