#!/usr/bin/env python3
"""Synchronous parameter-server training of a dense model: Trainyard's parameter_server (2 ranks,
1 and 2 shards) against the torch.distributed.rpc parameter server (bench/ps_rpc_torch.py: 2
trainers, 1 server) and against Trainyard's own data_parallel, on the model, data, optimizer and
global batch of bench/ddp_scaling.cc (MLP 256 -> 1024 -> 1024 -> 10, SGD with momentum, global
batch 64), one thread per process, processes placed by the kernel on this machine's cores.

  python3 bench/ps_dense.py BUILD_DIR [STEPS] [RUNS]

Trainyard's jobs run on a local cluster (`trainyard up --workers 2 --slots 4`); a run's rate is
rank 0's median samples/s over its 20-step progress lines after the first two. Prints a markdown
table of the medians over RUNS runs (default 3, ours and the peer alternating) and each run's
figures.
"""
import json
import os
import statistics
import subprocess
import sys

from local_cluster import LocalCluster, median_samples_per_second

BATCH = 64
HERE = os.path.dirname(os.path.abspath(__file__))


def job_yaml(name, strategy, shards, steps):
    servers = f"parameter_servers: {shards}\n" if strategy == "parameter_server" else ""
    return f"""name: {name}
strategy: {strategy}
workers: 2
{servers}model:
  builtin: mlp
  args: {{inputs: 256, hidden: [1024, 1024], classes: 10}}
data:
  synthetic: {{samples: 8192, features: 256, classes: 10}}
batch_size: {BATCH}
optimizer: {{name: sgd, lr: 0.01, momentum: 0.9}}
max_steps: {steps}
log_every_steps: 20
seed: 3
"""


def main():
    build = sys.argv[1] if len(sys.argv) > 1 else "build"
    steps = int(sys.argv[2]) if len(sys.argv) > 2 else 300
    runs = int(sys.argv[3]) if len(sys.argv) > 3 else 3
    configs = [("data_parallel", 0), ("parameter_server", 1), ("parameter_server", 2)]
    rows = []
    with LocalCluster(build, workers=2, slots=4, prefix="ps_dense.") as cluster:
        for _ in range(runs):
            for strategy, shards in configs:
                name = f"{strategy.replace('_', '-')}-{shards}"
                job_id = cluster.run_job(name, job_yaml(name, strategy, shards, steps))
                rate = median_samples_per_second(cluster.logs(job_id, "--rank", "0"))
                rows.append({"system": "ours", "strategy": strategy, "shards": shards,
                             "samples_per_second": rate})
                print(json.dumps(rows[-1]), file=sys.stderr)
            peer = subprocess.run(["/usr/bin/python3", os.path.join(HERE, "ps_rpc_torch.py"),
                                   str(steps), str(BATCH)], capture_output=True, text=True)
            if peer.returncode != 0:
                sys.exit(f"ps_rpc_torch.py failed:\n{peer.stderr[-2000:]}")
            result = json.loads(peer.stdout.strip().splitlines()[-1])
            rows.append({"system": "torch_rpc", "strategy": "parameter_server", "shards": 1,
                         "samples_per_second": result["samples_per_second"]})
            print(json.dumps(rows[-1]), file=sys.stderr)

    def pick(system, strategy, shards):
        return [r["samples_per_second"] for r in rows
                if r["system"] == system and r["strategy"] == strategy and r["shards"] == shards]

    peer = statistics.median(pick("torch_rpc", "parameter_server", 1))
    print("| system | samples/s | steps/s | against torch.distributed.rpc |")
    print("| --- | ---: | ---: | ---: |")
    table = [("Trainyard data_parallel, 2 ranks", "ours", "data_parallel", 0),
             ("Trainyard parameter_server, 2 ranks, 1 shard", "ours", "parameter_server", 1),
             ("Trainyard parameter_server, 2 ranks, 2 shards", "ours", "parameter_server", 2),
             ("torch.distributed.rpc parameter server, 2 trainers, 1 server", "torch_rpc",
              "parameter_server", 1)]
    for label, system, strategy, shards in table:
        rate = statistics.median(pick(system, strategy, shards))
        print(f"| {label} | {rate:.0f} | {rate / BATCH:.1f} | {rate / peer:.2f} |")
    print(f"\nmedian of {runs} runs of {steps} steps (global batch {BATCH}); each run's samples/s:")
    for label, system, strategy, shards in table:
        print(f"  {label}: " + " ".join(f"{r:.0f}" for r in pick(system, strategy, shards)))


if __name__ == "__main__":
    main()
