#!/usr/bin/python3
"""Writes a click-through-style data set as sharded safetensors: NumPy makes the arrays,
`trainyard data pack` writes the shards and `trainyard data inspect` shows what it wrote.

Each file holds `ids` (int64 categorical ids, [n, fields]: a user, an item, a context, ... per
field), `x` (float32 dense features, [n, dense]) and `y` (int64 click labels 0 or 1, [n]). Ids
follow a Zipf-like law per field (a few ids are very common, most are rare, as in real logs), and
a sample is clicked with the probability a hidden model gives it: a weight per id plus a linear
term on the dense features, through a logistic function. The same arguments write the same bytes.

  /usr/bin/python3 examples/write_ctr_dataset.py --out-dir /tmp/ctr --samples 100000 \
      --vocab 1000000 1000 100 --dense 4 --files 4 --seed 7
  # data: {train: /tmp/ctr/train-*.safetensors, features: x, labels: y, categorical: ids}
  # model: {builtin: embedding_mlp, args: {vocab: [1000000, 1000, 100], dim: 16, hidden: [64],
  #         classes: 2, inputs: 4}}

The `trainyard` binary is found as write_dataset.py finds it (or give --trainyard).
"""

import argparse
import os
import subprocess
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from write_dataset import find_trainyard  # noqa: E402


def zipf_ids(rng, vocab, n, exponent):
    """n ids in [0, vocab): id k drawn with probability proportional to 1 / (k + 1) ** exponent,
    then scattered by a fixed permutation so that the common ids are not the small numbers."""
    # Inverse-CDF sampling over a capped table keeps memory at O(min(vocab, 2**22)).
    table = min(vocab, 1 << 22)
    weights = 1.0 / np.power(np.arange(1, table + 1, dtype=np.float64), exponent)
    cdf = np.cumsum(weights)
    cdf /= cdf[-1]
    ranks = np.searchsorted(cdf, rng.random(n), side="right")
    ranks = np.minimum(ranks, table - 1).astype(np.int64)
    if vocab > table:  # the tail beyond the table: spread uniformly
        tail = rng.random(n) < 0.1
        ranks[tail] = rng.integers(table, vocab, size=int(tail.sum()), dtype=np.int64)
    # An affine bijection of [0, vocab) stands in for a permutation of a huge vocabulary.
    a = 2654435761 % vocab or 1
    while np.gcd(a, vocab) != 1:
        a += 1
    return (ranks * a + 12345) % vocab


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out-dir", required=True, help="folder for train-NNNNN.safetensors")
    parser.add_argument("--samples", type=int, default=100000, help="samples over all files")
    parser.add_argument("--vocab", type=int, nargs="+", default=[100000, 1000, 100],
                        help="ids per categorical field")
    parser.add_argument("--dense", type=int, default=4, help="dense features per sample")
    parser.add_argument("--exponent", type=float, default=1.05, help="Zipf exponent of the ids")
    parser.add_argument("--files", type=int, default=1, help="how many files to split into")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--trainyard", help="the trainyard binary")
    args = parser.parse_args()
    if args.samples < args.files or args.files < 1:
        parser.error("need --files >= 1 and --samples >= --files")
    if any(v < 1 for v in args.vocab) or args.dense < 0:
        parser.error("need every --vocab >= 1 and --dense >= 0")

    rng = np.random.default_rng(args.seed)
    ids = np.stack([zipf_ids(rng, v, args.samples, args.exponent) for v in args.vocab], axis=1)
    x = rng.normal(0.0, 1.0, size=(args.samples, args.dense)).astype(np.float32)
    # The hidden model: a weight per id (hashed, so that no table of vocab weights is needed)
    # and a linear term on the dense features.
    logit = np.full(args.samples, -1.0)
    for f in range(len(args.vocab)):
        salt = np.uint64(((f + 1) * 0xBF58476D1CE4E5B9) % (1 << 64))
        with np.errstate(over="ignore"):  # multiplication modulo 2**64 is the hash
            h = ids[:, f].astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15) + salt
        logit += ((h >> np.uint64(40)).astype(np.float64) / float(1 << 24) - 0.5) * 3.0
    if args.dense > 0:
        logit += x @ rng.normal(0.0, 0.5, size=args.dense)
    y = (rng.random(args.samples) < 1.0 / (1.0 + np.exp(-logit))).astype(np.int64)

    trainyard = find_trainyard(args.trainyard)
    os.makedirs(args.out_dir, exist_ok=True)
    # Shards of ceil(samples / files) samples: --files of them (fewer when that does not divide).
    per_shard = -(-args.samples // args.files)
    shard_bytes = per_shard * (8 * len(args.vocab) + 4 * args.dense + 8)
    with tempfile.TemporaryDirectory() as arrays:
        columns = []
        for name, array in (("ids", ids), ("x", x), ("y", y)):
            path = os.path.join(arrays, name + ".npy")
            np.save(path, array)
            columns.append(name + "=" + path)
        subprocess.run([trainyard, "data", "pack", os.path.join(args.out_dir, "train")] + columns +
                       ["--shard-size", str(shard_bytes)], check=True)
    subprocess.run([trainyard, "data", "inspect", os.path.join(args.out_dir, "train-*.safetensors")],
                   check=True)
    print("click rate %.3f" % y.mean(), file=sys.stderr)


if __name__ == "__main__":
    main()
