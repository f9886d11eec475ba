#!/usr/bin/python3
"""Chaos on a network of hosts (tests/hosts): the coordinator, s3rver and four worker agents each
on a host of its own, over TLS and tokens. For `--minutes` (10), a random fault every 20 to 40 s
hits a random worker host: kill (every process, SIGKILL; the agent is started again 5 s later),
cut (its link down for 5 to 10 s), partition (it and the coordinator cannot reach each other for
5 to 10 s; its peers can), freeze (SIGSTOP for 5 to 10 s), preempt (SIGTERM to its agent, started
again 5 s later) or blip (its link down for 500 ms). Meanwhile three jobs train at all times (two
data-parallel, one parameter-server; fixed world sizes): each that ends is replaced by the next of
its kind. Every job must SUCCEED, and because resume is exact, each one's exported model must
equal bit for bit the model of the same spec run with no fault (`trainyard up` on one machine).

Goodput: a job's clean time is the median time from start to end of the jobs of its kind that
ran between faults (none began from 15 s before the job started until it ended: the same hosts
and the same company, no fault); a job's goodput is that clean time over its own time from its
start to its end (the part of its time spent on steps that count), and the overall figure the
sum of the clean times over the sum of the jobs' times. The time lost is split, from the jobs' restart records, into
detection (the fault until the coordinator acted), restart (stopping the gang, backoff, waiting
for capacity, starting the processes and their rendezvous), checkpoint load, steps redone (steps
lost at the clean run's step time) and the rest (the first step again, and slowdowns that
restart nothing: a freeze, a cut or a blip that the ranks ride through).

Prints what happened (faults by kind, restarts by reason, steps lost, goodput) and exits 1 if any
job failed or ended with another model.

Needs root (namespaces) and s3rver (scripts/install-deps.sh).

    bench/chaos_hosts.py --bin-dir build/bin [--minutes 10] [--seed 1] [--faults-per-minute 1]

A fault comes every 30 to 90 s at the default one a minute (every 0.5/F to 1.5/F minutes).
"""

import argparse
import collections
import os
import random
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "hosts"))
import cluster as cluster_lib  # noqa: E402
import hosts  # noqa: E402
import multi_host_test as mht  # noqa: E402

WORKERS = ["w1", "w2", "w3", "w4"]
# name -> (strategy, steps); a data-parallel job trains about 150 steps/s across hosts here.
KINDS = {"dp-a": ("data_parallel", 4000), "dp-b": ("data_parallel", 6000),
         "ps": ("parameter_server", 3000)}
FAULTS = ["kill", "cut", "partition", "freeze", "preempt", "blip"]


def spec_of(kind):
    """Every job of a kind has the same spec, name included: the reference is one run of it."""
    strategy, steps = KINDS[kind]
    text = mht.spec(kind, strategy, steps)
    # Checkpoints often enough that a restart loses little; the same spec for the reference.
    text = text.replace("checkpoint: {every_steps: 10, keep_last: 2}",
                        "checkpoint: {every_steps: 200, keep_last: 2}")
    return text.replace("restart: {max_failures: 0}", "restart: {max_failures: 0}\n"
                        "stall_timeout: 120s")


class Chaos:
    def __init__(self, bed, cluster, rng):
        self.bed = bed
        self.cluster = cluster
        self.rng = rng
        self.pending = []  # (when, action)
        self.counts = collections.Counter()
        self.times = []  # when each fault began (unix seconds)

    def apply(self):
        host = self.rng.choice(WORKERS)
        fault = self.rng.choice(FAULTS)
        now = time.monotonic()
        lasting = self.rng.uniform(5, 10)
        if self.cluster.procs[host].poll() is not None or any(h == host for _, _, h in
                                                               self.pending):
            return  # that host is already down or faulted
        self.counts[fault] += 1
        self.times.append(time.time())
        print("%s %s %s" % (time.strftime("%H:%M:%S"), fault, host), file=sys.stderr, flush=True)
        if fault == "kill":
            self.bed.kill(host)
            self.pending.append((now + 5, "restart", host))
        elif fault == "cut":
            self.bed.cut(host)
            self.pending.append((now + lasting, "heal", host))
        elif fault == "partition":
            self.bed.partition(self.cluster.coordinator, host)
            self.pending.append((now + lasting, "heal", host))
        elif fault == "freeze":
            self.bed.freeze(host)
            self.pending.append((now + lasting, "thaw", host))
        elif fault == "preempt":
            self.cluster.procs[host].send_signal(15)
            self.pending.append((now + 5, "restart", host))
        elif fault == "blip":
            self.bed.cut(host)
            time.sleep(0.5)
            self.bed.heal(host)

    def settle(self, everything=False):
        now = time.monotonic()
        keep = []
        for when, action, host in self.pending:
            if not everything and when > now:
                keep.append((when, action, host))
                continue
            if action == "heal":
                self.bed.heal(host)
            elif action == "thaw":
                self.bed.thaw(host)
            elif action == "restart":
                self.bed.heal(host)
                self.bed.kill(host)  # what is left of it
                self.cluster.procs[host].wait(timeout=60)
                self.cluster.start_worker(host)
        self.pending = keep


def clean_seconds(done, fault_times):
    """Each kind's median time from start to end among its jobs that no fault came near."""
    walls = collections.defaultdict(list)
    for kind, job in done:
        if job["state"] != "SUCCEEDED" or job.get("restarts"):
            continue
        start = int(job["startedUnixMs"]) / 1000.0
        end = int(job["finishedUnixMs"]) / 1000.0
        if not any(start - 15 <= t <= end for t in fault_times):
            walls[kind].append(wall_seconds(job))
    return {kind: statistics.median(w) for kind, w in walls.items()}, {
        kind: len(w) for kind, w in walls.items()}


def wall_seconds(job):
    return (int(job["finishedUnixMs"]) - int(job["startedUnixMs"])) / 1000.0


def goodput_report(done, clean):
    """Goodput per kind and overall, and where the rest of the time went."""
    useful = total = 0.0
    parts = collections.Counter()
    per_kind = collections.defaultdict(lambda: [0.0, 0.0])
    for kind, job in done:
        if job["state"] != "SUCCEEDED" or kind not in clean:
            continue
        wall = wall_seconds(job)
        useful += clean[kind]
        total += wall
        per_kind[kind][0] += clean[kind]
        per_kind[kind][1] += wall
        step_seconds = clean[kind] / KINDS[kind][1]
        for r in job.get("restarts", []):
            parts["detection"] += float(r.get("detectionSeconds", 0))
            parts["restart"] += (float(r.get("schedulingSeconds", 0)) +
                                 float(r.get("startSeconds", 0)) +
                                 float(r.get("rendezvousSeconds", 0)))
            parts["checkpoint load"] += float(r.get("checkpointLoadSeconds", 0))
            parts["steps redone"] += int(r.get("stepsLost", 0)) * step_seconds
    lost = total - useful
    parts["the rest"] = lost - sum(parts.values())
    lines = ["goodput %.1f %% (%.0f s on steps that count of %.0f s); by kind: %s" % (
        100 * useful / total if total else 0, useful, total,
        ", ".join("%s %.1f %%" % (k, 100 * u / t) for k, (u, t) in sorted(per_kind.items())))]
    lines.append("time lost %.0f s: %s" % (lost, ", ".join(
        "%s %.0f s" % (name, parts[name]) for name in
        ("detection", "restart", "checkpoint load", "steps redone", "the rest"))))
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--bin-dir", required=True)
    parser.add_argument("--minutes", type=float, default=10)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--faults-per-minute", type=float, default=1.0)
    args = parser.parse_args()
    if os.geteuid() != 0:
        sys.exit("hosts need root (network namespaces)")
    mht.BIN_DIR = os.path.abspath(args.bin_dir)
    rng = random.Random(args.seed)
    print("reference runs on one machine...", file=sys.stderr, flush=True)
    reference = mht.loopback_models({k: spec_of(k) for k in KINDS})
    bed = hosts.Bed.up(["coord", "s3"] + WORKERS)
    bed.remove_on_exit()
    cluster = cluster_lib.HostCluster(bed, args.bin_dir, WORKERS)
    chaos = Chaos(bed, cluster, rng)
    jobs = {}  # id -> kind
    done = []
    failed = True  # until the run ends with every job as it should be
    try:
        cluster.start()

        def submit(kind):
            # As any script would: a call that fails to connect is tried again.
            for attempt in range(5):
                try:
                    jobs[cluster.submit(spec_of(kind))] = kind
                    return
                except cluster_lib.ClusterError as e:
                    if attempt == 4:
                        raise
                    print("submit failed, trying again: %s" % str(e).splitlines()[-1],
                          file=sys.stderr, flush=True)
                    time.sleep(1)

        gap = 60.0 / args.faults_per_minute

        for kind in KINDS:
            submit(kind)
        end = time.monotonic() + args.minutes * 60
        next_fault = time.monotonic() + rng.uniform(0.5 * gap, 1.5 * gap)
        while time.monotonic() < end:
            chaos.settle()
            if time.monotonic() >= next_fault:
                chaos.apply()
                next_fault = time.monotonic() + rng.uniform(0.5 * gap, 1.5 * gap)
            for job_id, kind in list(jobs.items()):
                try:
                    job = cluster.job(job_id)
                except cluster_lib.ClusterError:
                    continue  # the coordinator's host may be unreachable a moment
                if job["state"] in ("SUCCEEDED", "FAILED", "CANCELLED"):
                    done.append((kind, job))
                    del jobs[job_id]
                    submit(kind)
            time.sleep(1)
        chaos.settle(everything=True)
        cluster.wait_workers(len(WORKERS))
        for job_id, kind in list(jobs.items()):
            done.append((kind, cluster.wait(job_id, lambda j: j["state"] in (
                "SUCCEEDED", "FAILED", "CANCELLED"), timeout=600, what="the end")))
        bad = []
        restarts = collections.Counter()
        lost = 0
        for kind, job in done:
            for r in job.get("restarts", []):
                restarts[r["reason"]] += 1
                lost += int(r.get("stepsLost", 0))
            if job["state"] != "SUCCEEDED":
                bad.append("%s %s: %s" % (job["id"], job["state"], job.get("reason")))
                continue
            uri = job["modelUri"]
            if cluster.s3_get(uri[len("s3://ckpt/"):]) != reference[kind]:
                bad.append("%s: the model differs from the run without faults" % job["id"])
        print("chaos for %.0f min: %d faults (%s); %d jobs, %d succeeded with the model of the "
              "run without faults; restarts: %s; steps lost in all: %d" % (
                  args.minutes, sum(chaos.counts.values()),
                  ", ".join("%s %d" % kv for kv in sorted(chaos.counts.items())), len(done),
                  len(done) - len(bad),
                  ", ".join("%s %d" % kv for kv in sorted(restarts.items())) or "none", lost))
        clean, samples = clean_seconds(done, chaos.times)
        print("clean times (median of the jobs no fault came near): %s" % ", ".join(
            "%s %.1f s (%d jobs)" % (k, clean[k], samples[k]) for k in sorted(clean)))
        print(goodput_report(done, clean))
        for line in bad:
            print("FAIL: " + line)
        failed = bool(bad)
        return 1 if bad else 0
    except Exception:
        if os.environ.get("CHAOS_GDB"):
            import subprocess
            pid = cluster.procs["coordinator"].pid
            out = subprocess.run(["gdb", "-p", str(pid), "-batch", "-ex", "thread apply all bt 12"],
                                 capture_output=True, text=True).stdout
            with open(os.environ["CHAOS_GDB"], "w") as f:
                f.write(out)
        for name in sorted(os.listdir(cluster.dir)):
            if name.endswith(".log"):
                with open(cluster.path(name), errors="replace") as log:
                    print("==== %s\n%s" % (name, log.read()[-6000:]), file=sys.stderr)
        raise
    finally:
        chaos.settle(everything=True)
        cluster.stop()
        bed.down()
        if failed:
            # Kept for the post-mortem: the coordinator's and every agent's log, the task folders.
            print("the cluster's folder is kept: %s" % cluster.dir, file=sys.stderr)
        else:
            cluster.cleanup()


if __name__ == "__main__":
    sys.exit(main())
