#!/usr/bin/env bash
# Step-time inflation while an asynchronous checkpoint of a model of MB megabytes is written
# (bench/s3_bench checkpoint), to s3rver on loopback and to a file:// store, in these setups:
#
#   shared   every thread and process runs wherever the kernel puts it (on this 2-core machine
#            the training thread, the checkpoint's threads and s3rver compete for both cores)
#   pinned   the training thread on CPU 0, the checkpoint's threads and s3rver on CPU 1: the
#            shape of a real training machine, where the store is another machine and the
#            checkpoint's CPU work does not run on the core that trains
#   remote   (s3 only) s3rver kept to CPU 1, standing in for a store on another machine; the
#            training and checkpoint threads run wherever the kernel puts them, as the trainer
#            runs them (it pins nothing)
#
# Prints one line of figures per run, with the CPU seconds s3rver spent during it, and the load
# average before and after.
#
#   bench/checkpoint_inflation.sh [BUILD_DIR] [MB] [RUNS] [SETUPS...]
#   (defaults: build, 128, 3, "s3-shared s3-remote s3-pinned file-shared file-pinned")
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$root/build}
mb=${2:-128}
runs=${3:-3}
shift $(($# < 3 ? $# : 3))
setups=${*:-s3-shared s3-remote s3-pinned file-shared file-pinned}
s3rver=$root/.tools/node_modules/.bin/s3rver
[ -x "$build/bin/s3_bench" ] || { echo "build it first: cmake --build $build --target s3_bench" >&2; exit 1; }
[ "$(nproc --all)" -ge 2 ] || { echo "the pinned setups need 2 CPUs" >&2; exit 1; }

work=$(mktemp -d /tmp/trainyard-ckpt-bench-XXXXXX)
cleanup() { [ -n "${pid:-}" ] && kill "$pid" 2>/dev/null; wait 2>/dev/null; rm -rf "$work"; }
trap cleanup EXIT
mkdir -p "$work/data" "$work/files"
# s3rver's list continuation tokens use DES, which Node's OpenSSL 3 keeps in the legacy provider.
NODE_OPTIONS=--openssl-legacy-provider "$s3rver" -d "$work/data" -a 127.0.0.1 -p 0 -s \
  --configure-bucket bench >"$work/s3rver.log" 2>&1 &
pid=$!
for _ in $(seq 100); do grep -q "listening on" "$work/s3rver.log" 2>/dev/null && break; sleep 0.1; done
port=$(sed -n 's/.*listening on 127.0.0.1:\([0-9]*\).*/\1/p' "$work/s3rver.log")
[ -n "$port" ] || { echo "s3rver did not start" >&2; cat "$work/s3rver.log" >&2; exit 1; }
export AWS_ENDPOINT_URL=http://127.0.0.1:$port AWS_ACCESS_KEY_ID=S3RVER AWS_SECRET_ACCESS_KEY=S3RVER
# Training on one thread: OpenBLAS would otherwise start a worker thread per core.
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1

# CPU seconds (user + system) s3rver has used so far.
s3rver_cpu() {
  awk -v hz="$(getconf CLK_TCK)" '{ print ($14 + $15) / hz }' "/proc/$pid/stat"
}

echo "load before: $(uptime)"
for setup in $setups; do
  case $setup in
    s3-*) prefix=s3://bench/$setup ;;
    file-*) prefix=file://$work/files/$setup ;;
    *) echo "unknown setup $setup" >&2; exit 2 ;;
  esac
  case $setup in
    *-pinned) cpus=(0 1); taskset -a -p -c 1 "$pid" >/dev/null ;;
    *-shared) cpus=(); taskset -a -p -c 0-$(($(nproc --all) - 1)) "$pid" >/dev/null ;;
    s3-remote) cpus=(); taskset -a -p -c 1 "$pid" >/dev/null ;;
    *) echo "unknown setup $setup" >&2; exit 2 ;;
  esac
  for i in $(seq "$runs"); do
    start=$(s3rver_cpu)
    "$build/bin/s3_bench" checkpoint "$prefix/run-$i" "$mb" "${cpus[@]}" >"$work/run.txt"
    sed "s/^/$setup run=$i /" "$work/run.txt" | tee -a "$work/all.txt"
    echo "$setup run=$i s3rver_cpu_s=$(awk -v a="$start" -v b="$(s3rver_cpu)" 'BEGIN { printf "%.2f", b - a }')"
    rm -rf "${work:?}/files/$setup"
  done
done
echo "load after: $(uptime)"
# Per setup: the median over all saves of each figure.
keys="baseline_step_ms during_upload_step_ms inflation_pct median_inflation_pct step_cpu_ms during_step_cpu_ms cpu_inflation_pct waited_ms during_waited_ms snapshot_ms upload_s save_cpu_s"
echo "setup saves $keys (medians over the saves)"
for setup in $setups; do
  grep "^$setup " "$work/all.txt" | awk -v setup="$setup" -v keys="$keys" '
    function median(a, n,   i, j, t) {
      for (i = 2; i <= n; i++) for (j = i; j > 1 && a[j - 1] > a[j]; j--) { t = a[j]; a[j] = a[j - 1]; a[j - 1] = t }
      return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
    }
    {
      n++
      for (f = 1; f <= NF; f++) { split($f, kv, "="); v[kv[1], n] = kv[2] }
    }
    END {
      printf "%s %d", setup, n
      nk = split(keys, key, " ")
      for (k = 1; k <= nk; k++) { for (i = 1; i <= n; i++) a[i] = v[key[k], i]; printf " %s", median(a, n) }
      printf "\n"
    }'
done
