#!/usr/bin/env bash
# The local demo: a coordinator and two workers on this machine, a dataset, a real training job
# followed to the end, then a clean shutdown (also on Ctrl-C).
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${1:-build}
case "$build" in /*) ;; *) build="$here/$build" ;; esac
bin="$build/bin"
for b in trainyard trainyard-coordinator trainyard-worker trainyard-trainer; do
  [ -x "$bin/$b" ] || { echo "demo: $bin/$b is missing; run 'make build' first" >&2; exit 1; }
done

work=$(mktemp -d /tmp/trainyard-demo-XXXXXX)
port=$(/usr/bin/python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
export TRAINYARD_COORDINATOR="127.0.0.1:$port"
cluster_pid=""

shutdown() {
  if [ -n "$cluster_pid" ] && kill -0 "$cluster_pid" 2>/dev/null; then
    echo
    echo "==> Stopping the local cluster"
    kill -TERM "$cluster_pid" 2>/dev/null || true
    wait "$cluster_pid" 2>/dev/null || true
  fi
  cluster_pid=""
}
interrupted=""
# Bash runs an INT/TERM trap once the foreground command returns; the steps below check the flag.
trap 'interrupted=1' INT TERM
trap shutdown EXIT
stop_if_interrupted() {
  if [ -n "$interrupted" ]; then
    echo
    echo "demo: interrupted"
    exit 130
  fi
}

echo "==> Starting a local cluster (coordinator and 2 workers) in $work/cluster"
"$bin/trainyard" up --workers 2 --port "$port" --state_dir "$work/cluster" >"$work/cluster.log" 2>&1 &
cluster_pid=$!

deadline=$((SECONDS + 60))
until "$bin/trainyard" workers 2>/dev/null | grep -c READY | grep -q '^2$'; do
  if ! kill -0 "$cluster_pid" 2>/dev/null || [ $SECONDS -gt $deadline ]; then
    echo "demo: the cluster did not come up; its log:" >&2
    cat "$work/cluster.log" >&2
    exit 1
  fi
  stop_if_interrupted
  sleep 0.2
done
"$bin/trainyard" workers

echo
echo "==> Writing a small dataset to $work/data"
/usr/bin/python3 "$here/examples/write_dataset.py" --out-dir "$work/data" --samples 60000 \
  --features 32 --classes 4 --noise 4 --files 4 --seed 1
stop_if_interrupted

spec="$work/demo-job.yaml"
sed "s|examples/data/|$work/data/|" "$here/examples/safetensors-mlp.yaml" >"$spec"
echo
echo "==> Submitting $spec"
cat "$spec"
echo
status=0
"$bin/trainyard" submit "$spec" --wait || status=$?
stop_if_interrupted

echo
echo "==> The job"
"$bin/trainyard" jobs
job=$("$bin/trainyard" jobs -o json | /usr/bin/python3 -c 'import json,sys; print(json.load(sys.stdin)["jobs"][0]["id"])')
"$bin/trainyard" describe "$job"
echo
"$bin/trainyard" checkpoints "$job"
echo
echo "Cluster state, logs and checkpoints are kept in $work"
exit $status
