#!/usr/bin/python3
"""The PyTorch peers of bench/data_path.sh: the MLP Trainyard's `mlp` builds (Linear and ReLU per
hidden width, then Linear), SGD, cross entropy, one LibTorch thread in the training process, on
the same safetensors shards, fed two ways:

- dataloader: the idiomatic way, a map-style Dataset over the shard files (np.memmap of each
  shard's tensors, one sample per __getitem__, converted to float32 and scaled there),
  DataLoader(num_workers=2, shuffle=True, drop_last=True) with the default collate;
- memory: the hand-tuned way, every tensor read into memory once (features as float32, already
  scaled), each batch an index_select of a per-epoch permutation.

    data_torch.py MODE GLOB --inputs W --hidden 256,128 --batch 128 --steps 2000

Prints one JSON line: samples/s over the steps after the first `--warmup`.
"""
import argparse
import bisect
import glob
import json
import struct
import time

import numpy as np
import torch

DTYPES = {"F64": "<f8", "F32": "<f4", "F16": "<f2", "I64": "<i8", "I32": "<i4", "I16": "<i2",
          "I8": "i1", "U8": "u1"}


def shard_arrays(path, names):
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
    arrays = {}
    for name in names:
        info = header[name]
        begin, end = info["data_offsets"]
        arrays[name] = np.memmap(path, dtype=DTYPES[info["dtype"]], mode="r",
                                 offset=8 + n + begin, shape=tuple(info["shape"]))
    return arrays


class ShardDataset(torch.utils.data.Dataset):
    """One sample at a time from memory-mapped shards, as a map-style Dataset usually is."""

    def __init__(self, files, scale):
        self.files = files
        self.scale = scale
        self.shards = None  # opened in each worker
        counts = [shard_arrays(f, ["y"])["y"].shape[0] for f in files]
        self.starts = np.cumsum([0] + counts).tolist()

    def __len__(self):
        return self.starts[-1]

    def __getitem__(self, i):
        if self.shards is None:
            self.shards = [shard_arrays(f, ["x", "y"]) for f in self.files]
        k = bisect.bisect_right(self.starts, i) - 1
        shard = self.shards[k]
        row = i - self.starts[k]
        x = torch.from_numpy(shard["x"][row].astype(np.float32)) * self.scale
        return x, int(shard["y"][row])


def batches_dataloader(files, args):
    dataset = ShardDataset(files, args.scale)
    loader = torch.utils.data.DataLoader(dataset, batch_size=args.batch, shuffle=True,
                                         num_workers=2, drop_last=True,
                                         generator=torch.Generator().manual_seed(1))
    while True:
        for x, y in loader:
            yield x, y


def batches_memory(files, args):
    parts = [shard_arrays(f, ["x", "y"]) for f in files]
    x = torch.from_numpy(np.concatenate([p["x"] for p in parts]).astype(np.float32)) * args.scale
    y = torch.from_numpy(np.concatenate([p["y"] for p in parts]).astype(np.int64))
    g = torch.Generator().manual_seed(1)
    while True:
        order = torch.randperm(x.shape[0], generator=g)
        for b in range(x.shape[0] // args.batch):
            index = order[b * args.batch:(b + 1) * args.batch]
            yield x.index_select(0, index), y.index_select(0, index)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("mode", choices=["dataloader", "memory"])
    parser.add_argument("data")
    parser.add_argument("--inputs", type=int, required=True)
    parser.add_argument("--hidden", default="256,128")
    parser.add_argument("--classes", type=int, default=10)
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--warmup", type=int, default=100)
    parser.add_argument("--scale", type=float, default=1 / 255)
    parser.add_argument("--lr", type=float, default=0.01)
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    files = sorted(glob.glob(args.data))
    layers, width = [], args.inputs
    for h in [int(h) for h in args.hidden.split(",") if h]:
        layers += [torch.nn.Linear(width, h), torch.nn.ReLU()]
        width = h
    model = torch.nn.Sequential(*layers, torch.nn.Linear(width, args.classes))
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)
    feed = batches_dataloader(files, args) if args.mode == "dataloader" else batches_memory(
        files, args)
    start = time.perf_counter()
    loss = None
    for step in range(args.steps):
        if step == args.warmup:
            start = time.perf_counter()
        x, y = next(feed)
        optimizer.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
    seconds = time.perf_counter() - start
    print(json.dumps({"mode": args.mode, "samples_per_second":
                      round((args.steps - args.warmup) * args.batch / seconds),
                      "loss": round(loss.item(), 4)}))


if __name__ == "__main__":
    main()
