#!/usr/bin/env python3
"""The built-in transformer's training step on one CPU core against the same model in eager
PyTorch: Trainyard trains `model: {builtin: transformer}` as a job on a local cluster with one
worker of one slot (one thread) on byte-token shards (`trainyard data pack --text`); PyTorch
trains examples/transformer/transformer.py (the same layers, initialised the same way) by the
plain loop on one thread, on the same windows, alternating with the job. AdamW, no dropout.
Trainyard's rate is the median of its progress windows after the first two; PyTorch's is timed
over the same steps after a warm-up.

  python3 bench/transformer_step.py BUILD_DIR [--rounds 3] [--steps 60] [--batch 16]
      [--context 128] [--layers 4] [--dim 128] [--heads 4]

Prints each round and the median ratio (Trainyard / eager).
"""
import os

os.environ["OMP_NUM_THREADS"] = "1"  # before torch loads: OpenBLAS sizes its pool then

import argparse  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402

import torch  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "examples", "transformer"))
from local_cluster import (LocalCluster, median_samples_per_second,  # noqa: E402
                           pack_random_text, timed_samples_per_second)
import transformer  # noqa: E402

LOG_EVERY = 10


def eager_rate(model, windows, batch, steps, warmup):
    torch.set_num_threads(1)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
    n = windows.shape[0]
    model.train()

    def step(i):
        lo = (i * batch) % (n - batch + 1)
        w = windows[lo:lo + batch]
        opt.zero_grad()
        logits = model(w[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.size(-1)),
                                                 w[:, 1:].reshape(-1))
        loss.backward()
        opt.step()
        return loss.item()

    return timed_samples_per_second(step, batch, steps, warmup)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("build")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--context", type=int, default=128)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--dim", type=int, default=128)
    p.add_argument("--heads", type=int, default=4)
    args = p.parse_args()
    build = os.path.abspath(args.build)
    work = tempfile.mkdtemp(prefix="transformer_step.")
    # Text enough for every window the run reads: random printable bytes.
    tokens = args.batch * (args.steps + 4 * LOG_EVERY) * args.context + 1
    pack_random_text(build, work, tokens)
    shape = (f"{{vocab: 256, context: {args.context}, layers: {args.layers}, dim: {args.dim}, "
             f"heads: {args.heads}}}")
    spec = f"""name: {{name}}
model: {{builtin: transformer, args: {shape}}}
data: {{tokens: "{work}/text-*.safetensors", shuffle: false}}
batch_size: {args.batch}
optimizer: {{name: adamw, lr: 1e-3, weight_decay: 0.01}}
max_steps: {args.steps + 2 * LOG_EVERY}
log_every_steps: {LOG_EVERY}
seed: 1
"""
    windows = torch.from_numpy(transformer.windows(f"{work}/text-*.safetensors", args.context))
    ours, theirs = [], []
    with LocalCluster(build, workers=1, slots=1, prefix="transformer_step.") as cluster:
        for r in range(args.rounds):
            name = f"transformer-step-{r}"
            job = cluster.run_job(name, spec.replace("{name}", name))
            ours.append(median_samples_per_second(cluster.logs(job)))
            eager = transformer.TransformerLM(256, args.context, args.layers, args.dim,
                                              args.heads).initialise(1)
            theirs.append(eager_rate(eager, windows, args.batch, args.steps, 2 * LOG_EVERY))
            print(f"round {r + 1}: Trainyard {ours[-1]:.1f} samples/s, eager PyTorch "
                  f"{theirs[-1]:.1f}, ratio {ours[-1] / theirs[-1]:.3f}", flush=True)
    ratios = [a / b for a, b in zip(ours, theirs)]
    print(f"median: Trainyard {statistics.median(ours):.1f} samples/s, eager PyTorch "
          f"{statistics.median(theirs):.1f}, ratio {statistics.median(ratios):.3f} "
          f"(PyTorch {torch.__version__})")


if __name__ == "__main__":
    main()
