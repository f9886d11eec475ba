#!/usr/bin/python3
"""Writes a learnable classification data set as sharded safetensors: NumPy makes the arrays,
`trainyard data pack` writes the shards and `trainyard data inspect` shows what it wrote.

The shards hold `x` (float32, [n, features]) and `y` (int64 class ids, [n]). Samples lie around
one random centre per class, so a small model can learn them. The same arguments write the same
bytes.

  /usr/bin/python3 examples/write_dataset.py --out-dir /tmp/trainyard-examples/mlp-data \
      --samples 20000 --features 32 --classes 4 --noise 4 --files 4 --seed 1
  # data.train: /tmp/trainyard-examples/mlp-data/train-*.safetensors
  # (what examples/data-parallel-mlp.yaml and safetensors-mlp.yaml read)

The `trainyard` binary is found through $TRAINYARD_BIN_DIR, then $PATH, then build/bin of this
checkout (or give --trainyard).
"""

import argparse
import os
import shutil
import subprocess
import sys
import tempfile

import numpy as np


def find_trainyard(given):
    if given:
        return given
    candidates = []
    if os.environ.get("TRAINYARD_BIN_DIR"):
        candidates.append(os.path.join(os.environ["TRAINYARD_BIN_DIR"], "trainyard"))
    if shutil.which("trainyard"):
        candidates.append(shutil.which("trainyard"))
    candidates.append(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "build",
                                   "bin", "trainyard"))
    for path in candidates:
        if os.access(path, os.X_OK):
            return path
    sys.exit("cannot find the trainyard binary: build it (make build) or pass --trainyard")


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
    parser.add_argument("--trainyard", help="the trainyard binary")
    args = parser.parse_args()
    if args.samples < args.files or args.files < 1:
        parser.error("need --files >= 1 and --samples >= --files")

    rng = np.random.default_rng(args.seed)
    centres = rng.normal(0.0, 1.0, size=(args.classes, args.features))
    y = rng.integers(0, args.classes, size=args.samples, dtype=np.int64)
    x = (centres[y] + args.noise * rng.normal(0.0, 1.0, size=(args.samples, args.features)))
    x = x.astype(np.float32)

    trainyard = find_trainyard(args.trainyard)
    os.makedirs(args.out_dir, exist_ok=True)
    # Shards of ceil(samples / files) samples: --files of them (fewer when that does not divide).
    per_shard = -(-args.samples // args.files)
    shard_bytes = per_shard * (4 * args.features + 8)
    with tempfile.TemporaryDirectory() as arrays:
        np.save(os.path.join(arrays, "x.npy"), x)
        np.save(os.path.join(arrays, "y.npy"), y)
        prefix = os.path.join(args.out_dir, "train")
        subprocess.run([trainyard, "data", "pack", prefix,
                        "x=" + os.path.join(arrays, "x.npy"), "y=" + os.path.join(arrays, "y.npy"),
                        "--shard-size", str(shard_bytes)], check=True)
    subprocess.run([trainyard, "data", "inspect", os.path.join(args.out_dir, "train-*.safetensors")],
                   check=True)

if __name__ == "__main__":
    main()
