#!/usr/bin/env python3
"""Trainyard against PyTorch on one GPU, side by side in one run (the GPU check's `benchmarks`
item): a torchvision ResNet-50 (scripted for Trainyard, eager and torch.compile'd for PyTorch) at
fp32 and bf16 on uint8 images, and the data-parallel scaling MLP of bench/ddp_scaling.cc on one
rank. Each side trains the same model on the same data with SGD (momentum 0.9) for --steps steps
after --warmup; Trainyard's rate is read from its progress lines, PyTorch's timed with CUDA
synchronisation at the ends. GPU utilisation is NVML's (nvidia-ml-py) sampled every 100 ms while
a side runs; model FLOPs utilisation is the FLOPs of one training step (forward and backward,
counted by torch.utils.flop_counter) times steps per second over the GPU's dense peak for the
precision (H100 SXM: 989 TFLOP/s bf16; 495 for fp32, as TF32, which cuDNN uses for convolutions
by default on both sides; --peak-tflops overrides). Both sides keep PyTorch's default math modes.

  python3 bench/gpu_models.py TRAINYARD_CLI WORK_DIR [--steps 60] [--warmup 20] [--batch 128]
      [--image 224] [--only resnet50-fp32,resnet50-bf16,mlp]

Prints a Markdown table and, last, one JSON line with every figure. Needs the local cluster the
check starts (TRAINYARD_COORDINATOR) with the trainer built against this PyTorch.
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import threading
import time

import numpy as np
import torch
import torch.nn as nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from flat_model import Flat  # noqa: E402

PEAK_TFLOPS = {"H100": {"bf16": 989.0, "fp32": 495.0}, "H200": {"bf16": 989.0, "fp32": 495.0},
               "A100": {"bf16": 312.0, "fp32": 156.0}}


def mlp(inputs, hidden, classes):
    return nn.Sequential(nn.Linear(inputs, hidden), nn.ReLU(), nn.Linear(hidden, hidden),
                         nn.ReLU(), nn.Linear(hidden, classes))


class GpuSampler:
    """Mean NVML utilisation of GPU 0 while alive."""

    def __init__(self):
        self.samples, self.stop = [], threading.Event()
        try:
            import pynvml
            pynvml.nvmlInit()
            handle = pynvml.nvmlDeviceGetHandleByIndex(0)
            self.read = lambda: pynvml.nvmlDeviceGetUtilizationRates(handle).gpu
        except Exception:  # no NVML: no figure
            self.read = None

    def __enter__(self):
        if self.read:
            self.thread = threading.Thread(target=self.loop, daemon=True)
            self.thread.start()
        return self

    def loop(self):
        while not self.stop.wait(0.1):
            self.samples.append(self.read())

    def __exit__(self, *exc):
        self.stop.set()
        if self.read:
            self.thread.join()

    def mean(self):
        return statistics.mean(self.samples) if self.samples else None


def step_flops(model, x, y, precision):
    try:
        from torch.utils.flop_counter import FlopCounterMode
    except ImportError:
        return None
    counter = FlopCounterMode(display=False)
    with counter:
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=precision == "bf16"):
            loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
    model.zero_grad(set_to_none=True)
    return counter.get_total_flops()


def torch_rate(model, images, labels, batch, steps, warmup, precision, scale):
    """Samples/s of the plain loop: each batch taken from pinned host memory, as the trainer does."""
    device = torch.device("cuda")
    model = model.to(device).train()
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    n = images.shape[0]

    def one(i):
        lo = (i * batch) % (n - batch + 1)
        x = images[lo:lo + batch].to(device, non_blocking=True).float().mul_(scale)
        y = labels[lo:lo + batch].to(device, non_blocking=True)
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=precision == "bf16"):
            loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    for i in range(warmup):
        one(i)
    torch.cuda.synchronize()
    with GpuSampler() as gpu:
        began = time.perf_counter()
        for i in range(steps):
            one(warmup + i)
        torch.cuda.synchronize()
        seconds = time.perf_counter() - began
    return batch * steps / seconds, gpu.mean(), steps / seconds


def trainyard_rate(cli, work, name, model_path, data, batch, steps, warmup, precision, scale):
    spec = f"""name: {name}
resources: {{gpus_per_worker: 1}}
model: {{torchscript: {model_path}}}
data: {{train: "{data}/*.safetensors", feature_scale: {scale}}}
batch_size: {batch}
optimizer: {{name: sgd, lr: 0.01, momentum: 0.9}}
loss: cross_entropy
precision: {precision}
max_steps: {warmup + steps}
log_every_steps: 10
"""
    path = f"{work}/{name}.yaml"
    with open(path, "w") as f:
        f.write(spec)
    with GpuSampler() as gpu:
        out = subprocess.run([cli, "submit", path, "--wait"], capture_output=True, text=True,
                             timeout=1200)
    job = out.stdout.splitlines()[0] if out.stdout else "?"
    logs = subprocess.run([cli, "logs", job], capture_output=True, text=True).stdout
    rates = [(int(m.group(1)), float(m.group(2)))
             for m in re.finditer(r"step=(\d+) total=\d+ loss=\S+ lr=\S+ samples_per_s=([0-9.]+)",
                                  logs)]
    measured = [r for s, r in rates if s > warmup]
    if out.returncode != 0 or not measured:
        raise SystemExit(f"{name}: job {job} exit {out.returncode}\n{out.stdout[-2000:]}\n"
                         f"{out.stderr[-2000:]}\n{logs[-3000:]}")
    described = json.loads(subprocess.run([cli, "describe", job, "-o", "json"],
                                          capture_output=True, text=True).stdout)
    progress = described.get("progress", {})
    split = {k: float(progress.get(k, 0)) for k in
             ("dataWaitSeconds", "computeSeconds", "communicationSeconds", "checkpointSeconds")}
    whole = sum(split.values()) or 1.0
    rate = statistics.median(measured)
    return rate, gpu.mean(), split["dataWaitSeconds"] / whole


def pack(cli, work, name, features, labels):
    os.makedirs(f"{work}/{name}", exist_ok=True)
    np.save(f"{work}/{name}-x.npy", features)
    np.save(f"{work}/{name}-y.npy", labels)
    subprocess.run([cli, "data", "pack", f"{work}/{name}/train", f"x={work}/{name}-x.npy",
                    f"y={work}/{name}-y.npy"], check=True, capture_output=True)
    return f"{work}/{name}"


def main():
    p = argparse.ArgumentParser()
    p.add_argument("cli")
    p.add_argument("work")
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--warmup", type=int, default=20)
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--image", type=int, default=224)
    p.add_argument("--samples", type=int, default=2048)
    p.add_argument("--peak-tflops", type=float)
    p.add_argument("--only", default="resnet50-fp32,resnet50-bf16,mlp")
    args = p.parse_args()
    os.makedirs(args.work, exist_ok=True)
    name = torch.cuda.get_device_name(0)
    peak = next((v for k, v in PEAK_TFLOPS.items() if k in name), None)
    rng = np.random.default_rng(0)
    rows, figures = [], {"device": name, "torch": torch.__version__}
    wanted = args.only.split(",")

    cases = []
    if any(w.startswith("resnet50") for w in wanted):
        import torchvision
        h = args.image
        images = rng.integers(0, 256, size=(args.samples, 3 * h * h), dtype=np.uint8)
        labels = rng.integers(0, 1000, size=(args.samples,), dtype=np.int64)
        data = pack(args.cli, args.work, "images", images, labels)
        torch.manual_seed(0)
        net = Flat(torchvision.models.resnet50(num_classes=1000), [-1, 3, h, h])
        scripted = f"{args.work}/resnet50.pt"
        torch.jit.script(net).save(scripted)
        host = (torch.from_numpy(images).pin_memory(), torch.from_numpy(labels).pin_memory())
        for precision in ("fp32", "bf16"):
            if f"resnet50-{precision}" in wanted:
                cases.append((f"resnet50-{precision}", net, scripted, data, host, precision,
                              1 / 255, (torch.randn(args.batch, 3 * h * h).cuda(),
                                        torch.randint(0, 1000, (args.batch,)).cuda())))
    if "mlp" in wanted:
        x = rng.standard_normal((args.samples * 8, 784), dtype=np.float32)
        y = rng.integers(0, 10, size=(args.samples * 8,), dtype=np.int64)
        data = pack(args.cli, args.work, "mlp", x, y)
        torch.manual_seed(0)
        net = mlp(784, 4096, 10)
        scripted = f"{args.work}/mlp.pt"
        torch.jit.script(net).save(scripted)
        host = (torch.from_numpy(x).pin_memory(), torch.from_numpy(y).pin_memory())
        cases.append(("mlp", net, scripted, data, host, "fp32", 1.0,
                      (torch.randn(args.batch, 784).cuda(), torch.randint(0, 10, (args.batch,)).cuda())))

    for label, net, scripted, data, host, precision, scale, probe in cases:
        ours, ours_gpu, data_wait = trainyard_rate(args.cli, args.work, label.replace("_", "-"),
                                                   scripted, data, args.batch, args.steps,
                                                   args.warmup, precision, scale)
        eager, eager_gpu, eager_steps = torch_rate(net, *host, args.batch, args.steps,
                                                   args.warmup, precision, scale)
        compiled_rate = compiled_gpu = None
        try:
            compiled = torch.compile(net)
            compiled_rate, compiled_gpu, _ = torch_rate(compiled, *host, args.batch, args.steps,
                                                        args.warmup, precision, scale)
        except Exception as e:  # report, do not stop the others
            figures[f"{label}_compile_error"] = str(e)[:200]
        flops = step_flops(net.cuda(), *probe, precision)
        peak_t = args.peak_tflops or (peak or {}).get(precision)
        mfu = (flops * ours / args.batch / (peak_t * 1e12)) if flops and peak_t else None
        row = {"case": label, "trainyard": ours, "eager": eager, "compiled": compiled_rate,
               "vs_eager": ours / eager, "vs_compiled": ours / compiled_rate if compiled_rate else None,
               "gpu_util_trainyard": ours_gpu, "gpu_util_eager": eager_gpu,
               "gpu_util_compiled": compiled_gpu, "data_wait_share": data_wait,
               "step_gflops": flops / 1e9 if flops else None, "mfu_trainyard": mfu}
        rows.append(row)
        figures[label] = row

    def f(v, fmt):
        return "—" if v is None else format(v, fmt)
    print(f"{name}, PyTorch {torch.__version__}, batch {args.batch}, {args.steps} steps after "
          f"{args.warmup}\n")
    print("| case | Trainyard samples/s | eager | torch.compile | vs eager | vs compile | "
          "GPU util (ours / eager / compile) | data wait | MFU |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | --- | ---: | ---: |")
    for r in rows:
        print(f"| {r['case']} | {r['trainyard']:,.0f} | {r['eager']:,.0f} | "
              f"{f(r['compiled'], ',.0f')} | {r['vs_eager']:.2f} | {f(r['vs_compiled'], '.2f')} | "
              f"{f(r['gpu_util_trainyard'], '.0f')} / {f(r['gpu_util_eager'], '.0f')} / "
              f"{f(r['gpu_util_compiled'], '.0f')} % | {r['data_wait_share']:.1%} | "
              f"{f(r['mfu_trainyard'], '.1%')} |")
    print(json.dumps(figures))


if __name__ == "__main__":
    sys.exit(main())
