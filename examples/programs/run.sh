#!/usr/bin/env bash
# Your own programs as jobs, end to end: writes the data (write_images.py's pictures, the King
# James Bible as text) under WORK (default /tmp/trainyard-examples/programs), starts a local
# cluster of its own (4 workers of 1 slot, `trainyard up`), and runs resnet.yaml then gpt.yaml on
# it. Each job is preempted once it has committed a checkpoint and trained on (SIGTERM to the
# agent of its rank 0, as a cloud's notice does): its ranks save at the step they agree on, the
# job resumes on the spare workers, and `describe` must show the restart as preempted with 0
# steps lost. Prints each job's restarts and last figures; exit code 0 when both succeed so.
#
#   examples/programs/run.sh [WORK]
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
work=${1:-/tmp/trainyard-examples/programs}
case "$work" in /*) ;; *) work="$PWD/$work" ;; esac
trainyard=$(command -v trainyard || echo "$root/build/bin/trainyard")
[ -x "$trainyard" ] || { echo "run.sh: no trainyard binary; build it or put it on PATH" >&2; exit 1; }
python=/usr/bin/python3  # Debian's, with PyTorch and torchvision

mkdir -p "$work"
echo "==> The data in $work"
[ -d "$work/images" ] || "$python" "$here/write_images.py" "$work/images"
if [ ! -s "$work/kjv.txt" ]; then
  command -v bible >/dev/null || { echo "run.sh: no \`bible\`: install Debian's bible-kjv" >&2; exit 1; }
  bible -f gen1:1-rev22:21 >"$work/kjv.txt"
fi

echo "==> A local cluster of 4 workers"
state="$work/cluster"
rm -rf "$state"
"$trainyard" up --workers 4 --slots 1 --port 0 --state-dir "$state" >"$work/cluster.log" 2>&1 &
up=$!
trap 'kill -INT $up 2>/dev/null; wait $up 2>/dev/null || true' EXIT
for _ in $(seq 600); do
  [ -s "$state/coordinator.port" ] && break
  kill -0 $up 2>/dev/null || { cat "$work/cluster.log" >&2; exit 1; }
  sleep 0.1
done
export TRAINYARD_COORDINATOR="127.0.0.1:$(tr -dc 0-9 <"$state/coordinator.port")"
for _ in $(seq 600); do
  [ "$("$trainyard" workers 2>/dev/null | grep -c READY)" -eq 4 ] && break
  sleep 0.1
done

# The job's JSON, and a field of it by a Python expression over `j`.
field() { "$trainyard" describe "$1" -o json | "$python" -c "import json, sys; j = json.load(sys.stdin); print($2)"; }

run_preempted() {
  local spec=$work/$(basename "$1") after=$2
  # The spec with WORK for its data, and this folder (packed by `submit`) for its workdir.
  sed "s|/tmp/trainyard-examples/programs|$work|g; s|^  workdir: \.$|  workdir: $here|" "$1" >"$spec"
  echo "==> $(basename "$spec"): submitted, preempted after step $after"
  local id
  id=$("$trainyard" submit "$spec" | tail -1)
  # Once it has a checkpoint and has trained past it, the agent of its rank 0 gets SIGTERM.
  until [ "$(field "$id" "int(j.get('committedStep', '-1')) >= 0 and int(j.get('progress', {}).get('step', 0)) >= $after")" = True ]; do
    case "$(field "$id" "j['state']")" in SUCCEEDED|FAILED|CANCELLED)
      "$trainyard" describe "$id" >&2
      echo "run.sh: $id ended before it could be preempted" >&2; return 1 ;; esac
    sleep 0.2
  done
  local worker pid
  worker=$(field "$id" "[t['workerId'] for t in j['tasks'] if t.get('rank', 0) == 0 and int(t.get('generation', 0)) == int(j['generation'])][0]")
  pid=$("$trainyard" workers | awk -v w="$worker" '$1 == w {print $4}')
  kill -TERM "$pid"
  until [ "$(field "$id" "j['state']")" = SUCCEEDED ]; do
    case "$(field "$id" "j['state']")" in FAILED|CANCELLED)
      "$trainyard" describe "$id" >&2; return 1 ;; esac
    sleep 0.5
  done
  "$trainyard" describe "$id" | sed -n '/^Step:/p;/^Metrics:/p;/^Val/p;/^Restarts:/,/^$/p'
  local check
  check=$(field "$id" "len(j['restarts']) == 1 and j['restarts'][0]['reason'] == 'PREEMPTED' and int(j['restarts'][0].get('stepsLost', 0)) == 0")
  [ "$check" = True ] || { echo "run.sh: $id was not preempted with 0 steps lost" >&2; return 1; }
  echo "$id: preempted mid-run, resumed with 0 steps lost"
}

run_preempted "$here/resnet.yaml" 25
run_preempted "$here/gpt.yaml" 60
