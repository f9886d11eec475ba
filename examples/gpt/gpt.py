#!/usr/bin/python3
"""A small GPT-style character model written in plain PyTorch 2 (attention through
torch.nn.functional.scaled_dot_product_attention, as every PyTorch 2 attention layer calls it),
scripted for Trainyard to train, and its trained weights loaded back to sample text.

  gpt.py data --out-dir DIR [--context 64 --stride 16] [--text FILE]
  gpt.py model --out PATH [--context 64 --layers 2 --dim 64 --heads 4 --seed 1]
  gpt.py sample --model EXPORTED.pt --data DIR [--prompt TEXT] [--chars 200]

`data` reads the King James Bible (Debian's bible-kjv: `bible -f gen1:1-rev22:21`, the verse
references left out) or --text, and writes a window of --context bytes every --stride bytes as a
sample: x float32 [context] (the byte values) and y int64 (the byte after the window), through
`trainyard data pack` into windows-*.safetensors: those of the first 95 % of the text shuffled,
then those of its end, which `validation_split: 0.05` holds out. `model` writes the untrained model, scripted: x -> logits of the next byte [N, 256].
`sample` loads a trained model's weights (a job's exported model.pt) into the same plain PyTorch
model, reports its loss and perplexity on the held-out windows against the untrained model's,
and writes text that continues --prompt.

PyTorch 2.0 or newer (Debian 13's python3-torch): PyTorch 1.13 has no
scaled_dot_product_attention, and the commands then stop with exit code 77 and say so.
"""

import argparse
import glob
import json
import math
import os
import shutil
import struct
import subprocess
import sys
import tempfile

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

NEEDS_PYTORCH_2 = 77


class Block(nn.Module):
    def __init__(self, dim, heads):
        super().__init__()
        self.heads = heads
        self.ln_1 = nn.LayerNorm(dim)
        self.attn = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.ln_2 = nn.LayerNorm(dim)
        self.fc = nn.Linear(dim, 4 * dim)
        self.fc_proj = nn.Linear(4 * dim, dim)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.attn(self.ln_1(x)).split(c, dim=2)
        q = q.view(b, t, self.heads, c // self.heads).transpose(1, 2)
        k = k.view(b, t, self.heads, c // self.heads).transpose(1, 2)
        v = v.view(b, t, self.heads, c // self.heads).transpose(1, 2)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).contiguous().view(b, t, c))
        return x + self.fc_proj(F.gelu(self.fc(self.ln_2(x))))


class GPT(nn.Module):
    """Decoder-only: token and position embeddings, pre-norm blocks, a final norm and a head
    tied to the token embedding. Takes byte values [N, T] (any dtype) and returns the logits of
    the byte that follows [N, 256]."""

    def __init__(self, context=64, layers=2, dim=64, heads=4, vocab=256):
        super().__init__()
        self.wte = nn.Embedding(vocab, dim)
        self.wpe = nn.Embedding(context, dim)
        self.h = nn.ModuleList([Block(dim, heads) for _ in range(layers)])
        self.ln_f = nn.LayerNorm(dim)
        self.lm_head = nn.Linear(dim, vocab, bias=False)
        self.lm_head.weight = self.wte.weight

    def forward(self, x):
        idx = x.to(torch.long)
        positions = torch.arange(idx.size(1), device=idx.device)
        h = self.wte(idx) + self.wpe(positions)
        for block in self.h:
            h = block(h)
        return self.lm_head(self.ln_f(h))[:, -1, :]


def need_pytorch_2():
    if not hasattr(F, "scaled_dot_product_attention"):
        print(f"gpt.py: PyTorch {torch.__version__} has no scaled_dot_product_attention; this "
              "example needs PyTorch 2.0 or newer (Debian 13's python3-torch)", file=sys.stderr)
        sys.exit(NEEDS_PYTORCH_2)


def find_trainyard():
    for path in [os.path.join(os.environ.get("TRAINYARD_BIN_DIR", ""), "trainyard"),
                 shutil.which("trainyard") or "",
                 os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "build",
                              "bin", "trainyard")]:
        if path and os.access(path, os.X_OK):
            return path
    sys.exit("gpt.py: cannot find the trainyard binary: build it (make build)")


def read_text(path):
    if path:
        with open(path, "rb") as f:
            return f.read()
    if not shutil.which("bible"):
        sys.exit("gpt.py: no `bible` program: install Debian's bible-kjv, or pass --text FILE")
    lines = subprocess.run(["bible", "-f", "gen1:1-rev22:21"], check=True,
                           capture_output=True).stdout.splitlines()
    # "Ge1:1 In the beginning ..." -> "In the beginning ..."
    return b"\n".join(line.split(b" ", 1)[1] for line in lines if b" " in line) + b"\n"


def pack(trainyard, prefix, x, y):
    with tempfile.TemporaryDirectory() as arrays:
        np.save(os.path.join(arrays, "x.npy"), x)
        np.save(os.path.join(arrays, "y.npy"), y)
        subprocess.run([trainyard, "data", "pack", prefix, "x=" + os.path.join(arrays, "x.npy"),
                        "y=" + os.path.join(arrays, "y.npy"), "--shard-size", str(64 << 20)],
                       check=True, stdout=subprocess.DEVNULL)


def windows(text, context, starts):
    data = np.frombuffer(text, dtype=np.uint8)
    x = np.stack([data[s:s + context] for s in starts]).astype(np.float32)
    y = data[starts + context].astype(np.int64)
    return x, y


def data_command(args):
    text = read_text(args.text)
    if args.max_bytes:
        text = text[:args.max_bytes]
    if len(text) <= args.context + 1:
        sys.exit(f"gpt.py: {len(text)} bytes of text; need more than --context {args.context}")
    rng = np.random.default_rng(args.seed)
    starts = np.arange(0, len(text) - args.context, args.stride)
    held = max(1, len(starts) // 20)
    train, held_out = starts[:-held], starts[-held:]  # the end of the book is held out
    rng.shuffle(train)
    os.makedirs(args.out_dir, exist_ok=True)
    pack(find_trainyard(), os.path.join(args.out_dir, "windows"),
         *windows(text, args.context, np.concatenate([train, held_out])))
    print(f"{len(text)} bytes of text: {len(train)} training and {len(held_out)} held-out "
          f"windows of {args.context} bytes in {args.out_dir}")


def model_command(args):
    need_pytorch_2()
    torch.manual_seed(args.seed)
    model = GPT(args.context, args.layers, args.dim, args.heads)
    torch.jit.script(model).save(args.out)
    count = sum(p.numel() for p in model.parameters())
    print(f"wrote {args.out}: GPT of {args.layers} layers, {args.dim} wide, {args.heads} heads, "
          f"context {args.context}; {count} parameters (PyTorch {torch.__version__})")


def read_safetensors(path):
    dtypes = {"F32": np.float32, "I64": np.int64}
    with open(path, "rb") as f:
        (length,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(length))
        body = f.read()
    out = {}
    for name, info in header.items():
        if name != "__metadata__":
            begin, end = info["data_offsets"]
            out[name] = np.frombuffer(body[begin:end], dtype=dtypes[info["dtype"]]).reshape(
                info["shape"])
    return out


def held_out_loss(model, x, y):
    model.eval()
    with torch.no_grad():
        losses = [F.cross_entropy(model(torch.from_numpy(x[i:i + 512])),
                                  torch.from_numpy(y[i:i + 512]), reduction="sum").item()
                  for i in range(0, len(x), 512)]
    return sum(losses) / len(x)


def sample_command(args):
    need_pytorch_2()
    trained = torch.jit.load(args.model).state_dict()
    context = trained["wpe.weight"].shape[0]
    dim = trained["wte.weight"].shape[1]
    layers = len({k.split(".")[1] for k in trained if k.startswith("h.")})
    model = GPT(context, layers, dim, args.heads)
    untrained_loss = None
    shards = sorted(glob.glob(os.path.join(args.data, "windows-*.safetensors")))
    if shards:
        parts = [read_safetensors(s) for s in shards]
        held = len(np.concatenate([p["y"] for p in parts])) // 20  # what validation_split holds
        x = np.concatenate([p["x"] for p in parts])[-held:][:args.max_held_out]
        y = np.concatenate([p["y"] for p in parts])[-held:][:args.max_held_out]
        untrained_loss = held_out_loss(model, x, y)
    model.load_state_dict(trained)  # the plain PyTorch model, with Trainyard's trained weights
    if untrained_loss is not None:
        loss = held_out_loss(model, x, y)
        print(f"held-out loss {loss:.4f} (perplexity {math.exp(loss):.2f}) on {len(x)} windows; "
              f"untrained {untrained_loss:.4f} (perplexity {math.exp(untrained_loss):.2f})")
    torch.manual_seed(args.seed)
    out = bytearray(args.prompt.encode())
    with torch.no_grad():
        for _ in range(args.chars):
            window = torch.tensor([list(out[-context:])], dtype=torch.float32)
            probs = F.softmax(model(window)[0] / args.temperature, dim=-1)
            out.append(int(torch.multinomial(probs, 1)))
    print(out.decode(errors="replace"))


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    data = commands.add_parser("data", help="the text as windows of bytes")
    data.add_argument("--out-dir", required=True)
    data.add_argument("--context", type=int, default=64)
    data.add_argument("--text", help="a text file (default: the King James Bible)")
    data.add_argument("--max-bytes", type=int, default=0, help="only the first bytes of the text")
    data.add_argument("--stride", type=int, default=16, help="bytes between window starts")
    data.add_argument("--seed", type=int, default=1)
    model = commands.add_parser("model", help="the untrained model, scripted")
    model.add_argument("--out", required=True)
    model.add_argument("--context", type=int, default=64)
    model.add_argument("--layers", type=int, default=2)
    model.add_argument("--dim", type=int, default=64)
    model.add_argument("--heads", type=int, default=4)
    model.add_argument("--seed", type=int, default=1)
    sample = commands.add_parser("sample", help="held-out loss and text from a trained model")
    sample.add_argument("--model", required=True, help="a job's exported model.pt")
    sample.add_argument("--data", default="", help="the folder `data` wrote (for the loss)")
    sample.add_argument("--heads", type=int, default=4)
    sample.add_argument("--prompt", default="And God said")
    sample.add_argument("--chars", type=int, default=200)
    sample.add_argument("--temperature", type=float, default=0.8)
    sample.add_argument("--max-held-out", type=int, default=20000)
    sample.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    {"data": data_command, "model": model_command, "sample": sample_command}[args.command](args)


if __name__ == "__main__":
    main()
