#!/usr/bin/env python3
"""Follows a job for `make demo` through `trainyard describe -o json`.

  demo_follow.py TRAINYARD JOB checkpoint   waits until the job runs with a committed checkpoint
                                            and prints "WORKER PID" of the worker running
                                            rank 0 (the one the demo preempts)
  demo_follow.py TRAINYARD JOB end          prints each change of state until the job ends
  demo_follow.py TRAINYARD JOB check WORKER checks that the job survived the preemption of WORKER
                                            with no step lost; exit 0 only then

Exit code 1 (with the reason on stderr) when the job does not do what the demo shows.
"""
import json
import subprocess
import sys
import time

POLL_S = 0.1
TIMEOUT_S = 300


def cli_json(trainyard, *args):
    """The JSON a CLI command prints; a call that fails (a loaded machine, a busy coordinator) is
    tried again for up to 30 s before its error stops the demo."""
    deadline = time.time() + 30
    while True:
        run = subprocess.run([trainyard, *args, "-o", "json"], capture_output=True, text=True)
        if run.returncode == 0:
            return json.loads(run.stdout)
        if time.time() > deadline:
            sys.exit("demo: trainyard %s failed (exit %d): %s" % (" ".join(args), run.returncode,
                                                                run.stderr.strip()))
        time.sleep(1)


def describe(trainyard, job):
    return cli_json(trainyard, "describe", job)


def workers(trainyard):
    return cli_json(trainyard, "workers").get("workers", [])


def num(obj, key):
    return int(obj.get(key, 0))


def fail(message):
    print(f"demo: {message}", file=sys.stderr)
    sys.exit(1)


def placement(job):
    gen = num(job, "generation")
    tasks = sorted((t for t in job.get("tasks", []) if num(t, "generation") == gen),
                   key=lambda t: num(t, "rank"))
    return [t.get("workerId", "?") for t in tasks]


def wait_checkpoint(trainyard, job_id):
    deadline = time.time() + TIMEOUT_S
    while time.time() < deadline:
        job = describe(trainyard, job_id)
        state = job.get("state")
        if state in ("SUCCEEDED", "FAILED", "CANCELLED"):
            fail(f"job {job_id} ended ({state}) before the demo could preempt a worker")
        committed = int(job.get("committedStep", -1))
        if state == "RUNNING" and committed > 0:
            rank0 = placement(job)[0]
            pid = next((w.get("pid") for w in workers(trainyard) if w.get("id") == rank0), None)
            if pid is None:
                fail(f"worker {rank0} shows no process id")
            total = num(job.get("progress", {}), "totalSteps")
            print(f"    RUNNING on {', '.join(placement(job))}: checkpoint of step {committed} "
                  f"of {total} committed", file=sys.stderr)
            print(rank0, pid)
            return
        time.sleep(POLL_S)
    fail(f"job {job_id} did not commit a checkpoint within {TIMEOUT_S}s")


def follow_to_end(trainyard, job_id):
    deadline = time.time() + TIMEOUT_S
    last = ("RUNNING", 1)  # what the checkpoint step has shown already
    while time.time() < deadline:
        job = describe(trainyard, job_id)
        state = job.get("state")
        progress = job.get("progress", {})
        key = (state, num(job, "generation"))
        if key != last:
            last = key
            # A running job's reported step trails by up to a second: name its workers instead.
            if state == "RUNNING":
                line = f"    RUNNING on {', '.join(placement(job))}"
            else:
                line = f"    {state} at step {num(progress, 'step')} of {num(progress, 'totalSteps')}"
            print(line, flush=True)
        if state in ("SUCCEEDED", "FAILED", "CANCELLED"):
            return
        time.sleep(POLL_S)
    fail(f"job {job_id} did not end within {TIMEOUT_S}s")


def check(trainyard, job_id, victim):
    job = describe(trainyard, job_id)
    if job.get("state") != "SUCCEEDED":
        fail(f"job {job_id} ended {job.get('state')}: {job.get('reason', '')}")
    restarts = job.get("restarts", [])
    if len(restarts) != 1:
        fail(f"job {job_id} restarted {len(restarts)} times; the demo expects exactly 1")
    r = restarts[0]
    if r.get("reason") != "PREEMPTED" or not r.get("recovered"):
        fail(f"the restart was {r.get('reason')} (recovered: {r.get('recovered', False)}): "
             f"{r.get('message', '')}")
    if victim not in r.get("message", ""):
        fail(f"the restart does not name the preempted {victim}: {r.get('message', '')}")
    lost = num(r, "stepsLost")
    if lost != 0:
        fail(f"{lost} steps were lost in the restart")
    now = placement(job)
    if victim in now:
        fail(f"the job ended on the preempted {victim}")
    print(f"==> Preempted {victim} at step {num(r, 'lastStep')}; the job resumed at step "
          f"{num(r, 'resumedStep')} on {', '.join(now)} after "
          f"{float(r.get('recoverySeconds', 0)):.1f}s, 0 steps lost, and SUCCEEDED.")


def main():
    if len(sys.argv) < 4:
        print(__doc__, file=sys.stderr)
        sys.exit(2)
    trainyard, job_id, mode = sys.argv[1:4]
    if mode == "checkpoint":
        wait_checkpoint(trainyard, job_id)
    elif mode == "end":
        follow_to_end(trainyard, job_id)
    elif mode == "check" and len(sys.argv) == 5:
        check(trainyard, job_id, sys.argv[4])
    else:
        print(__doc__, file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
