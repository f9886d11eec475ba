#!/usr/bin/env python3
"""Each stage's peak memory when a pipeline trains a TorchScript model written as one
torch.nn.Sequential (model.torchscript: every stage loads the whole module before keeping its
layers, and rank 0 loads it once more to export it) against the same model written as one file
per stage (model.stages: a stage loads only its file, rank 0 exports one file at a time).

  python3 bench/pipeline_files_memory.py BUILD_DIR [--stages 4] [--layers 8] [--width 4096]
      [--steps 3] [--batch 16]

The model: --layers blocks of Linear(width, width) and ReLU, then Linear(width, 4), written with
Debian's python3-torch (/usr/bin/python3); SGD with momentum on synthetic data, one worker of one
slot per stage, one file per stage of consecutive blocks (the last stage also has the head). Each
figure is the trainer's peak resident set (peak_rss_mb from its "done" line, MiB), which includes
the final checkpoint and, on rank 0, the export; and how long rank 0's export took, from its
final checkpoint written to the model exported (its log's times).
"""
import argparse
import datetime
import os
import re
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from local_cluster import LocalCluster  # noqa: E402

WRITE = r"""
import sys, torch
from torch import nn
layers, width, stages, out = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
torch.manual_seed(1)
blocks = [nn.Sequential(nn.Linear(width, width), nn.ReLU()) for _ in range(layers)]
head = nn.Linear(width, 4)
flat = [m for b in blocks for m in b] + [head]
torch.jit.script(nn.Sequential(*flat)).save(out + "/whole.pt")
per = -(-layers // stages)
for s in range(stages):
    mine = [m for b in blocks[s * per:(s + 1) * per] for m in b]
    if s == stages - 1:
        mine.append(head)
    torch.jit.script(nn.Sequential(*mine)).save(f"{out}/stage-{s}.pt")
"""


def peak_mb(cluster, job, rank):
    found = re.findall(r"peak_rss_mb=(\d+)", cluster.logs(job, "--rank", str(rank)))
    return int(found[-1]) if found else -1


STAMP = r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d+)Z"


def export_seconds(cluster, job):
    """Rank 0's export: from its last "checkpoint written" line to "model exported"."""
    log = cluster.logs(job, "--rank", "0")
    written = re.findall(STAMP + r".*checkpoint written", log)
    exported = re.findall(STAMP + r".*model exported to", log)
    if not written or not exported:
        return float("nan")
    parse = datetime.datetime.fromisoformat
    return (parse(exported[-1]) - parse(written[-1])).total_seconds()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("build")
    p.add_argument("--stages", type=int, default=4)
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--width", type=int, default=4096)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--batch", type=int, default=16)
    args = p.parse_args()
    if args.layers % args.stages:
        sys.exit("--layers must be a multiple of --stages")
    build = os.path.abspath(args.build)
    work = tempfile.mkdtemp(prefix="pipeline_files_bench.")
    subprocess.run(["/usr/bin/python3", "-c", WRITE, str(args.layers), str(args.width),
                    str(args.stages), work], check=True)
    params = args.layers * (args.width * args.width + args.width) + args.width * 4 + 4
    print(f"model: {params / 1e6:.1f} M parameters, {params * 4 / 2**20:,.0f} MB; a stage's "
          f"share with its gradients and momentum: {params * 12 / args.stages / 2**20:,.0f} MB")
    k = args.stages
    # Two children (Linear, ReLU) per block; the head on the last stage.
    counts = [2 * args.layers // k] * k
    counts[-1] += 1
    files = ", ".join(f"{work}/stage-{s}.pt" for s in range(k))
    models = {
        "model.torchscript (one Sequential)":
            f"model: {{torchscript: {work}/whole.pt}}\npipeline: {{stages: {k}, "
            f"microbatches: 4, partition: {counts}}}\n",
        "model.stages (one file per stage)":
            f"model: {{stages: [{files}]}}\npipeline: {{stages: {k}, microbatches: 4}}\n",
    }
    print("| model | peak MB per stage (rank 0 exports) | rank 0's export, s |")
    print("| --- | --- | ---: |")
    with LocalCluster(build, workers=k, slots=1, prefix="pipeline_files_bench.") as cluster:
        for i, (what, model) in enumerate(models.items()):
            name = f"files-{i}"
            spec = f"""name: {name}
strategy: pipeline
workers: {k}
{model}data: {{synthetic: {{samples: 256, features: {args.width}, classes: 4}}}}
batch_size: {args.batch}
optimizer: {{name: sgd, lr: 0.01, momentum: 0.9}}
max_steps: {args.steps}
seed: 1
"""
            job = cluster.run_job(name, spec)
            peaks = [peak_mb(cluster, job, r) for r in range(k)]
            print(f"| {what} | {', '.join(f'{x:,}' for x in peaks)} | "
                  f"{export_seconds(cluster, job):.1f} |", flush=True)


if __name__ == "__main__":
    main()
