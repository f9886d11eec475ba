#!/usr/bin/env python3
"""Sparse parameter-server training: an embedding_mlp with one table of 1,000,000 x 16 (64 MB) and
13 dense features (MLP 29 -> 64 -> 2), plain SGD, global batch 2048 on 2 ranks, so that a batch
touches about 1,000 rows (half of the synthetic ids are their class's). Trainyard's
parameter_server (sync with 1 and 2 shards, async with 1) against Trainyard's data_parallel,
which all-reduces the whole table's gradient every step, and against the torch.distributed.rpc
sparse parameter server (bench/ps_sparse_rpc_torch.py: 2 trainers, 1 server, the same model,
data distribution, optimizer and batch, one thread per process).

  python3 bench/ps_sparse.py BUILD_DIR [STEPS] [RUNS]

A run's rate is rank 0's median samples/s over its 20-step progress lines after the first two.
Bytes per step: for parameter_server, what the shards received and sent (their own count, in
their last log line) over the steps; for data_parallel, the gradient bytes each of the 2 ranks
sends in its ring all-reduce (the model's size), times 2; for the peer, the tensor bytes its
trainers sent and received. Prints a markdown table of the medians over RUNS runs (default 3).
"""
import json
import os
import re
import statistics
import subprocess
import sys

from local_cluster import LocalCluster, median_samples_per_second

BATCH = 2048
ROWS = 1000000
HERE = os.path.dirname(os.path.abspath(__file__))


def job_yaml(name, strategy, servers, steps):
    servers = f"parameter_servers: {servers}\n" if strategy == "parameter_server" else ""
    return f"""name: {name}
strategy: {strategy}
workers: 2
{servers}model:
  builtin: embedding_mlp
  args: {{vocab: [{ROWS}], dim: 16, hidden: [64], classes: 2}}
data:
  synthetic: {{samples: 65536, features: 13, classes: 2, vocab: [{ROWS}]}}
batch_size: {BATCH}
optimizer: {{name: sgd, lr: 0.05}}
max_steps: {{steps}}
log_every_steps: 20
seed: 3
""".replace("{steps}", str(steps))


CONFIGS = [
    ("Trainyard data_parallel (all-reduces the table)", "data_parallel", None),
    ("Trainyard parameter_server, sync, 1 shard", "parameter_server", "1"),
    ("Trainyard parameter_server, sync, 2 shards", "parameter_server", "2"),
    ("Trainyard parameter_server, async, 1 shard", "parameter_server",
     "{shards: 1, mode: async, max_staleness: 4}"),
]
PEER = "torch.distributed.rpc parameter server, 2 trainers, 1 server"


def main():
    build = sys.argv[1] if len(sys.argv) > 1 else "build"
    steps = int(sys.argv[2]) if len(sys.argv) > 2 else 200
    runs = int(sys.argv[3]) if len(sys.argv) > 3 else 3
    results = {label: [] for label, _, _ in CONFIGS}
    results[PEER] = []
    with LocalCluster(build, workers=2, slots=4, prefix="ps_sparse.") as cluster:
        for _ in range(runs):
            for label, strategy, servers in CONFIGS:
                name = "dp" if servers is None else "ps"
                job_id = cluster.run_job(name, job_yaml(name, strategy, servers, steps))
                log = cluster.logs(job_id, "--rank", "0")
                rate = median_samples_per_second(log)
                if strategy == "data_parallel":
                    parameters = int(re.search(r"parameters=(\d+)", log).group(1))
                    moved = 2 * 4 * parameters
                else:
                    shards = cluster.logs(job_id, "--shard", "0")
                    if "{" not in servers and int(servers) > 1:
                        shards += cluster.logs(job_id, "--shard", "1")
                    moved = sum(int(a) + int(b) for a, b in re.findall(
                        r"bytes_received=(\d+) bytes_sent=(\d+)", shards)) / steps
                results[label].append((rate, moved))
                print(json.dumps({"config": label, "samples_per_second": rate,
                                  "bytes_per_step": moved}), file=sys.stderr)
            peer = run_peer(steps)
            results[PEER].append(peer)
            print(json.dumps({"config": PEER, "samples_per_second": peer[0],
                              "bytes_per_step": peer[1]}), file=sys.stderr)

    def median(label, i):
        return statistics.median(r[i] for r in results[label])

    dp = median(CONFIGS[0][0], 0)
    peer = median(PEER, 0)
    print("| system | steps/s | bytes per step | against data_parallel | "
          "against torch.distributed.rpc |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for label in [c[0] for c in CONFIGS] + [PEER]:
        rate, moved = median(label, 0), median(label, 1)
        print(f"| {label} | {rate / BATCH:.1f} | {moved / 1e3:,.0f} kB | {rate / dp:.1f} | "
              f"{rate / peer:.2f} |")
    print(f"\nmedian of {runs} runs of {steps} steps (global batch {BATCH}); each run's steps/s:")
    for label in [c[0] for c in CONFIGS] + [PEER]:
        print(f"  {label}: " + " ".join(f"{r[0] / BATCH:.1f}" for r in results[label]))


def run_peer(steps):
    peer = subprocess.run(["/usr/bin/python3", os.path.join(HERE, "ps_sparse_rpc_torch.py"),
                           str(steps), str(BATCH), str(ROWS)], capture_output=True, text=True)
    if peer.returncode != 0:
        sys.exit(f"ps_sparse_rpc_torch.py failed:\n{peer.stderr[-2000:]}")
    result = json.loads(peer.stdout.strip().splitlines()[-1])
    return result["samples_per_second"], result["bytes_per_step"]


if __name__ == "__main__":
    main()
