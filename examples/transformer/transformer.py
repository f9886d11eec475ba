#!/usr/bin/python3
"""Trainyard's built-in transformer (`model: {builtin: transformer}`) written in plain PyTorch:
the same layers under the same names, initialised the same way, so that a job's exported
model.safetensors loads into it, and the parity tests train it beside Trainyard.

  transformer.py sample --model model.safetensors [--prompt TEXT] [--chars 300]
                        [--tokens 'kjv-*.safetensors' --validation-split 0.05]

`sample` rebuilds the model from the file alone (the shape is in its metadata), reports the
held-out loss and perplexity on the last windows of the token shards (what validation_split
holds out) against the untrained model's, and writes text that continues --prompt (byte tokens).

Works with PyTorch 1.13 (Debian 12) and 2.x (Debian 13): attention goes through
scaled_dot_product_attention where PyTorch has it, as the trainer's LibTorch does.
"""

import argparse
import glob
import json
import math
import struct
import sys

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F


def causal_attention(q, k, v, p):
    if hasattr(F, "scaled_dot_product_attention"):
        return F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=True)
    t = q.size(-2)
    weights = torch.matmul(q, k.transpose(-2, -1)) * (1.0 / math.sqrt(q.size(-1)))
    future = torch.ones(t, t, dtype=torch.bool, device=q.device).triu(1)
    weights = torch.softmax(weights.masked_fill(future, float("-inf")), -1)
    if p > 0:
        weights = F.dropout(weights, p, True)
    return torch.matmul(weights, v)


class Block(nn.Module):
    def __init__(self, dim, heads, hidden, dropout):
        super().__init__()
        self.heads, self.dropout = heads, dropout
        self.ln_1 = nn.LayerNorm(dim)
        self.attn = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.ln_2 = nn.LayerNorm(dim)
        self.fc = nn.Linear(dim, hidden)
        self.fc_proj = nn.Linear(hidden, dim)

    def forward(self, x):
        n, t, c = x.shape
        p = self.dropout if self.training else 0.0
        q, k, v = self.attn(self.ln_1(x)).split(c, dim=2)
        q, k, v = (a.view(n, t, self.heads, c // self.heads).transpose(1, 2) for a in (q, k, v))
        y = causal_attention(q, k, v, p).transpose(1, 2)
        x = x + F.dropout(self.proj(y.contiguous().view(n, t, c)), p, self.training)
        return x + F.dropout(self.fc_proj(F.gelu(self.fc(self.ln_2(x)))), p, self.training)


class TransformerLM(nn.Module):
    """Token ids [N, T] -> logits of each next token [N, T, vocab]."""

    def __init__(self, vocab, context, layers, dim, heads, mlp_ratio=4, dropout=0.0,
                 tie_embeddings=True):
        super().__init__()
        self.context, self.dropout, self.tied = context, dropout, tie_embeddings
        self.wte = nn.Embedding(vocab, dim)
        self.wpe = nn.Embedding(context, dim)
        self.h = nn.ModuleList([Block(dim, heads, mlp_ratio * dim, dropout)
                                for _ in range(layers)])
        self.ln_f = nn.LayerNorm(dim)
        if not tie_embeddings:
            self.lm_head = nn.Linear(dim, vocab, bias=False)

    def forward(self, idx):
        p = self.dropout if self.training else 0.0
        positions = torch.arange(idx.size(1), device=idx.device)
        h = F.dropout(self.wte(idx) + self.wpe(positions), p, self.training)
        for block in self.h:
            h = block(h)
        h = self.ln_f(h)
        return F.linear(h, self.wte.weight) if self.tied else self.lm_head(h)

    def initialise(self, seed):
        """Trainyard's initialisation: layer by layer (0 the embeddings, 1..L the blocks, L+1
        the head), each from a generator seeded by seed * 1000003 + layer."""
        layers = len(self.h)
        residual = 0.02 / math.sqrt(2 * layers)
        with torch.no_grad():
            for layer in range(layers + 2):
                torch.manual_seed((seed * 1000003 + layer) % (1 << 64))
                if layer == 0:
                    self.wte.weight.normal_(0, 0.02)
                    self.wpe.weight.normal_(0, 0.02)
                elif layer <= layers:
                    b = self.h[layer - 1]
                    for linear, std in ((b.attn, 0.02), (b.proj, residual), (b.fc, 0.02),
                                        (b.fc_proj, residual)):
                        linear.weight.normal_(0, std)
                        linear.bias.zero_()
                elif not self.tied:
                    self.lm_head.weight.normal_(0, 0.02)
        return self


DTYPES = {"F32": np.float32, "F64": np.float64, "I64": np.int64, "I32": np.int32,
          "U16": np.uint16, "U8": np.uint8}


def read_safetensors(path):
    """Tensors (NumPy) and metadata of a safetensors file."""
    with open(path, "rb") as f:
        (length,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(length))
        body = f.read()
    meta = header.pop("__metadata__", {})
    out = {}
    for name, info in header.items():
        begin, end = info["data_offsets"]
        out[name] = np.frombuffer(body[begin:end], dtype=DTYPES[info["dtype"]]).reshape(
            info["shape"])
    return out, meta


def load_model(path):
    """A job's exported model.safetensors in the plain PyTorch model."""
    tensors, meta = read_safetensors(path)
    if meta.get("model") != "transformer":
        sys.exit(f"{path}: not a transformer's export (model={meta.get('model')})")
    model = TransformerLM(int(meta["vocab"]), int(meta["context"]), int(meta["layers"]),
                          int(meta["dim"]), int(meta["heads"]), int(meta["mlp_ratio"]),
                          tie_embeddings=meta["tie_embeddings"] == "true")
    state = {k: torch.from_numpy(v.copy()) for k, v in tensors.items()}
    model.load_state_dict(state, strict=True)
    return model, meta


def windows(pattern, context):
    """Every shard's windows of context + 1 tokens, one every context tokens, as the trainer
    reads data.tokens: [N, context + 1] int64, in file order."""
    out = []
    for path in sorted(glob.glob(pattern)):
        tokens, _ = read_safetensors(path)
        ids = tokens["tokens"].astype(np.int64)
        count = (len(ids) - 1) // context if len(ids) > context else 0
        if count:
            idx = np.arange(count)[:, None] * context + np.arange(context + 1)[None, :]
            out.append(ids[idx])
    if not out:
        sys.exit(f"no windows of {context + 1} tokens in {pattern}")
    return np.concatenate(out)


def held_out_loss(model, held):
    model.eval()
    total, count = 0.0, 0
    with torch.no_grad():
        for i in range(0, len(held), 64):
            w = torch.from_numpy(held[i:i + 64])
            logits = model(w[:, :-1])
            total += F.cross_entropy(logits.reshape(-1, logits.size(-1)), w[:, 1:].reshape(-1),
                                     reduction="sum").item()
            count += w[:, 1:].numel()
    return total / count


def sample_command(args):
    model, meta = load_model(args.model)
    context = int(meta["context"])
    if args.tokens:
        all_windows = windows(args.tokens, context)
        # What data.validation_split holds out: the last windows, rounded half away from 0.
        count = int(math.floor(args.validation_split * len(all_windows) + 0.5))
        held = all_windows[len(all_windows) - count:]
        held = held[:args.max_held_out]
        untrained = TransformerLM(int(meta["vocab"]), context, int(meta["layers"]),
                                  int(meta["dim"]), int(meta["heads"]), int(meta["mlp_ratio"]),
                                  tie_embeddings=meta["tie_embeddings"] == "true")
        untrained.initialise(args.seed)
        loss, before = held_out_loss(model, held), held_out_loss(untrained, held)
        print(f"held-out loss {loss:.4f} (perplexity {math.exp(loss):.2f}) on {len(held)} windows "
              f"of {context} tokens; untrained {before:.4f} (perplexity {math.exp(before):.2f})")
        if loss >= before:
            sys.exit("transformer.py: the trained model does no better than the untrained one")
    model.eval()
    torch.manual_seed(args.seed)
    out = list(args.prompt.encode())
    with torch.no_grad():
        for _ in range(args.chars):
            logits = model(torch.tensor([out[-context:]], dtype=torch.long))[0, -1]
            probs = F.softmax(logits / args.temperature, dim=-1)
            out.append(int(torch.multinomial(probs, 1)))
    print(bytes(out).decode(errors="replace"))


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    sample = commands.add_parser("sample", help="held-out loss and text from a trained model")
    sample.add_argument("--model", required=True, help="a job's exported model.safetensors")
    sample.add_argument("--tokens", default="", help="the job's data.tokens (for the loss)")
    sample.add_argument("--validation-split", type=float, default=0.05)
    sample.add_argument("--max-held-out", type=int, default=2000)
    sample.add_argument("--prompt", default="And God said")
    sample.add_argument("--chars", type=int, default=300)
    sample.add_argument("--temperature", type=float, default=0.8)
    sample.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    {"sample": sample_command}[args.command](args)


if __name__ == "__main__":
    main()
