#!/usr/bin/python3
"""Writes small grey-scale images of glyphs as sharded safetensors, for the distillation example.

Each class is a random GLYPH x GLYPH pattern of 0s and 1s (fixed by --glyph-seed), drawn at a
random place in a SIDE x SIDE image with Gaussian noise added. Where a glyph sits varies from
sample to sample, which a CNN (convolutions and pooling) takes in its stride and an MLP has to
learn position by position: with few samples, an MLP learns this set poorly.

The shards hold `x` (float32, [n, 1, SIDE, SIDE]) and `y` (int64 class ids, [n]): first the
--train training samples (drawn from --seed), then the --validation held-out ones (drawn from
--validation-seed, so sets written with different --seed share them). Set the job's
data.validation_split to validation / (train + validation).

  /usr/bin/python3 examples/distill/write_glyphs.py --out-dir /tmp/glyphs --train 2000 \\
      --validation 3000 --seed 2
  # data.train: /tmp/glyphs/train-*.safetensors, data.validation_split: 0.6

The `trainyard` binary is found as examples/write_dataset.py finds it.
"""

import argparse
import os
import subprocess
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from write_dataset import find_trainyard  # noqa: E402


def draw(count, seed, glyphs, side, noise):
    rng = np.random.default_rng(seed)
    classes, glyph = glyphs.shape[0], glyphs.shape[1]
    y = rng.integers(0, classes, size=count, dtype=np.int64)
    x = noise * rng.normal(0.0, 1.0, size=(count, 1, side, side))
    places = rng.integers(0, side - glyph + 1, size=(count, 2))
    for i in range(count):
        r, c = places[i]
        x[i, 0, r:r + glyph, c:c + glyph] += glyphs[y[i]]
    return x.astype(np.float32), y


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out-dir", required=True, help="folder for train-NNNNN.safetensors")
    parser.add_argument("--train", type=int, required=True, help="training samples")
    parser.add_argument("--validation", type=int, default=0, help="held-out samples, last")
    parser.add_argument("--seed", type=int, default=0, help="draws the training samples")
    parser.add_argument("--validation-seed", type=int, default=1000,
                        help="draws the held-out samples")
    parser.add_argument("--glyph-seed", type=int, default=0, help="draws the classes' glyphs")
    parser.add_argument("--classes", type=int, default=10)
    parser.add_argument("--side", type=int, default=10, help="images are SIDE x SIDE")
    parser.add_argument("--glyph", type=int, default=5, help="glyphs are GLYPH x GLYPH")
    parser.add_argument("--noise", type=float, default=0.3, help="standard deviation per pixel")
    parser.add_argument("--trainyard", help="the trainyard binary")
    args = parser.parse_args()
    if args.train < 1 or args.validation < 0 or not 1 <= args.glyph <= args.side:
        parser.error("need --train >= 1, --validation >= 0 and 1 <= --glyph <= --side")

    glyphs = (np.random.default_rng(args.glyph_seed)
              .random((args.classes, args.glyph, args.glyph)) < 0.5).astype(np.float64)
    x, y = draw(args.train, args.seed, glyphs, args.side, args.noise)
    if args.validation > 0:
        xv, yv = draw(args.validation, args.validation_seed, glyphs, args.side, args.noise)
        x, y = np.concatenate([x, xv]), np.concatenate([y, yv])

    trainyard = find_trainyard(args.trainyard)
    os.makedirs(args.out_dir, exist_ok=True)
    with tempfile.TemporaryDirectory() as arrays:
        np.save(os.path.join(arrays, "x.npy"), x)
        np.save(os.path.join(arrays, "y.npy"), y)
        subprocess.run([trainyard, "data", "pack", os.path.join(args.out_dir, "train"),
                        "x=" + os.path.join(arrays, "x.npy"), "y=" + os.path.join(arrays, "y.npy")],
                       check=True)
    print(f"{args.out_dir}: {args.train} training and {args.validation} validation samples; "
          f"data.validation_split: {args.validation / (args.train + args.validation):.6g}")


if __name__ == "__main__":
    main()
