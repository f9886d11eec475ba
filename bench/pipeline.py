#!/usr/bin/env python3
"""Pipeline jobs on a local cluster: each stage's measured bubble against the schedule's ideal,
(K - 1) / (M + K - 1), for K stages and M micro-batches, and the job's samples/s and each stage's
peak memory; with --peer, the same model, stages, micro-batches and threads in
torch.distributed.pipelining (bench/pipeline_torch.py; PyTorch 2.4 or later, as in the Debian 13
root), side by side.

  python3 bench/pipeline.py BUILD_DIR [--stages 2,4] [--microbatches 4,8,16]
      [--schedules 1f1b,gpipe] [--steps 40] [--batch 16] [--context 128] [--layers 4]
      [--dim 128] [--heads 4] [--peer] [--reference]

One worker of one slot (one thread) per stage. The transformer is untied (the peer's API has no
tied weights across stages), AdamW, no dropout, the layers split uniformly. Each row: the stages'
measured bubble (their idle share per update, from the job's last progress report), the ideal,
rank 0's median samples/s after the first two progress windows, and each stage's peak resident
memory (the trainer's "done" line). With --reference, the same model, batch and steps as a
`single` job on one rank, for its peak memory; the script also prints the model's parameters and
what they, their gradients and AdamW's state take (16 bytes a parameter).

The memory demonstration in docs/benchmarks.md (a model whose training state is about 6 GB, on 4
stages):

  python3 bench/pipeline.py BUILD --stages 4 --microbatches 8 --steps 3 --batch 8 --context 32 \
      --layers 30 --dim 1024 --heads 16 --reference
"""
import argparse
import json
import os
import re
import subprocess
import sys
import tempfile


HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from local_cluster import (LocalCluster, median_samples_per_second,  # noqa: E402
                           pack_random_text)

LOG_EVERY = 5


def uniform(layers, stages):
    base, extra = divmod(layers, stages)
    return [base + (1 if s < extra else 0) for s in range(stages)]


def parameter_count(args):
    """The untied transformer's parameters (as TransformerLayerBytes counts them)."""
    d, v, h = args.dim, 256, 4 * args.dim
    block = 2 * 2 * d + (d * 3 * d + 3 * d) + (d * d + d) + (d * h + h) + (h * d + d)
    return v * d + args.context * d + args.layers * block + 2 * d + v * d


def peak_mb(cluster, job, rank):
    found = re.findall(r"peak_rss_mb=(\d+)", cluster.logs(job, "--rank", str(rank)))
    return int(found[-1]) if found else -1


def job_spec(name, strategy, shape, work, args):
    """The job's spec: `strategy` (its lines) over the transformer `shape` and the token shards."""
    return f"""name: {name}
{strategy}model: {{builtin: transformer, args: {shape}}}
data: {{tokens: "{work}/text-*.safetensors", shuffle: false}}
batch_size: {args.batch}
optimizer: {{name: adamw, lr: 1e-3, weight_decay: 0.01}}
max_steps: {args.steps}
log_every_steps: {LOG_EVERY}
seed: 1
"""


def main():
    p = argparse.ArgumentParser()
    p.add_argument("build")
    p.add_argument("--stages", default="2,4")
    p.add_argument("--microbatches", default="4,8,16")
    p.add_argument("--schedules", default="1f1b,gpipe")
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--context", type=int, default=128)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--dim", type=int, default=128)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--peer", action="store_true")
    p.add_argument("--reference", action="store_true")
    args = p.parse_args()
    build = os.path.abspath(args.build)
    stage_counts = [int(s) for s in args.stages.split(",")]
    work = tempfile.mkdtemp(prefix="pipeline_bench.")
    tokens = args.batch * (args.steps + 4) * args.context + 1
    pack_random_text(build, work, tokens)
    params = parameter_count(args)
    print(f"model: {params / 1e6:.1f} M parameters; parameters, gradients and AdamW state "
          f"{params * 16 / 2**20:,.0f} MB (a quarter: {params * 4 / 2**20:,.0f} MB)")
    shape = (f"{{vocab: 256, context: {args.context}, layers: {args.layers}, dim: {args.dim}, "
             f"heads: {args.heads}, tie_embeddings: false}}")
    print(f"| stages | micro-batches | schedule | bubble per stage | ideal | samples/s | "
          f"peak MB per stage |{' peer samples/s | peer peak MB | ratio |' if args.peer else ''}")
    print(f"| --- | --- | --- | --- | --- | --- | --- |{' --- | --- | --- |' if args.peer else ''}")
    for k in stage_counts:
        counts = uniform(args.layers + 2, k)
        with LocalCluster(build, workers=k, slots=1, prefix="pipeline_bench.") as cluster:
            for m in [int(x) for x in args.microbatches.split(",")]:
                if args.batch % m:
                    continue
                for schedule in args.schedules.split(","):
                    name = f"pipe-{k}-{m}-{schedule}"
                    spec = job_spec(
                        name, f"""strategy: pipeline
workers: {k}
pipeline: {{stages: {k}, microbatches: {m}, schedule: {schedule}, partition: {counts}}}
""", shape, work, args)
                    job = cluster.run_job(name, spec)
                    described = json.loads(cluster.call("describe", job, "-o", "json").stdout)
                    stages = described.get("progress", {}).get("pipelineStages", [])
                    bubbles = [s.get("bubble", 0.0) for s in stages]
                    ideal = (k - 1) / (m + k - 1)
                    rate = median_samples_per_second(cluster.logs(job, "--rank", "0"))
                    peaks = [peak_mb(cluster, job, r) for r in range(k)]
                    row = (f"| {k} | {m} | {schedule} | "
                           f"{', '.join(f'{b:.2f}' for b in bubbles)} | {ideal:.2f} | "
                           f"{rate:.1f} | {', '.join(str(x) for x in peaks)} |")
                    if args.peer:
                        peer = subprocess.run(
                            [sys.executable, os.path.join(HERE, "pipeline_torch.py"),
                             "--stages", str(k), "--counts", ",".join(map(str, counts)),
                             "--microbatches", str(m), "--schedule", schedule,
                             "--batch", str(args.batch), "--context", str(args.context),
                             "--layers", str(args.layers), "--dim", str(args.dim),
                             "--heads", str(args.heads), "--steps", str(args.steps - 10),
                             "--warmup", "10"],
                            check=True, capture_output=True, text=True)
                        theirs = json.loads(peer.stdout.strip().splitlines()[-1])
                        row += (f" {theirs['samples_per_s']:.1f} | "
                                f"{', '.join(str(x) for x in theirs['peak_rss_mb'])} | "
                                f"{rate / theirs['samples_per_s']:.3f} |")
                    print(row, flush=True)
    if args.reference:
        with LocalCluster(build, workers=1, slots=1, prefix="pipeline_bench.") as cluster:
            spec = job_spec("single", "strategy: single\n", shape, work, args)
            job = cluster.run_job("single", spec)
            print(f"| 1 (single) | - | - | - | - | "
                  f"{median_samples_per_second(cluster.logs(job, '--rank', '0')):.1f} | "
                  f"{peak_mb(cluster, job, 0)} |", flush=True)


if __name__ == "__main__":
    main()
