#!/usr/bin/env bash
# Runs every fuzz target of BUILD_DIR/fuzz/ (make fuzz builds them) for SECONDS each, from its
# committed seeds (tests/fuzz/corpus/NAME/) and what earlier runs found (BUILD_DIR/fuzz-work/NAME/,
# kept between runs), with its dictionary where it has one. A crash, a leak, a timeout (10 s on one
# input) or running out of memory (2.5 GiB) stops the run: the input is written to
# BUILD_DIR/fuzz-work/NAME-crash-* and the script exits 1. Prints a line per target: executions,
# coverage (edges), corpus size. FUZZ_JOBS targets run at once (default: one per core; each
# libFuzzer run uses one).
#   scripts/fuzz.sh BUILD_DIR [SECONDS] [TARGET...]
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${1:?usage: scripts/fuzz.sh BUILD_DIR [SECONDS] [TARGET...]}
seconds=${2:-20}
shift $(( $# >= 2 ? 2 : $# ))
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
  for t in "$build"/fuzz/fuzz_*; do targets+=("$(basename "$t")"); done
fi
failed=0
# AddressSanitizer keeps freed memory aside to catch later uses (256 MiB by default): a quarter of
# that keeps the targets that start a coordinator per input well under the memory limit.
export ASAN_OPTIONS=${ASAN_OPTIONS:-quarantine_size_mb=64}
# One target's run; its line (or its failure, with the end of its log) printed at once.
fuzz_one() {
  local name=$1 work="$build/fuzz-work/$1" log="$build/fuzz-work/$1.log" runs cov corpus
  mkdir -p "$work"
  local args=(-max_total_time="$seconds" -timeout=10 -rss_limit_mb=2560 -print_final_stats=1
              -artifact_prefix="$build/fuzz-work/$name-")
  [ -f "$here/tests/fuzz/$name.dict" ] && args+=(-dict="$here/tests/fuzz/$name.dict")
  if "$build/fuzz/$name" "${args[@]}" "$work" "$here/tests/fuzz/corpus/$name" >"$log" 2>&1; then
    runs=$(grep -o 'stat::number_of_executed_units: [0-9]*' "$log" | grep -o '[0-9]*$' || echo 0)
    cov=$(grep -o 'cov: [0-9]*' "$log" | tail -1 | grep -o '[0-9]*' || echo 0)
    corpus=$(find "$work" -type f | wc -l)
    printf '%-28s %10s runs  %6s edges  %6s inputs in its corpus\n' "$name" "$runs" "$cov" "$corpus"
  else
    echo "$name: FAILED (the input is at $build/fuzz-work/$name-*; the end of its log:)"
    tail -30 "$log"
    return 1
  fi
}
jobs=${FUZZ_JOBS:-$(nproc)}
running=0
for name in "${targets[@]}"; do
  if [ "$running" -ge "$jobs" ]; then
    wait -n || failed=1
    running=$((running - 1))
  fi
  fuzz_one "$name" &
  running=$((running + 1))
done
while [ "$running" -gt 0 ]; do
  wait -n || failed=1
  running=$((running - 1))
done
exit $failed
