#!/usr/bin/env bash
# A job's own program under Trainyard against the same program under torchrun (bench/torchrun.py:
# torchrun itself, with Debian 12's Python 3.11 fix), on this machine:
# bench/program_step.py (a small model, 2 ranks, Gloo, its own loop) started ROUNDS times each
# way, with and without Trainyard's module, then preempted and killed under Trainyard. Prints
# Markdown tables of the medians:
#   - steps per second after warm-up, and their ratio to torchrun's on the plain script;
#   - the CPU a step of the ranks' processes takes, and its ratio to torchrun's;
#   - from the launch (`trainyard submit`, or torchrun's command) to the program's process, to
#     `import torch` done, to the process group, to the first step;
#   - recovery from a preemption notice (SIGTERM to an agent) and from kill -9 of a machine (its
#     agent and its rank's processes), as `trainyard describe` splits it;
#   - the CPU that Trainyard's own processes (coordinator, agents, the ranks' hosts) take while
#     the program trains, against the program's own;
#   - the module's own cost a step, timed alone (bench/program_module_cost.py): under a
#     Trainyard host and with none.
# The steps/s ratios come with a 95 % interval (a bootstrap of the rounds' geometric mean): on a
# noisy machine it says how many rounds it takes to tell a gap of 1 %.
#
#   [PYTHON=python3] [MODES="plain module"] bench/program_vs_torchrun.sh [BUILD_DIR] [ROUNDS] [STEPS]
#   (defaults: build, 3, 400; MODES=plain runs the plain script alone, twice the rounds an hour)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$root/build}
rounds=${2:-3}
steps=${3:-400}
trainyard=$build/bin/trainyard
python=${PYTHON:-/usr/bin/python3}  # with torch; PYTHON= another
modes=${MODES:-plain module}
case " $modes " in *" plain "*) ;; *) echo "MODES must include plain (the ratios' base)" >&2; exit 1 ;; esac
[ -x "$trainyard" ] || { echo "build it first: make build" >&2; exit 1; }
"$python" -c "import torch" 2>/dev/null ||
  { echo "$python cannot import torch: PYTHON= a Python that can" >&2; exit 1; }

work=$(mktemp -d /tmp/trainyard-program-bench-XXXXXX)
up=
cleanup() { [ -n "$up" ] && kill -INT "$up" 2>/dev/null; wait 2>/dev/null; [ -n "${KEEP:-}" ] || rm -rf "$work"; }
trap cleanup EXIT
# The program's folder holds the program alone: it is the jobs' workdir, copied for every rank.
mkdir -p "$work/program"
cp "$root/bench/program_step.py" "$root/bench/program_module_cost.py" "$work/program/"

"$trainyard" up --workers 4 --slots 1 --port 0 --state-dir "$work/cluster" >"$work/up.log" 2>&1 &
up=$!
until [ -s "$work/cluster/coordinator.port" ]; do sleep 0.1; done
export TRAINYARD_COORDINATOR="127.0.0.1:$(tr -dc 0-9 <"$work/cluster/coordinator.port")"
until [ "$("$trainyard" workers 2>/dev/null | grep -c READY)" -eq 4 ]; do sleep 0.1; done
field() { "$trainyard" describe "$1" -o json | "$python" -c "import json, sys; j = json.load(sys.stdin); print($2)"; }

job_spec() {  # NAME MODULE_FLAG STEPS OUT
  cat <<SPEC
name: $1
workers: 2
program:
  command: [$python, program_step.py, --steps, "$3", --out, $4, --submitted, "$(date +%s.%N)" $2]
  workdir: file://$work/program
  env: {OMP_NUM_THREADS: "1"}
checkpoint: {every_steps: 100000}
SPEC
}

run_torchrun() {  # MODE ROUND
  local flag=; [ "$1" = module ] && flag=--module
  local port
  port=$("$python" -c "import socket; s = socket.socket(); s.bind(('', 0)); print(s.getsockname()[1])")
  OMP_NUM_THREADS=1 PYTHONPATH="$build/share/trainyard/python" timeout 600 \
    "$python" "$root/bench/torchrun.py" \
    --nproc_per_node 2 --master_port "$port" "$work/program/program_step.py" --steps "$steps" \
    --out "$work/torchrun-$1-$2.json" --submitted "$(date +%s.%N)" $flag >"$work/torchrun.log" 2>&1
}
run_trainyard() {  # MODE ROUND
  local flag=; [ "$1" = module ] && flag=", --module"
  local out="$work/trainyard-$1-$2.json" id
  job_spec "bench-$1" "$flag" "$steps" "$out" >"$work/job.yaml"
  id=$("$trainyard" submit "$work/job.yaml" --wait 2>/dev/null | head -1)
  [ -s "$out" ] || { echo "the job $id wrote no result" >&2; "$trainyard" describe "$id" >&2; exit 1; }
}
# Each pair in turn in both orders (torchrun first in odd rounds, Trainyard in even ones), so
# that neither always runs on a machine the other has just used.
for r in $(seq "$rounds"); do
  for mode in $modes; do
    if [ $((r % 2)) -eq 1 ]; then
      run_torchrun $mode "$r"; run_trainyard $mode "$r"
    else
      run_trainyard $mode "$r"; run_torchrun $mode "$r"
    fi
  done
done

"$python" - "$work" "$rounds" <<'PY'
import json, math, os, random, statistics, sys
work, rounds = sys.argv[1], int(sys.argv[2])
def runs(name):
    return [json.load(open(f"{work}/{name}-{r}.json")) for r in range(1, rounds + 1)]
def med(rs, f):
    return statistics.median(f(x) for x in rs)
base = med(runs("torchrun-plain"), lambda x: x["steps_per_second"])
# Each round runs torchrun and Trainyard one after the other, so the ratio of a round's pair
# cancels what drifts between rounds (the machine's speed): its median is the figure to quote.
print(f"| steps/s, median of {rounds} (2 ranks, Gloo) | steps/s | ratio to torchrun, plain "
      "script | ratio to torchrun on the same script, round by round: median (min to max) | "
      "geometric mean [95 % interval] |")
print("| --- | --- | --- | --- | --- |")
CASES = [("torchrun-plain", "torchrun, plain script", None),
         ("torchrun-module", "torchrun, with the module (its agreement only)", "torchrun-plain"),
         ("trainyard-plain", "Trainyard, plain script", "torchrun-plain"),
         ("trainyard-module", "Trainyard, with the module", "torchrun-module")]
CASES = [c for c in CASES if os.path.exists(f"{work}/{c[0]}-1.json")]
def ratios(name, peer, ratio):
    return sorted(ratio(a, b) for a, b in zip(runs(name), runs(peer)))
def paired(name, peer, ratio):
    """The median (min to max) over the rounds of ratio(this run, the peer's run)."""
    r = ratios(name, peer, ratio)
    return f"{statistics.median(r):.3f} ({r[0]:.3f} to {r[-1]:.3f})"
def interval(r):
    """The geometric mean of the rounds' ratios and its 95 % bootstrap interval."""
    logs = [math.log(x) for x in r]
    draw = random.Random(0)
    means = sorted(statistics.fmean(draw.choices(logs, k=len(logs))) for _ in range(4000))
    return (f"{math.exp(statistics.fmean(logs)):.3f} [{math.exp(means[100]):.3f} to "
            f"{math.exp(means[3899]):.3f}]")
for name, label, peer in CASES:
    s = med(runs(name), lambda x: x["steps_per_second"])
    rate = lambda a, b: a["steps_per_second"] / b["steps_per_second"]
    cells = f"{paired(name, peer, rate)} | {interval(ratios(name, peer, rate))}" if peer else " |"
    print(f"| {label} | {s:.1f} | {s / base:.3f} | {cells} |")
print()
print(f"| CPU milliseconds a step, median of {rounds} | the ranks' processes | torchrun's over "
      "this, round by round |")
print("| --- | --- | --- |")
for name, label, peer in CASES:
    cpu = lambda x: x["cpu_seconds_per_step"]
    cell = paired(name, peer, lambda a, b: cpu(b) / cpu(a)) if peer else ""
    print(f"| {label} | {1000 * med(runs(name), cpu):.3f} | {cell} |")
print()
print(f"| seconds from the launch, median of {rounds} | to rank 0's process | to the last "
      "rank's | + import torch (rank 0) | + process group | + first step |")
print("| --- | --- | --- | --- | --- | --- |")
for name, label in [("torchrun-plain", "torchrun"), ("trainyard-plain", "Trainyard (`submit`)")]:
    rs = runs(name)
    a = med(rs, lambda x: x["started"] - x["submitted"])
    z = med(rs, lambda x: x["last_started"] - x["submitted"])
    b = med(rs, lambda x: x["imported"] - x["started"])
    c = med(rs, lambda x: x["grouped"] - x["imported"])
    d = med(rs, lambda x: x["first_step"] - x["grouped"])
    print(f"| {label} | {a:.2f} | {z:.2f} | {b:.2f} | {c:.2f} | {d:.2f} |")
PY

# Recovery: a long job preempted, then a machine of it killed.
out="$work/recovery.json"
job_spec bench-recovery ", --module" 100000000 "$out" | sed 's/every_steps: 100000/every_steps: 200/' >"$work/job.yaml"
id=$("$trainyard" submit "$work/job.yaml" 2>/dev/null | head -1)
wait_step() {  # until attempt GEN has committed and stepped past its start by 300
  until [ "$(field "$id" "j['state'] == 'RUNNING' and int(j['generation']) == $1 and int(j.get('committedStep', -1)) >= 0 and int(j['progress'].get('step', 0)) - int(j['progress'].get('attemptStartStep', 0)) >= 300")" = True ]; do sleep 0.2; done
}
wait_recovered() {  # until restart N has recovered
  until [ "$(field "$id" "len(j.get('restarts', [])) >= $1 and j['restarts'][$1 - 1].get('recovered', False)")" = True ]; do sleep 0.2; done
}
agent_of_rank0() {
  local w; w=$(field "$id" "[t['workerId'] for t in j['tasks'] if t.get('rank', 0) == 0 and t['generation'] == j['generation']][0]")
  "$trainyard" workers | awk -v w="$w" '$1 == w {print $4}'
}
wait_step 1
# Where the CPU goes while it trains (its checkpoints every 200 steps included): Trainyard's own
# processes against the program's ranks, over 10 s.
cpu_seconds() {  # PATTERN: CPU seconds so far of the processes whose command line matches
  "$python" - "$1" <<'PY'
import os, re, sys
total = 0
for pid in filter(str.isdigit, os.listdir("/proc")):
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            command = f.read().replace(b"\0", b" ").decode(errors="replace")
        if pid != str(os.getpid()) and re.search(sys.argv[1], command):
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])  # utime, stime
    except OSError:
        pass
print(total / os.sysconf("SC_CLK_TCK"))
PY
}
kinds=("trainyard-coordinator .*$work" "trainyard-worker .*$work" "trainyard-trainer .*$work" "program_step.py .*$work")
before=(); for k in "${kinds[@]}"; do before+=("$(cpu_seconds "$k")"); done
start=$(date +%s.%N)
sleep 10
after=(); for k in "${kinds[@]}"; do after+=("$(cpu_seconds "$k")"); done
cpu_table=$("$python" - "$start" "$(date +%s.%N)" "${before[@]}" "${after[@]}" <<'PY'
import sys
start, end = float(sys.argv[1]), float(sys.argv[2])
before, after = [float(x) for x in sys.argv[3:7]], [float(x) for x in sys.argv[7:11]]
names = ["coordinator", "agents (4)", "hosts (the ranks' trainer processes, 2)", "the program's ranks (2)"]
print(f"| CPU over {end - start:.1f} s of training | CPU seconds | share of one core |")
print("| --- | ---: | ---: |")
for name, b, a in zip(names, before, after):
    print(f"| {name} | {a - b:.2f} | {100 * (a - b) / (end - start):.2f} % |")
PY
)
kill -TERM "$(agent_of_rank0)"
wait_recovered 1
wait_step 2
agent=$(agent_of_rank0)
hosts=$(pgrep -P "$agent" || true)
kill -9 "$agent" $hosts
wait_recovered 2
"$trainyard" cancel "$id" >/dev/null
echo
echo "| recovery (seconds) | lost steps | total | detect | schedule | start | rendezvous | restore | first step (the program's own start in it) |"
echo "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"
field "$id" "'\n'.join('| {} | {} | {:.1f} | {:.1f} | {:.1f} | {:.1f} | {:.1f} | {:.1f} | {:.1f} |'.format(r['reason'].lower(), r.get('stepsLost', 0), r.get('recoverySeconds', 0), r.get('detectionSeconds', 0), r.get('schedulingSeconds', 0), r.get('startSeconds', 0), r.get('rendezvousSeconds', 0), r.get('checkpointLoadSeconds', 0), r.get('firstStepSeconds', 0)) for r in j['restarts'])"
echo
echo "$cpu_table"

# The module's own cost a step, timed alone: as a one-rank job (under its host), and bare.
cost_spec() {  # STEPS SENDS OUT
  cat <<SPEC
name: bench-module-cost
workers: 1
program:
  command: [$python, program_module_cost.py, "$1", "$2", $3]
  workdir: file://$work/program
checkpoint: {every_steps: 100000000}
SPEC
}
for r in 1 2 3; do
  cost_spec 200000 2000 "$work/cost-host-$r.json" >"$work/job.yaml"
  "$trainyard" submit "$work/job.yaml" --wait >/dev/null 2>&1
  PYTHONPATH="$build/share/trainyard/python" "$python" "$work/program/program_module_cost.py" \
    200000 2000 "$work/cost-bare-$r.json"
done
"$python" - "$work" <<'PY'
import json, statistics, sys
work = sys.argv[1]
def med(kind, field):
    return statistics.median(json.load(open(f"{work}/cost-{kind}-{r}.json"))[field] for r in (1, 2, 3))
print()
print("| the module's own cost, median of 3 | a step (report, should_checkpoint, should_stop) "
      "| a report sent (at most every 50 ms) | a second of 10 ms steps |")
print("| --- | ---: | ---: | ---: |")
for kind, label in [("bare", "no host (as under torchrun)"), ("host", "under a Trainyard host")]:
    step, send = med(kind, "per_step_us"), med(kind, "per_send_us")
    print(f"| {label} | {step:.2f} us | {send:.1f} us | {(100 * step + 20 * send) / 1e4:.3f} % |")
PY
