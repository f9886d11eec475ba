#!/usr/bin/env bash
# The local demo: a coordinator and three workers on this machine, a dataset, a data-parallel job
# on two of them; one of those is preempted mid-run (SIGTERM to its agent) and the job restarts on
# the spare from the step it saved at, losing none. Exit code 0 only when all of that happened.
# Then a clean shutdown (also on Ctrl-C).
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

echo "==> Starting a local cluster (a coordinator and 3 workers) in $work/cluster"
"$bin/trainyard" up --workers 3 --port "$port" --state-dir "$work/cluster" >"$work/cluster.log" 2>&1 &
cluster_pid=$!

deadline=$((SECONDS + 60))
until "$bin/trainyard" workers 2>/dev/null | grep -c READY | grep -q '^3$'; do
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
echo "==> Writing a dataset (60,000 samples in 4 safetensors shards) to $work/data"
/usr/bin/python3 "$here/examples/write_dataset.py" --trainyard "$bin/trainyard" \
  --out-dir "$work/data" --samples 60000 --features 32 --classes 4 --noise 4 --files 4 \
  --seed 1 >/dev/null
stop_if_interrupted

spec="$work/demo-job.yaml"
sed "s|/tmp/trainyard-examples/mlp-data/|$work/data/|" "$here/examples/data-parallel-mlp.yaml" >"$spec"
echo
echo "==> Submitting a data-parallel job on 2 of the 3 workers ($spec)"
job=$("$bin/trainyard" submit "$spec" | head -1)
echo "    job $job"
follow=(/usr/bin/python3 "$here/scripts/demo_follow.py" "$bin/trainyard" "$job")
read -r victim victim_pid < <("${follow[@]}" checkpoint)
stop_if_interrupted

echo
echo "==> Preempting $victim: SIGTERM to its agent (pid $victim_pid), as a spot machine's notice would"
kill -TERM "$victim_pid"
"${follow[@]}" end
stop_if_interrupted

echo
echo "==> trainyard describe $job"
"$bin/trainyard" describe "$job"
echo
status=0
"${follow[@]}" check "$victim" || status=1
echo "Cluster state, logs and checkpoints are kept in $work"
exit $status
