#!/usr/bin/python3
"""Time to recover on a network of hosts (tests/hosts): the coordinator, s3rver and three worker
agents each on a host of its own, over TLS and tokens, with the default settings. For each fault,
`--runs` times: a 2-rank data-parallel job is held 30 updates in (5 past its last checkpoint, so
that a restart loses exactly 5 steps), the fault hits the host of its rank 0, and the job's own
restart record (describe -o json) gives the split. Prints the medians as a markdown table.

Faults: kill (every process of the host, SIGKILL: its peers get resets), cut (its link down:
nobody hears anything), freeze (every process SIGSTOPped), partition (it cannot reach the
coordinator, nor the coordinator it, but it reaches its peers), preempt (SIGTERM to its agent:
a preemption notice).

"From the fault" is measured from the moment this script applies it to the first step of the next
attempt (the record's detection time plus its recovery seconds; one clock, one machine).
"Detection" is the coordinator's: from the fault to the moment it acted.

Needs root (namespaces) and s3rver (scripts/install-deps.sh).

    bench/recovery_hosts.py --bin-dir build/bin [--runs 5] [--faults kill,cut,freeze,partition,preempt]
"""

import argparse
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests",
                                "hosts"))
import cluster as cluster_lib  # noqa: E402
import hosts  # noqa: E402

HELD_AFTER = 30
SPEC = """name: {name}
strategy: data_parallel
workers: 2
model: {{builtin: mlp, args: {{inputs: 16, hidden: [64], classes: 4}}}}
data: {{synthetic: {{samples: 4096, features: 16, classes: 4, noise: 1.0}}}}
batch_size: 64
optimizer: {{name: sgd, lr: 0.05, momentum: 0.9}}
max_steps: 100000
seed: 11
checkpoint: {{every_steps: 25, keep_last: 2}}
"""


def run_once(bed, cluster, fault, n):
    name = "%s-%d" % (fault, n)
    cluster.hold(name, HELD_AFTER)
    job_id = cluster.submit(SPEC.format(name=name))
    job = cluster.wait(job_id, lambda j: j["state"] == "RUNNING" and
                       int(j.get("progress", {}).get("step", 0)) >= HELD_AFTER and
                       int(j.get("committedStep", 0)) >= 25, timeout=120, what="held")
    victim = cluster.worker_of(job)
    fault_at = time.time()
    if fault == "kill":
        bed.kill(victim)
    elif fault == "cut":
        bed.cut(victim)
    elif fault == "freeze":
        bed.freeze(victim)
    elif fault == "partition":
        bed.partition(cluster.coordinator, victim)
    elif fault == "preempt":
        cluster.procs[victim].send_signal(15)
    recovered = cluster.wait(
        job_id, lambda j: any(r.get("recovered") for r in j.get("restarts", [])), timeout=120,
        what="recovered")
    r = recovered["restarts"][0]
    first_step = int(r["detectedUnixMs"]) / 1000 + r.get("recoverySeconds", 0)
    row = {
        "from the fault": first_step - fault_at,
        "detection": int(r["detectedUnixMs"]) / 1000 - fault_at,
        "scheduling": r.get("schedulingSeconds", 0),
        "start": r.get("startSeconds", 0),
        "rendezvous": r.get("rendezvousSeconds", 0),
        "checkpoint load": r.get("checkpointLoadSeconds", 0),
        "first step": r.get("firstStepSeconds", 0),
        "steps lost": int(r.get("stepsLost", 0)),
        "last step": int(r.get("lastStep", 0)),
        "reason": r["reason"],
    }
    cluster.cli(["cancel", job_id])
    cluster.release(name)
    # The host back as it was: its processes gone, its link healed, its agent started again.
    if fault == "freeze":
        bed.thaw(victim)
    bed.heal(victim)
    bed.kill(victim)
    cluster.procs[victim].wait(timeout=30)
    cluster.start_worker(victim)
    # Not the old agent: thawed or healed, it may register again before it is killed.
    cluster.wait_worker_started(victim)
    cluster.wait_workers(3)
    return row


COLUMNS = ["from the fault", "detection", "scheduling", "start", "rendezvous", "checkpoint load",
           "first step", "steps lost"]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--bin-dir", required=True)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--faults", default="kill,cut,freeze,partition,preempt")
    args = parser.parse_args()
    if os.geteuid() != 0:
        sys.exit("hosts need root (network namespaces)")
    bed = hosts.Bed.up(["coord", "s3", "w1", "w2", "w3"])
    bed.remove_on_exit()
    cluster = cluster_lib.HostCluster(bed, args.bin_dir, ["w1", "w2", "w3"])
    results = {}
    try:
        cluster.start()
        for fault in args.faults.split(","):
            rows = []
            for n in range(args.runs):
                row = run_once(bed, cluster, fault, n)
                print("%s %d: %s" % (fault, n, json.dumps(row)), file=sys.stderr, flush=True)
                rows.append(row)
            results[fault] = rows
    finally:
        cluster.stop()
        bed.down()
        cluster.cleanup()
    print("| fault | reason | " + " | ".join(COLUMNS) + " |")
    print("| --- | --- |" + " ---: |" * len(COLUMNS))
    for fault, rows in results.items():
        reasons = sorted({r["reason"] for r in rows})
        cells = []
        for c in COLUMNS:
            values = [r[c] for r in rows]
            median = statistics.median(values)
            cells.append("%d" % median if c == "steps lost" else
                         "%.2f (%.2f-%.2f)" % (median, min(values), max(values))
                         if c == "from the fault" else "%.2f" % median)
        print("| %s | %s | %s |" % (fault, "/".join(reasons), " | ".join(cells)))
    print("\nmedians of %d runs each (from the fault: median, min-max); seconds" % args.runs)


if __name__ == "__main__":
    main()
