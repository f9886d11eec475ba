#!/usr/bin/env python3
"""The training step on one CPU core: a torchvision ResNet-18 (10 classes) on 3x32x32 uint8 images,
batch 64, SGD with momentum, trained by a Trainyard job (the model scripted, one worker with one
slot, so OMP_NUM_THREADS=1) and by the same loop in eager PyTorch on one thread (the model as
written), alternated --rounds times. Trainyard's rate is the median of its progress windows after
the first two; PyTorch's is timed over the same steps after a warm-up.

  python3 bench/cpu_step.py BUILD_DIR [--rounds 3] [--steps 60] [--batch 64] [--image 32]

Needs python3-torchvision. Prints each round and the median ratio (Trainyard / eager).
"""
import os

os.environ["OMP_NUM_THREADS"] = "1"  # before torch loads: OpenBLAS sizes its pool then

import argparse  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torchvision  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from local_cluster import (LocalCluster, median_samples_per_second,  # noqa: E402
                           timed_samples_per_second)
from flat_model import Flat  # noqa: E402

LOG_EVERY = 10


def eager_rate(model, images, labels, batch, steps, warmup):
    torch.set_num_threads(1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    n = images.shape[0]
    model.train()

    def step(i):
        lo = (i * batch) % (n - batch + 1)
        x = images[lo:lo + batch].float().mul_(1 / 255)
        y = labels[lo:lo + batch]
        opt.zero_grad()
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        return loss.item()

    return timed_samples_per_second(step, batch, steps, warmup)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("build")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--image", type=int, default=32)
    args = p.parse_args()
    build = os.path.abspath(args.build)
    work = tempfile.mkdtemp(prefix="cpu_step.")
    h = args.image
    rng = np.random.default_rng(0)
    samples = args.batch * 32
    images = rng.integers(0, 256, size=(samples, 3 * h * h), dtype=np.uint8)
    labels = rng.integers(0, 10, size=(samples,), dtype=np.int64)
    np.save(f"{work}/x.npy", images)
    np.save(f"{work}/y.npy", labels)
    os.makedirs(f"{work}/data")
    subprocess.run([f"{build}/bin/trainyard", "data", "pack", f"{work}/data/train",
                    f"x={work}/x.npy", f"y={work}/y.npy"], check=True, capture_output=True)
    torch.manual_seed(0)
    model = Flat(torchvision.models.resnet18(num_classes=10), [-1, 3, h, h])
    torch.jit.script(model).save(f"{work}/resnet18.pt")
    spec = f"""name: {{name}}
model: {{torchscript: {work}/resnet18.pt}}
data: {{train: "{work}/data/*.safetensors", feature_scale: {1 / 255}}}
batch_size: {args.batch}
optimizer: {{name: sgd, lr: 0.01, momentum: 0.9}}
loss: cross_entropy
max_steps: {args.steps + 2 * LOG_EVERY}
log_every_steps: {LOG_EVERY}
"""
    x, y = torch.from_numpy(images), torch.from_numpy(labels)
    ours, theirs = [], []
    with LocalCluster(build, workers=1, slots=1, prefix="cpu_step.") as cluster:
        for r in range(args.rounds):
            name = f"cpu-step-{r}"
            job = cluster.run_job(name, spec.replace("{name}", name))
            ours.append(median_samples_per_second(cluster.logs(job)))
            torch.manual_seed(0)
            eager = Flat(torchvision.models.resnet18(num_classes=10), [-1, 3, h, h])
            theirs.append(eager_rate(eager, x, y, args.batch, args.steps, 2 * LOG_EVERY))
            print(f"round {r + 1}: Trainyard {ours[-1]:.1f} samples/s, eager PyTorch "
                  f"{theirs[-1]:.1f}, ratio {ours[-1] / theirs[-1]:.3f}", flush=True)
    ratios = [a / b for a, b in zip(ours, theirs)]
    print(f"median: Trainyard {statistics.median(ours):.1f} samples/s, eager PyTorch "
          f"{statistics.median(theirs):.1f}, ratio {statistics.median(ratios):.3f} "
          f"(PyTorch {torch.__version__}, torchvision {torchvision.__version__})")


if __name__ == "__main__":
    main()
