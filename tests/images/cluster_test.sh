#!/usr/bin/env bash
# The runtime image, run for real: the coordinator and three workers each in a container of
# localhost/trainyard:TAG (scripts/build-images.sh), on the host's network, state, work folders
# and checkpoints on mounted folders, TLS and agent tokens as in deploy/kubernetes. A
# data-parallel job submitted with the host's CLI runs on two of the workers; `podman stop` of
# one of their containers (SIGTERM: a preemption) mid-run moves the job to the third worker, and
# it ends SUCCEEDED with 0 steps lost. Then a job's own program (a data-parallel script with the
# `trainyard` module, its folder packed by the CLI) runs on the image's Python and torch and
# commits a checkpoint. The flags are the manifests' but for: addresses on
# 127.0.0.1 with ports the kernel picks, checkpoints in a mounted folder instead of s3://, and
# one CPU slot per worker.
# Usage: tests/images/cluster_test.sh BUILD_DIR [TAG]    (as root; `make test-images` runs it)
set -euo pipefail
build=$(cd "${1:?usage: cluster_test.sh BUILD_DIR [TAG]}" && pwd)
tag=${2:-latest}
image=localhost/trainyard:$tag
cli=("$build/bin/trainyard")
export CONTAINERS_CONF=${CONTAINERS_CONF:-/var/tmp/trainyard-images/containers.conf}
podman image exists "$image" || { echo "no image $image: run scripts/build-images.sh" >&2; exit 1; }

dir=$(mktemp -d /tmp/trainyard-images-test.XXXXXX)
prefix=ty-test-$$
containers=()
cleanup() {
  local rc=$?
  if [ $rc -ne 0 ]; then
    for c in "${containers[@]}"; do
      echo "---- podman logs $c (last 30 lines)" >&2
      podman logs "$c" 2>&1 | tail -30 >&2 || true
    done
  fi
  for c in "${containers[@]}"; do podman rm -f -t 0 "$c" >/dev/null 2>&1 || true; done
  rm -rf "$dir"
  exit $rc
}
trap cleanup EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
# Polls `$@` until it succeeds; fails after $timeout seconds.
wait_for() {
  local what=$1 timeout=$2
  shift 2
  local deadline=$(( $(date +%s) + timeout ))
  until "$@" >/dev/null 2>&1; do
    [ "$(date +%s)" -lt "$deadline" ] || fail "$what: not within ${timeout}s"
    sleep 0.5
  done
}
free_port() { /usr/bin/python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

# The image's user (uid 10001) owns what it writes; the host's CLI reads as root.
mkdir -p "$dir"/{state,checkpoints,tls,tokens,hold,w0,w1,w2}
chown 10001 "$dir"/{state,checkpoints,hold,w0,w1,w2}

# TLS as the Secret trainyard-tls holds it: ca.crt, tls.crt, tls.key (for 127.0.0.1).
openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj "/CN=trainyard test CA" \
  -keyout "$dir/tls/ca.key" -out "$dir/tls/ca.crt" 2>/dev/null
openssl req -newkey rsa:2048 -nodes -subj "/CN=trainyard-coordinator" \
  -keyout "$dir/tls/tls.key" -out "$dir/tls/tls.csr" 2>/dev/null
printf 'subjectAltName=IP:127.0.0.1,DNS:trainyard-coordinator\n' >"$dir/tls/ext.cnf"
openssl x509 -req -in "$dir/tls/tls.csr" -CA "$dir/tls/ca.crt" -CAkey "$dir/tls/ca.key" \
  -CAcreateserial -days 2 -extfile "$dir/tls/ext.cnf" -out "$dir/tls/tls.crt" 2>/dev/null
chmod 644 "$dir/tls/tls.key"

port=$(free_port)
metrics=$(free_port)
health=$(free_port)
coordinator=127.0.0.1:$port
# The coordinator with the flags of deploy/kubernetes/coordinator-statefulset.yaml (addresses on
# loopback, checkpoints in a mounted folder instead of s3://).
containers+=("$prefix-coordinator")
podman run -d --name "$prefix-coordinator" --network host \
  -v "$dir/state:/var/lib/trainyard" -v "$dir/checkpoints:$dir/checkpoints" \
  -v "$dir/tls:/etc/trainyard/tls:ro" \
  "$image" \
  --listen="$coordinator" --metrics_listen="127.0.0.1:$metrics" \
  --state_dir=/var/lib/trainyard --checkpoint_root="file://$dir/checkpoints" \
  --worker_timeout=10s --tls_cert=/etc/trainyard/tls/tls.crt \
  --tls_key=/etc/trainyard/tls/tls.key --health_listen="127.0.0.1:$health" >/dev/null
wait_for "the coordinator's admin token" 60 test -s "$dir/state/admin.token"
export TRAINYARD_COORDINATOR=$coordinator TRAINYARD_CA_FILE=$dir/tls/ca.crt
export TRAINYARD_TOKEN_FILE=$dir/state/admin.token
wait_for "the coordinator" 60 "${cli[@]}" workers

# Workers with the flags of deploy/kubernetes/worker-daemonset.yaml, each with its agent token.
for i in 0 1 2; do
  "${cli[@]}" token create "w$i" --role agent | tail -1 >"$dir/tokens/w$i"
  [ -s "$dir/tokens/w$i" ] || fail "no agent token for w$i"
  chmod 644 "$dir/tokens/w$i"
  containers+=("$prefix-w$i")
  podman run -d --name "$prefix-w$i" --network host --stop-timeout 40 \
    -v "$dir/w$i:/var/lib/trainyard-worker" -v "$dir/checkpoints:$dir/checkpoints" \
    -v "$dir/tls/ca.crt:/etc/trainyard/tls/ca.crt:ro" \
    -v "$dir/tokens:/etc/trainyard/agent-tokens:ro" \
    -v "$dir/hold:/hold" -e TRAINYARD_TEST_HOLD_DIR=/hold \
    --entrypoint /usr/local/bin/trainyard-worker "$image" \
    --coordinator="$coordinator" --name="w$i" --address=127.0.0.1 \
    --work_dir=/var/lib/trainyard-worker --grace_period=25s --metrics_listen=127.0.0.1:0 \
    --ca_file=/etc/trainyard/tls/ca.crt --tls_server_name=trainyard-coordinator \
    --token_file="/etc/trainyard/agent-tokens/w$i" --slots=1 >/dev/null
done
ready() { [ "$("${cli[@]}" workers | grep -c READY)" -eq 3 ]; }
wait_for "three READY workers" 60 ready
# Each worker says which LibTorch its trainer runs: the image's (2.x on Debian 13, 1.13 in the
# -debian12 variant).
libtorch=$(podman run --rm --network host --entrypoint /usr/local/bin/trainyard-trainer "$image" \
  --runtime | sed -n 's/^libtorch_version: "\(.*\)"$/\1/p')
echo "the image's trainer: LibTorch $libtorch"
case "$tag" in *-debian12) [[ "$libtorch" == 1.13.* ]] ;; *) [[ "$libtorch" == 2.* ]] ;; esac ||
  fail "image $image runs LibTorch $libtorch"
[ "$("${cli[@]}" workers | grep -c " $libtorch ")" -eq 3 ] ||
  fail "not every worker says it runs LibTorch $libtorch: $("${cli[@]}" workers)"

# Every attempt of the job waits after 20 updates past its start (the trainer's test hold) until
# the hold file goes: the preemption comes while the job is mid-run.
echo 20 >"$dir/hold/containers-dp"
chown 10001 "$dir/hold/containers-dp"
cat >"$dir/job.yaml" <<YAML
name: containers-dp
strategy: data_parallel
workers: 2
model: {builtin: mlp, args: {inputs: 16, hidden: [32], classes: 4}}
data:
  synthetic: {samples: 2048, features: 16, classes: 4, noise: 0.5}
  validation_split: 0.1
batch_size: 64
optimizer: {name: adamw, lr: 0.01}
max_steps: 60
checkpoint: {every_steps: 10}
log_every_steps: 5
seed: 7
YAML
job=$("${cli[@]}" submit "$dir/job.yaml")
echo "job $job submitted"
json() { "${cli[@]}" describe "$job" -o json; }
field() { json | /usr/bin/python3 -c "import json,sys; j=json.load(sys.stdin); print($1)"; }
at_hold() { [ "$(field "j.get('progress', {}).get('step', 0)")" -ge 20 ]; }
wait_for "the job at step 20" 180 at_hold

# SIGTERM to one of its workers' containers, as a spot reclaim does to a pod.
attempt_workers() {
  field "','.join(sorted({t['workerId'] for t in j['tasks'] if t.get('generation') == j['generation']}))"
}
first=$(attempt_workers)
third=$(for w in w0 w1 w2; do [[ ",$first," == *",$w,"* ]] || echo "$w"; done)
victim=${first%%,*}
echo "stopping the container of $victim"
podman stop -t 40 "$prefix-$victim" >/dev/null
restarted() { [ "$(field "len(j.get('restarts', []))")" -ge 1 ]; }
wait_for "a restart" 120 restarted
rm -f "$dir/hold/containers-dp"
final() { [[ "$(field "j['state']")" =~ ^(SUCCEEDED|FAILED|CANCELLED)$ ]]; }
wait_for "the job to end" 300 final

state=$(field "j['state']")
[ "$state" = SUCCEEDED ] || { json >&2; fail "the job ended $state"; }
reason=$(field "j['restarts'][0]['reason']")
lost=$(field "j['restarts'][0].get('stepsLost', 0)")
resumed=$(field "j['restarts'][0].get('resumedStep', 0)")
workers=$(attempt_workers)
echo "restart: $reason, resumed at step $resumed, $lost steps lost; last attempt on $workers"
[ "$reason" = PREEMPTED ] || fail "restart reason $reason, expected PREEMPTED"
[ "$lost" = 0 ] || fail "$lost steps lost"
[ "$resumed" -ge 20 ] || fail "resumed at step $resumed"
[[ ",$workers," != *",$victim,"* ]] || fail "the last attempt ran on the stopped worker $victim"
[[ ",$workers," == *",$third,"* ]] || fail "the job did not move to the third worker ($third): $workers"
# The admin token submitted it: its folder is the admin's under the root.
[ -s "$dir/checkpoints/admin/$job/final/model.safetensors" ] || fail "no exported model"

# A job's own program on the image's Python: a data-parallel script (Gloo) with the `trainyard`
# module, from a folder the host's CLI packs and uploads, on the two workers left. It checks that
# it runs the image's torch, the same LibTorch as the trainer's, and commits a checkpoint.
mkdir -p "$dir/program"
cat >"$dir/program/ddp.py" <<'PY'
import os, sys
import torch
import torch.distributed as dist
import trainyard

if not torch.__version__.startswith(sys.argv[1]):
    print(f"torch {torch.__version__}, not the trainer's LibTorch {sys.argv[1]}", file=sys.stderr)
    sys.exit(2)
dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(8, 2))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(trainyard.start_step + 1, 21):
    x = torch.randn(16, 8, generator=torch.Generator().manual_seed(step * 2 + rank))
    loss = model(x).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    trainyard.report(step, loss=loss.item(), total_steps=20)
    if trainyard.should_checkpoint(step):
        if rank == 0:
            torch.save(model.module.state_dict(), os.path.join(trainyard.checkpoint_dir, "model.pt"))
        trainyard.commit_checkpoint(step)
    if trainyard.should_stop(step):
        break
dist.destroy_process_group()
PY
cat >"$dir/program.yaml" <<YAML
name: containers-program
workers: 2
program:
  command: [python3, ddp.py, "${libtorch%%+*}"]
  workdir: $dir/program
  env: {OMP_NUM_THREADS: "1"}
checkpoint: {every_steps: 10}
YAML
job=$("${cli[@]}" submit "$dir/program.yaml")
echo "program job $job submitted"
wait_for "the program job to end" 300 final
state=$(field "j['state']")
[ "$state" = SUCCEEDED ] || { json >&2; "${cli[@]}" logs "$job" >&2 || true; fail "the program job ended $state"; }
step=$(field "j.get('progress', {}).get('step', 0)")
[ "$step" = 20 ] || fail "the program job reported step $step, not 20"
saved=$(find "$dir/checkpoints/admin/$job" -path '*/step-000000000020/g*/model.pt' -size +0)
[ -n "$saved" ] || fail "no committed checkpoint of step 20: $(find "$dir/checkpoints/admin/$job")"
echo "program job: SUCCEEDED at step 20 on the image's torch ${libtorch%%+*}, step 20 committed"
echo "PASS"
