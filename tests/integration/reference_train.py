#!/usr/bin/python3
"""The reference for the PyTorch parity test: the plain PyTorch loop that a Trainyard job with SGD
and no shuffling must match step for step (a `single` job, and a `data_parallel` or synchronous
`parameter_server` one, whose ranks split each batch and average their gradients). With
--teacher, the loss is knowledge distillation's:
  (1 - alpha) * cross_entropy(student, labels)
  + alpha * T^2 * kl_div(log_softmax(student / T), log_softmax(teacher / T), batchmean),
the teacher in eval mode under no_grad. With --precision bf16 or fp16, the forward pass and the
loss run under torch.autocast(device, dtype), backward outside it, and fp16 scales the loss with
torch.amp.GradScaler (GPU only). --device cuda trains on the first GPU. Prints `step=N loss=X`
lines."""
import argparse
import contextlib
import glob
import json
import struct

import numpy as np
import torch

DTYPES = {"F32": np.float32, "F64": np.float64, "I64": np.int64, "I32": np.int32,
          "U8": np.uint8, "I8": np.int8, "I16": np.int16, "F16": np.float16}


def read_safetensors(path):
    with open(path, "rb") as f:
        data = f.read()
    (header_len,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + header_len])
    body = data[8 + header_len:]
    tensors = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        begin, end = info["data_offsets"]
        array = np.frombuffer(body[begin:end], dtype=DTYPES[info["dtype"]]).reshape(info["shape"])
        tensors[name] = array
    return tensors


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", required=True)
    parser.add_argument("--data", required=True, help="glob of safetensors files")
    parser.add_argument("--features", default="x")
    parser.add_argument("--labels", default="y")
    parser.add_argument("--batch", type=int, required=True)
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--lr", type=float, required=True)
    parser.add_argument("--momentum", type=float, default=0.0)
    parser.add_argument("--teacher", help="a TorchScript teacher: distil it into the model")
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--alpha", type=float, default=0.5)
    parser.add_argument("--precision", choices=["fp32", "bf16", "fp16"], default="fp32")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--compare-with", action="append", default=[],
                        help="a trained TorchScript model to compare the final parameters with; "
                        "prints max_param_diff=X model=PATH (repeat it for several)")
    args = parser.parse_args()

    torch.set_num_threads(1)
    # The reference runs the scripted modules as written, through the simple executor: PyTorch
    # 2.6's profiling executor (Debian 13) stalls for minutes on a module's third call, and its
    # optimisations are not what is compared.
    torch._C._jit_set_profiling_executor(False)
    torch._C._get_graph_executor_optimize(False)
    files = sorted(glob.glob(args.data))
    parts = [read_safetensors(f) for f in files]
    x = torch.from_numpy(np.concatenate([p[args.features] for p in parts]).astype(np.float32))
    y = torch.from_numpy(np.concatenate([p[args.labels] for p in parts]).astype(np.int64))
    device = torch.device(args.device)
    x, y = x.to(device), y.to(device)
    model = torch.jit.load(args.model, map_location=device)
    model.train()
    teacher = None
    if args.teacher:
        teacher = torch.jit.load(args.teacher, map_location=device)
        teacher.eval()
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum)
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[args.precision]
    scaler = None
    if args.precision == "fp16":
        # torch.amp.GradScaler from PyTorch 2.3; torch.cuda.amp's before.
        if hasattr(torch.amp, "GradScaler"):
            scaler = torch.amp.GradScaler("cuda")
        else:
            scaler = torch.cuda.amp.GradScaler()
    steps_per_epoch = x.shape[0] // args.batch
    for step in range(args.steps):
        i = step % steps_per_epoch
        xb = x[i * args.batch:(i + 1) * args.batch]
        yb = y[i * args.batch:(i + 1) * args.batch]
        optimizer.zero_grad()
        # PyTorch 1.13 refuses a CPU autocast dtype other than bfloat16 even when disabled.
        mixed = (torch.autocast(args.device, dtype=dtype) if args.precision != "fp32"
                 else contextlib.nullcontext())
        with mixed:
            out = model(xb)
            loss = torch.nn.functional.cross_entropy(out, yb)
            if teacher is not None:
                with torch.no_grad():
                    soft = teacher(xb)
                t = args.temperature
                kl = torch.nn.functional.kl_div(torch.log_softmax(out / t, 1),
                                                torch.log_softmax(soft / t, 1),
                                                reduction="batchmean", log_target=True)
                loss = (1 - args.alpha) * loss + args.alpha * t * t * kl
        if scaler is None:
            loss.backward()
            optimizer.step()
        else:
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
        print(f"step={step + 1} loss={loss.item():.8f}", flush=True)
    ours = dict(model.named_parameters())
    for path in args.compare_with:
        trained = dict(torch.jit.load(path, map_location=device).named_parameters())
        if sorted(trained) != sorted(ours):
            raise SystemExit(f"parameter names differ: {sorted(trained)} vs {sorted(ours)}")
        diff = max((trained[k] - ours[k]).abs().max().item() for k in ours)
        print(f"max_param_diff={diff:.3e} model={path}", flush=True)


if __name__ == "__main__":
    main()
