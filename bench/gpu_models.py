#!/usr/bin/env python3
"""Trainyard against PyTorch on one GPU, side by side in one run (the GPU check's `benchmarks`
item): a torchvision ResNet-50 (scripted for Trainyard; eager, torch.compile'd and
torch.compile(mode="reduce-overhead")'d for PyTorch) at fp32 and bf16 on uint8 images, the
built-in transformer (`model: {builtin: transformer}`; for PyTorch the same model in
examples/transformer/transformer.py) at fp32, tf32 and bf16 on byte tokens, and the data-parallel
scaling MLP of bench/ddp_scaling.cc on one rank. Trainyard runs each case twice: as it runs by
default, and with `cuda_graph: true` (the whole step captured once and replayed). Each side trains
the same model on the same data with the same optimizer (SGD with momentum 0.9 for ResNet-50 and
the MLP, AdamW for the transformer) for --steps steps after --warmup; Trainyard's rate is read
from its progress lines, PyTorch's timed with CUDA synchronisation at the ends.

Math modes: both sides keep PyTorch's defaults (float32 matrix products, TF32 convolutions, which
cuDNN uses by default), except the tf32 cases, where both allow TF32 matrix products
(`precision: tf32`; torch.backends.cuda.matmul.allow_tf32 for PyTorch). Trainyard picks the
layout itself (channels-last for a model with convolutions on a GPU) and turns cuDNN's autotuning
on for static shapes; PyTorch's sides run the model as written (contiguous), and torch.compile
chooses its own layouts. GPU utilisation is NVML's (nvidia-ml-py) sampled every 100 ms while a
side runs; model FLOPs utilisation is the FLOPs of one training step (forward and backward,
counted by torch.utils.flop_counter) times steps per second over the GPU's dense peak for the
precision (H100/H200 SXM: 989 TFLOP/s bf16, 495 for fp32 and tf32 as TF32; --peak-tflops
overrides).

  python3 bench/gpu_models.py TRAINYARD_CLI WORK_DIR [--steps 60] [--warmup 20] [--batch 128]
      [--image 224] [--only resnet50-fp32,resnet50-bf16,transformer-fp32,transformer-tf32,
      transformer-bf16,mlp] [--no-compile]

Prints a Markdown table, one row as each case ends (a run cut short keeps the rows so far), and,
last, one JSON line with every figure. Needs the local cluster the check starts
(TRAINYARD_COORDINATOR) with the trainer built against this PyTorch. A variant that fails (a
compile error, a graph that cannot be captured) gives a dash and its error in the JSON, and the
others go on.
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

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "examples", "transformer"))
from flat_model import Flat  # noqa: E402

PEAK_TFLOPS = {"H100": {"bf16": 989.0, "fp32": 495.0, "tf32": 495.0},
               "H200": {"bf16": 989.0, "fp32": 495.0, "tf32": 495.0},
               "A100": {"bf16": 312.0, "fp32": 156.0, "tf32": 156.0}}
ALL_CASES = ("resnet50-fp32,resnet50-bf16,transformer-fp32,transformer-tf32,transformer-bf16,"
             "mlp")
# The transformer's shape: a GPU-sized version of bench/transformer_step.py's.
LM = {"vocab": 256, "context": 256, "layers": 8, "dim": 512, "heads": 8}


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


class MathModes:
    """PyTorch's TF32 switch for matrix products while inside (the tf32 cases)."""

    def __init__(self, precision):
        self.tf32 = precision == "tf32"

    def __enter__(self):
        self.saved = torch.backends.cuda.matmul.allow_tf32
        torch.backends.cuda.matmul.allow_tf32 = self.tf32 or self.saved
        return self

    def __exit__(self, *exc):
        torch.backends.cuda.matmul.allow_tf32 = self.saved


def autocast(precision):
    return torch.autocast("cuda", dtype=torch.bfloat16, enabled=precision == "bf16")


class Case:
    """One model at one precision: its data on the host, PyTorch's step and Trainyard's spec."""

    def __init__(self, label, precision, make_model, batches, loss_of, spec_model, spec_data,
                 optimizer, probe):
        self.label, self.precision = label, precision
        self.make_model = make_model  # a fresh model, initialised the same way each time
        self.batches = batches        # i -> (x, y) on the GPU, from pinned host memory
        self.loss_of = loss_of        # (model, x, y) -> loss
        self.spec_model, self.spec_data, self.optimizer = spec_model, spec_data, optimizer
        self.probe = probe            # (x, y) on the GPU for the FLOP count


def torch_optimizer(name, params):
    if name == "adamw":
        return torch.optim.AdamW(params, lr=1e-3, weight_decay=0.01)
    return torch.optim.SGD(params, lr=0.01, momentum=0.9)


def torch_rate(case, compile_mode, steps, warmup, batch):
    """Samples/s of the plain loop (eager, or the model compiled in `compile_mode`)."""
    model = case.make_model().cuda().train()
    opt = torch_optimizer(case.optimizer, model.parameters())
    run = model
    if compile_mode is not None:
        run = torch.compile(model) if compile_mode == "default" else torch.compile(
            model, mode=compile_mode)
    mark = getattr(getattr(torch, "compiler", None), "cudagraph_mark_step_begin", None)

    def one(i):
        if compile_mode == "reduce-overhead" and mark is not None:
            mark()
        x, y = case.batches(i)
        with autocast(case.precision):
            loss = case.loss_of(run, x, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    with MathModes(case.precision):
        for i in range(warmup):
            one(i)
        torch.cuda.synchronize()
        with GpuSampler() as gpu:
            began = time.perf_counter()
            for i in range(steps):
                one(warmup + i)
            torch.cuda.synchronize()
            seconds = time.perf_counter() - began
    return batch * steps / seconds, gpu.mean()


def trainyard_rate(cli, work, name, case, batch, steps, warmup, graph):
    precision = case.precision
    optimizer = ("{name: adamw, lr: 0.001, weight_decay: 0.01}" if case.optimizer == "adamw"
                 else "{name: sgd, lr: 0.01, momentum: 0.9}")
    spec = f"""name: {name}
resources: {{gpus_per_worker: 1}}
model: {case.spec_model}
data: {case.spec_data}
batch_size: {batch}
optimizer: {optimizer}
loss: cross_entropy
precision: {precision}
cuda_graph: {"true" if graph else "false"}
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
        raise RuntimeError(f"{name}: job {job} exit {out.returncode}\n{out.stdout[-1000:]}\n"
                           f"{out.stderr[-1000:]}\n{logs[-2000:]}")
    described = json.loads(subprocess.run([cli, "describe", job, "-o", "json"],
                                          capture_output=True, text=True).stdout)
    progress = described.get("progress", {})
    split = {k: float(progress.get(k, 0)) for k in
             ("dataWaitSeconds", "computeSeconds", "communicationSeconds", "checkpointSeconds")}
    whole = sum(split.values()) or 1.0
    return statistics.median(measured), gpu.mean(), split["dataWaitSeconds"] / whole


def step_flops(case):
    try:
        from torch.utils.flop_counter import FlopCounterMode
    except ImportError:
        return None
    model = case.make_model().cuda().train()
    counter = FlopCounterMode(display=False)
    with counter:
        with autocast(case.precision):
            loss = case.loss_of(model, *case.probe)
        loss.backward()
    return counter.get_total_flops()


def pack(cli, work, name, features, labels):
    os.makedirs(f"{work}/{name}", exist_ok=True)
    np.save(f"{work}/{name}-x.npy", features)
    np.save(f"{work}/{name}-y.npy", labels)
    subprocess.run([cli, "data", "pack", f"{work}/{name}/train", f"x={work}/{name}-x.npy",
                    f"y={work}/{name}-y.npy"], check=True, capture_output=True)
    return f"{work}/{name}"


def pinned_batches(x, y, batch, scale=None):
    host = (torch.from_numpy(x).pin_memory(), torch.from_numpy(y).pin_memory())
    n = host[0].shape[0]

    def take(i):
        lo = (i * batch) % (n - batch + 1)
        xb = host[0][lo:lo + batch].cuda(non_blocking=True)
        if scale is not None:
            xb = xb.float().mul_(scale)
        return xb, host[1][lo:lo + batch].cuda(non_blocking=True)
    return take


def classification_loss(model, x, y):
    return nn.functional.cross_entropy(model(x), y)


def resnet_cases(args, wanted, rng):
    import torchvision
    h = args.image
    images = rng.integers(0, 256, size=(args.samples, 3 * h * h), dtype=np.uint8)
    labels = rng.integers(0, 1000, size=(args.samples,), dtype=np.int64)
    data = pack(args.cli, args.work, "images", images, labels)

    def make():
        torch.manual_seed(0)
        return Flat(torchvision.models.resnet50(num_classes=1000), [-1, 3, h, h])
    scripted = f"{args.work}/resnet50.pt"
    torch.jit.script(make()).save(scripted)
    batches = pinned_batches(images, labels, args.batch, 1 / 255)
    probe = (torch.randn(args.batch, 3 * h * h).cuda(),
             torch.randint(0, 1000, (args.batch,)).cuda())
    return [Case(f"resnet50-{p}", p, make, batches, classification_loss,
                 f"{{torchscript: {scripted}}}",
                 f'{{train: "{data}/*.safetensors", feature_scale: {1 / 255}}}', "sgd", probe)
            for p in ("fp32", "tf32", "bf16") if f"resnet50-{p}" in wanted]


def transformer_cases(args, wanted, rng):
    import transformer
    context = LM["context"]
    tokens = args.lm_batch * (args.steps + args.warmup + 10) * context + context + 1
    os.makedirs(f"{args.work}/text", exist_ok=True)
    with open(f"{args.work}/text.txt", "wb") as f:
        f.write(rng.integers(32, 127, size=tokens, dtype=np.uint8).tobytes())
    subprocess.run([args.cli, "data", "pack", "--text", f"{args.work}/text.txt",
                    f"{args.work}/text/t"], check=True, capture_output=True)
    pattern = f"{args.work}/text/t-*.safetensors"
    windows = torch.from_numpy(transformer.windows(pattern, context)).pin_memory()
    n = windows.shape[0]

    def make():
        return transformer.TransformerLM(LM["vocab"], context, LM["layers"], LM["dim"],
                                         LM["heads"]).initialise(1)

    def batches(i):  # the windows in order, as `shuffle: false` reads them
        lo = (i * args.lm_batch) % (n - args.lm_batch + 1)
        w = windows[lo:lo + args.lm_batch].cuda(non_blocking=True).long()
        return w[:, :-1], w[:, 1:]

    def loss_of(model, x, y):
        logits = model(x)
        return nn.functional.cross_entropy(logits.reshape(-1, logits.size(-1)), y.reshape(-1))
    shape = ", ".join(f"{k}: {v}" for k, v in LM.items())
    probe = batches(0)
    return [Case(f"transformer-{p}", p, make, batches, loss_of,
                 f"{{builtin: transformer, args: {{{shape}}}}}",
                 f'{{tokens: "{pattern}", shuffle: false}}', "adamw", probe)
            for p in ("fp32", "tf32", "bf16") if f"transformer-{p}" in wanted]


def mlp_cases(args, wanted, rng):
    if "mlp" not in wanted:
        return []
    x = rng.standard_normal((args.samples * 8, 784), dtype=np.float32)
    y = rng.integers(0, 10, size=(args.samples * 8,), dtype=np.int64)
    data = pack(args.cli, args.work, "mlp", x, y)

    def make():
        torch.manual_seed(0)
        return mlp(784, 4096, 10)
    scripted = f"{args.work}/mlp.pt"
    torch.jit.script(make()).save(scripted)
    probe = (torch.randn(args.batch, 784).cuda(), torch.randint(0, 10, (args.batch,)).cuda())
    return [Case("mlp", "fp32", make, pinned_batches(x, y, args.batch), classification_loss,
                 f"{{torchscript: {scripted}}}", f'{{train: "{data}/*.safetensors"}}', "sgd",
                 probe)]


def fmt(v, spec):
    return "—" if v is None else format(v, spec)


def run_case(args, case, peak, figures):
    batch = args.lm_batch if case.label.startswith("transformer") else args.batch
    row = {"case": case.label}
    name = case.label.replace("_", "-")
    for key, graph in (("trainyard", False), ("trainyard_graph", True)):
        try:
            job = name + ("-graph" if graph else "")
            rate, util, wait = trainyard_rate(args.cli, args.work, job, case, batch, args.steps,
                                              args.warmup, graph)
            row[key], row[f"gpu_util_{key}"] = rate, util
            if not graph:
                row["data_wait_share"] = wait
        except Exception as e:  # report, do not stop the others
            row[key] = None
            figures[f"{case.label}_{key}_error"] = str(e)[:300]
    variants = [("eager", None)]
    if not args.no_compile:
        variants += [("compiled", "default"), ("compiled_ro", "reduce-overhead")]
    for key, mode in variants:
        try:
            row[key], row[f"gpu_util_{key}"] = torch_rate(case, mode, args.steps, args.warmup,
                                                          batch)
        except Exception as e:
            row[key] = None
            figures[f"{case.label}_{key}_error"] = str(e)[:300]
        if mode is not None and hasattr(torch, "_dynamo"):
            torch._dynamo.reset()  # the next variant compiles afresh
    best = max((row.get("trainyard") or 0), (row.get("trainyard_graph") or 0)) or None
    row["trainyard_best"] = best
    for key in ("eager", "compiled", "compiled_ro"):
        row[f"vs_{key}"] = best / row[key] if best and row.get(key) else None
    flops = step_flops(case)
    peak_t = args.peak_tflops or (peak or {}).get(case.precision)
    row["step_gflops"] = flops / 1e9 if flops else None
    mfu = flops and peak_t and best
    row["mfu_trainyard"] = flops * best / batch / (peak_t * 1e12) if mfu else None
    return row


def main():
    p = argparse.ArgumentParser()
    p.add_argument("cli")
    p.add_argument("work")
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--warmup", type=int, default=20)
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--lm-batch", type=int, default=32)
    p.add_argument("--image", type=int, default=224)
    p.add_argument("--samples", type=int, default=2048)
    p.add_argument("--peak-tflops", type=float)
    p.add_argument("--only", default=ALL_CASES)
    p.add_argument("--no-compile", action="store_true", help="eager PyTorch only")
    args = p.parse_args()
    os.makedirs(args.work, exist_ok=True)
    name = torch.cuda.get_device_name(0)
    peak = next((v for k, v in PEAK_TFLOPS.items() if k in name), None)
    rng = np.random.default_rng(0)
    figures = {"device": name, "torch": torch.__version__}
    wanted = args.only.split(",")
    print(f"{name}, PyTorch {torch.__version__}, {args.steps} steps after {args.warmup}; batch "
          f"{args.batch} (transformer {args.lm_batch} windows of {LM['context']})\n")
    print("| case | Trainyard | + cuda_graph | eager | torch.compile | reduce-overhead | "
          "best vs eager | vs compile | vs reduce-overhead | GPU util (ours / graph / eager / "
          "compile / r-o) | data wait | MFU |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- | ---: | ---: |",
          flush=True)
    makers = (resnet_cases, transformer_cases, mlp_cases)
    for make in makers:
        for case in make(args, wanted, rng):
            r = run_case(args, case, peak, figures)
            figures[case.label] = r
            utils = " / ".join(fmt(r.get(f"gpu_util_{k}"), ".0f") for k in
                               ("trainyard", "trainyard_graph", "eager", "compiled",
                                "compiled_ro"))
            print(f"| {r['case']} | {fmt(r.get('trainyard'), ',.0f')} | "
                  f"{fmt(r.get('trainyard_graph'), ',.0f')} | {fmt(r.get('eager'), ',.0f')} | "
                  f"{fmt(r.get('compiled'), ',.0f')} | {fmt(r.get('compiled_ro'), ',.0f')} | "
                  f"{fmt(r.get('vs_eager'), '.2f')} | {fmt(r.get('vs_compiled'), '.2f')} | "
                  f"{fmt(r.get('vs_compiled_ro'), '.2f')} | {utils} % | "
                  f"{fmt(r.get('data_wait_share'), '.1%')} | "
                  f"{fmt(r.get('mfu_trainyard'), '.1%')} |", flush=True)
    print("\nSamples per second (the transformer: windows per second). 'best': the faster of "
          "Trainyard's two runs.")
    print(json.dumps(figures))


if __name__ == "__main__":
    sys.exit(main())
