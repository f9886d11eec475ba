#!/usr/bin/python3
"""The reference for the PyTorch parity test: the plain PyTorch loop that a Trainyard `single`
job with SGD and no shuffling must match step for step. Prints `step=N loss=X` lines."""
import argparse
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
    parser.add_argument("--compare-with", help="a trained TorchScript model to compare the "
                        "final parameters with; prints max_param_diff=X")
    args = parser.parse_args()

    torch.set_num_threads(1)
    files = sorted(glob.glob(args.data))
    parts = [read_safetensors(f) for f in files]
    x = torch.from_numpy(np.concatenate([p[args.features] for p in parts]).astype(np.float32))
    y = torch.from_numpy(np.concatenate([p[args.labels] for p in parts]).astype(np.int64))
    model = torch.jit.load(args.model)
    model.train()
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum)
    steps_per_epoch = x.shape[0] // args.batch
    for step in range(args.steps):
        i = step % steps_per_epoch
        xb = x[i * args.batch:(i + 1) * args.batch]
        yb = y[i * args.batch:(i + 1) * args.batch]
        optimizer.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(xb), yb)
        loss.backward()
        optimizer.step()
        print(f"step={step + 1} loss={loss.item():.8f}", flush=True)
    if args.compare_with:
        trained = dict(torch.jit.load(args.compare_with).named_parameters())
        ours = dict(model.named_parameters())
        if sorted(trained) != sorted(ours):
            raise SystemExit(f"parameter names differ: {sorted(trained)} vs {sorted(ours)}")
        diff = max((trained[k] - ours[k]).abs().max().item() for k in ours)
        print(f"max_param_diff={diff:.3e}", flush=True)


if __name__ == "__main__":
    main()
