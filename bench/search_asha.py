#!/usr/bin/python3
"""ASHA against full trials: the same 32 trials of a synthetic MLP (the same values: both
searchers draw them from the same seed) on a local cluster of 3 workers, once as an ASHA search
and once run to their full length (`random`). Prints wall time, steps trained, jobs run and the
best validation accuracy of each, and their ratios.

    bench/search_asha.py BUILD_DIR [--trials 32] [--length 810] [--concurrent 3] [--seed 1]
"""
import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from local_cluster import LocalCluster  # noqa: E402

TEMPLATE = """template:
  name: search-mlp
  model: {builtin: mlp, args: {inputs: 32, classes: 8}}
  data:
    synthetic: {samples: 8192, features: 32, classes: 8, noise: 1.5}
    validation_split: 0.2
    validation: {max_samples: 1024}
  batch_size: 128
  optimizer: {schedule: cosine}
  log_every_steps: 30
  seed: 7
"""

SPACE = """hyperparameters:
  optimizer.name: {type: categorical, values: [sgd, adamw]}
  optimizer.lr: {type: log, min: 1e-5, max: 3e-1}
  model.args.hidden: {type: categorical, values: [[64], [512, 512]]}
"""


def run_search(cluster, name, searcher, length, timeout_s=7200):
    spec = os.path.join(cluster.state, f"{name}.yaml")
    with open(spec, "w") as f:
        f.write(f"name: {name}\nsearcher: {searcher}\n{SPACE}{TEMPLATE}  max_steps: {length}\n")
    start = time.time()
    submitted = cluster.call("search", "submit", spec)
    if submitted.returncode != 0:
        sys.exit(f"search {name} refused:\n{submitted.stdout}{submitted.stderr}")
    search_id = submitted.stdout.strip()
    shown = -1
    while True:
        described = cluster.call("search", "describe", search_id, "-o", "json")
        if described.returncode == 0:
            search = json.loads(described.stdout)
            ended = sum(t.get("state") != "TRIAL_RUNNING" for t in search.get("trials", []))
            if ended != shown:
                print(f"  {name}: {ended} trials ended", file=sys.stderr)
                shown = ended
            if search.get("state") != "SEARCH_RUNNING":
                break
        if time.time() - start > timeout_s:
            sys.exit(f"search {search_id} did not end in {timeout_s} s")
        time.sleep(1)
    wall = time.time() - start
    if search.get("state") != "SEARCH_SUCCEEDED":
        sys.exit(f"search {search_id} ended {search.get('state')}: {search.get('reason')}")
    trials = search["trials"]
    best = trials[search.get("bestTrial", 0)]
    return {
        "wall": wall,
        "steps": sum(int(t.get("step", 0)) for t in trials),
        "jobs": sum(len(t.get("jobIds", [])) for t in trials),
        "best": search.get("bestMetric", 0.0),
        "best_values": best.get("hyperparameters", {}),
        "completed": sum(t.get("state") == "TRIAL_COMPLETED" for t in trials),
    }


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("build")
    parser.add_argument("--trials", type=int, default=32)
    parser.add_argument("--length", type=int, default=810)
    parser.add_argument("--concurrent", type=int, default=3)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    common = (f"metric: val_accuracy, max_trials: {args.trials}, "
              f"max_concurrent_trials: {args.concurrent}, seed: {args.seed}")
    with LocalCluster(args.build, workers=3, slots=1, prefix="search_asha.") as cluster:
        asha = run_search(cluster, "asha", f"{{name: asha, {common}, max_length: {args.length}, "
                                           f"divisor: 3, max_rungs: 5}}", length=args.length)
        # The same trials (same seed) at their full length.
        full = run_search(cluster, "full", f"{{name: random, {common}}}", length=args.length)
    print(f"| searcher | wall time | steps trained | jobs | trials run to {args.length} steps "
          f"| best val_accuracy |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for name, r in (("asha", asha), ("random (every trial in full)", full)):
        print(f"| {name} | {r['wall']:.0f} s | {r['steps']} | {r['jobs']} | {r['completed']} "
              f"| {r['best']:.4f} |")
    print(f"\nasha / full: wall time {asha['wall'] / full['wall']:.2f}, steps "
          f"{asha['steps'] / full['steps']:.2f}, best val_accuracy {asha['best'] - full['best']:+.4f}")
    print(f"best values: asha {asha['best_values']}, full {full['best_values']}")


if __name__ == "__main__":
    main()
