#!/usr/bin/env bash
# Time to recover on loopback: a coordinator and three workers with the default settings
# (leases kept by streams that 500 ms keepalive pings prove, --restart_backoff 1s), a 2-rank
# data-parallel job, and
#   1. kill -9 of the agent and trainer of rank 1's machine (a machine that vanishes),
#   2. SIGTERM to the agent of rank 0's machine (a spot preemption notice).
# Prints one markdown row per restart with the coordinator's own record of it (describe -o json).
# Each job is held 250 updates in (the trainer's test hold, TRAINYARD_TEST_HOLD_DIR) until the
# machine goes, so the failure lands mid-run however fast this machine trains.
# Usage: bench/recovery.sh BUILD_DIR [STEPS]
set -euo pipefail
build=${1:?usage: recovery.sh BUILD_DIR [STEPS]}
steps=${2:-3000}
bin=$(cd "$build/bin" && pwd)
python=/usr/bin/python3
dir=$(mktemp -d)
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill -9 "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$dir"
}
trap cleanup EXIT

"$bin/trainyard-coordinator" --listen=127.0.0.1:0 --state_dir="$dir/state" \
  --port_file="$dir/port" --metrics_listen=127.0.0.1:0 >"$dir/coordinator.log" 2>&1 &
pids+=($!)
for _ in $(seq 100); do [[ -s $dir/port ]] && break; sleep 0.1; done
export TRAINYARD_COORDINATOR=127.0.0.1:$(cat "$dir/port")
export TRAINYARD_TOKEN_FILE=$dir/state/admin.token  # the CLI, as an admin
export TRAINYARD_TEST_HOLD_DIR=$dir/holds
mkdir -p "$TRAINYARD_TEST_HOLD_DIR"
held_at=250  # between two checkpoints (every 100): a vanished machine loses 50 steps
declare -A workers
start_worker() {
  [[ -s $dir/w$1.token ]] || "$bin/trainyard" token create "w$1" --role agent >"$dir/w$1.token"
  "$bin/trainyard-worker" --name="w$1" --address=127.0.0.1 --slots=1 --gpus=0 \
    --work_dir="$dir/w$1" --metrics_listen=127.0.0.1:0 --token_file="$dir/w$1.token" \
    >"$dir/w$1.log" 2>&1 &
  workers[$1]=$!
  pids+=($!)
  disown $!  # no job-control message when it is killed on purpose
}
for i in 0 1 2; do start_worker "$i"; done

job_yaml() {
  cat <<EOF
name: $1
strategy: data_parallel
workers: 2
model: {builtin: mlp, args: {inputs: 32, hidden: [256, 256], classes: 4}}
data: {synthetic: {samples: 4096, features: 32, classes: 4, noise: 0.5}}
batch_size: 48
optimizer: {name: sgd, lr: 0.02, momentum: 0.9}
seed: 11
checkpoint: {every_steps: 100}
max_steps: $steps
EOF
}

# Waits until the job's attempt `gen` is running, held $held_at steps past where it started.
wait_running() {
  for _ in $(seq 600); do
    if "$bin/trainyard" describe -o json "$1" | "$python" -c '
import json, sys
j = json.load(sys.stdin)
p = j.get("progress", {})
ok = j.get("state") == "RUNNING" and int(j.get("generation", 0)) == int(sys.argv[1]) and \
     int(p.get("step", 0)) == int(p.get("attemptStartStep", 0)) + int(sys.argv[2])
sys.exit(0 if ok else 1)' "$2" "$held_at"; then return 0; fi
    sleep 0.1
  done
  echo "job $1 did not run" >&2
  return 1
}

worker_of_rank() {
  "$bin/trainyard" describe -o json "$1" | "$python" -c '
import json, sys
j = json.load(sys.stdin)
for t in j["tasks"]:
    if int(t.get("generation", 0)) == int(j["generation"]) and int(t.get("rank", 0)) == int(sys.argv[1]):
        print(t["workerId"][1:])' "$2"
}

run_case() {  # name, rank whose machine goes, signal to its agent
  local id
  echo "$held_at" >"$TRAINYARD_TEST_HOLD_DIR/$1"
  id=$(job_yaml "$1" | "$bin/trainyard" submit - | head -1)
  wait_running "$id" 1
  local w
  w=$(worker_of_rank "$id" "$2")
  if [[ $3 == KILL ]]; then
    local trainer
    trainer=$(cat "$dir/w$w"/tasks/"$id".g1.r"$2"/pid)
    kill -9 "${workers[$w]}" "$trainer"
  else
    kill -TERM "${workers[$w]}"
  fi
  rm "$TRAINYARD_TEST_HOLD_DIR/$1"  # the next attempt runs to the end
  for _ in $(seq 1200); do
    state=$("$bin/trainyard" describe -o json "$id" | "$python" -c 'import json,sys; print(json.load(sys.stdin)["state"])')
    [[ $state == SUCCEEDED || $state == FAILED ]] && break
    sleep 0.1
  done
  start_worker "$w"  # capacity for the next case
  "$bin/trainyard" describe -o json "$id" >"$dir/$1.json"
}

run_case kill9 1 KILL
run_case notice 0 TERM
"$python" - "$dir/kill9.json" "$dir/notice.json" <<'PY'
import json, sys
print("| event | reason | detection (s) | scheduling (s) | start (s) | rendezvous (s) | checkpoint load (s) | first step (s) | after detection (s) | steps lost |")
print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
for name, path in zip(["kill -9 of a worker", "SIGTERM notice"], sys.argv[1:]):
    j = json.load(open(path))
    if j["state"] != "SUCCEEDED" or not j.get("restarts"):
        print(f"| {name} | job {j['state']}: {j.get('reason')} |")
        continue
    r = j["restarts"][0]
    g = lambda k: float(r.get(k, 0))
    print(f"| {name} | {r['reason']} | {g('detectionSeconds'):.2f} | {g('schedulingSeconds'):.2f} "
          f"| {g('startSeconds'):.2f} | {g('rendezvousSeconds'):.2f} | {g('checkpointLoadSeconds'):.2f} "
          f"| {g('firstStepSeconds'):.2f} | {g('recoverySeconds'):.2f} | {int(r.get('stepsLost', 0))} |")
PY
