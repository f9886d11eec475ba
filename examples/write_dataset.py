#!/usr/bin/python3
"""Writes a learnable classification data set as safetensors files, using numpy only.

Each file holds `x` (float32, [n, features]) and `y` (int64 class ids, [n]). Samples lie around
one random centre per class, so a small model can learn them. The same arguments write the same
bytes.

  /usr/bin/python3 examples/write_dataset.py --out-dir /tmp/data --samples 1000 --features 16 \
      --classes 4 --files 2 --seed 7
  # data.train: /tmp/data/train-*.safetensors
"""

import argparse
import json
import os
import struct

import numpy as np


def write_safetensors(path, tensors):
    """tensors: name -> numpy array (float32 or int64). Writes the file atomically."""
    dtypes = {np.dtype("float32"): "F32", np.dtype("int64"): "I64"}
    header = {}
    chunks = []
    offset = 0
    for name in sorted(tensors):
        array = np.ascontiguousarray(tensors[name])
        data = array.astype(array.dtype.newbyteorder("<"), copy=False).tobytes()
        header[name] = {
            "dtype": dtypes[array.dtype],
            "shape": list(array.shape),
            "data_offsets": [offset, offset + len(data)],
        }
        chunks.append(data)
        offset += len(data)
    header_bytes = json.dumps(header, separators=(",", ":")).encode("utf-8")
    header_bytes += b" " * (-len(header_bytes) % 8)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(header_bytes)))
        f.write(header_bytes)
        for chunk in chunks:
            f.write(chunk)
    os.replace(tmp, path)


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out-dir", required=True, help="folder for train-NNNNN.safetensors")
    parser.add_argument("--samples", type=int, default=1000, help="samples over all files")
    parser.add_argument("--features", type=int, default=16)
    parser.add_argument("--classes", type=int, default=4)
    parser.add_argument("--files", type=int, default=1, help="how many files to split into")
    parser.add_argument("--noise", type=float, default=0.5,
                        help="standard deviation around each class centre")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    if args.samples < args.files or args.files < 1:
        parser.error("need --files >= 1 and --samples >= --files")

    rng = np.random.default_rng(args.seed)
    centres = rng.normal(0.0, 1.0, size=(args.classes, args.features))
    y = rng.integers(0, args.classes, size=args.samples, dtype=np.int64)
    x = (centres[y] + args.noise * rng.normal(0.0, 1.0, size=(args.samples, args.features)))
    x = x.astype(np.float32)

    os.makedirs(args.out_dir, exist_ok=True)
    bounds = np.linspace(0, args.samples, args.files + 1).astype(np.int64)
    for i in range(args.files):
        lo, hi = bounds[i], bounds[i + 1]
        path = os.path.join(args.out_dir, "train-%05d.safetensors" % i)
        write_safetensors(path, {"x": x[lo:hi], "y": y[lo:hi]})
        print(path)


if __name__ == "__main__":
    main()
