#!/usr/bin/env python3
"""A straggler in a parameter_server job, synchronous and asynchronous.

  python3 bench/ps_straggler.py BUILD_DIR [STEPS] [RUNS]

Runs a local cluster (`trainyard up --workers 2 --slots 2`) and on it a job of 2 ranks and 1
shard (the dense MLP of bench/ddp_scaling.cc: 256 -> 1024 -> 1024 -> 10, global batch 64, SGD
with momentum), in mode sync and in mode async (max_staleness 4), each without and with a
straggler: rank 1's trainer is stopped and continued by signals (SIGSTOP for 30 ms, SIGCONT for
10 ms, over and over), so it runs a quarter of the time, as a worker on an overloaded or slower
machine does; on 2 cores shared by 2 ranks and a shard that makes it about 3 times slower (the
table shows by how much). Each rank's steps per second are the median of its 20-step
progress lines after the first two. Prints a markdown table of the medians over RUNS runs
(default 3) and each run's figures.
"""
import glob
import json
import os
import re
import signal
import statistics
import sys
import threading
import time

from local_cluster import LocalCluster

GLOBAL_BATCH = 64
WINDOW = 20


def job_yaml(name, mode, steps):
    servers = "{shards: 1, mode: async, max_staleness: 4}" if mode == "async" else "1"
    return f"""name: {name}
strategy: parameter_server
workers: 2
parameter_servers: {servers}
model:
  builtin: mlp
  args: {{inputs: 256, hidden: [1024, 1024], classes: 10}}
data:
  synthetic: {{samples: 8192, features: 256, classes: 10}}
batch_size: {GLOBAL_BATCH}
optimizer: {{name: sgd, lr: 0.01, momentum: 0.9}}
max_steps: {steps}
log_every_steps: {WINDOW}
seed: 3
"""


class Throttle(threading.Thread):
    """Keeps the process in `pid_glob`'s pid file to a third of the time until it exits."""

    def __init__(self, pid_glob, on_s=0.010, off_s=0.030):
        super().__init__(daemon=True)
        self.pid_glob, self.on_s, self.off_s = pid_glob, on_s, off_s
        self.done = threading.Event()

    def run(self):
        pid = None
        while pid is None and not self.done.is_set():
            for path in glob.glob(self.pid_glob):
                try:
                    pid = int(open(path).read().strip())
                except (OSError, ValueError):
                    pass
            time.sleep(0.01)
        try:
            while not self.done.is_set():
                os.kill(pid, signal.SIGSTOP)
                time.sleep(self.off_s)
                os.kill(pid, signal.SIGCONT)
                time.sleep(self.on_s)
        except (ProcessLookupError, TypeError):
            pass
        finally:
            if pid is not None:
                try:
                    os.kill(pid, signal.SIGCONT)
                except ProcessLookupError:
                    pass


def steps_per_second(log):
    rates = [float(m) / GLOBAL_BATCH for m in re.findall(r"samples_per_s=([0-9.]+)", log)]
    rates = rates[2:]
    return statistics.median(rates) if rates else float("nan")


def main():
    build = sys.argv[1] if len(sys.argv) > 1 else "build"
    steps = int(sys.argv[2]) if len(sys.argv) > 2 else 400
    runs = int(sys.argv[3]) if len(sys.argv) > 3 else 3
    rows = []
    with LocalCluster(build, workers=2, slots=2, prefix="ps_straggler.") as cluster:
        for _ in range(runs):
            for mode in ("sync", "async"):
                for straggler in (False, True):
                    name = f"{mode}-{'straggler' if straggler else 'even'}"
                    throttle = None
                    if straggler:
                        throttle = Throttle(os.path.join(cluster.state, "worker-*", "tasks",
                                                         f"{cluster.job_id(name)}.g1.r1", "pid"))
                        throttle.start()
                    began = time.time()
                    try:
                        job_id = cluster.run_job(name, job_yaml(name, mode, steps))
                    finally:
                        if throttle is not None:
                            throttle.done.set()
                            throttle.join()
                    wall = time.time() - began
                    rates = [steps_per_second(cluster.logs(job_id, "--rank", str(rank)))
                             for rank in (0, 1)]
                    rows.append({"mode": mode, "straggler": straggler, "rank0": rates[0],
                                 "rank1": rates[1], "wall": wall})
                    print(json.dumps(rows[-1]), file=sys.stderr)

    def median(mode, straggler, key):
        return statistics.median(r[key] for r in rows
                                 if r["mode"] == mode and r["straggler"] == straggler)

    print("| mode | rank 1 | rank 0 steps/s | rank 1 steps/s | rank 0 against no straggler | "
          "job wall time |")
    print("| --- | --- | ---: | ---: | ---: | ---: |")
    for mode in ("sync", "async"):
        base = median(mode, False, "rank0")
        for straggler in (False, True):
            r0 = median(mode, straggler, "rank0")
            r1 = median(mode, straggler, "rank1")
            wall = median(mode, straggler, "wall")
            print(f"| {mode} | {'slowed 3x' if straggler else 'normal'} | {r0:.1f} | {r1:.1f} | "
                  f"{r0 / base:.2f} | {wall:.1f} s |")
    print(f"\nmedian of {runs} runs of {steps} steps; each run's rank 0 / rank 1 steps/s:")
    for mode in ("sync", "async"):
        for straggler in (False, True):
            runs_text = " ".join(f"{r['rank0']:.1f}/{r['rank1']:.1f}" for r in rows
                                 if r["mode"] == mode and r["straggler"] == straggler)
            print(f"  {mode}, {'straggler' if straggler else 'no straggler'}: {runs_text}")


if __name__ == "__main__":
    main()
