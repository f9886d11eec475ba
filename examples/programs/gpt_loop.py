"""A GPT-style character model in plain PyTorch with its own training loop (AdamW, warm-up and
cosine learning rate, gradient clipping, validation every few steps), data-parallel over
torch.distributed, on a text file (run.sh writes the King James Bible from Debian's bible-kjv).
Trainyard's module makes it preemptible with no step lost: it reports each step, saves where
Trainyard says and resumes from what Trainyard restored. Works on PyTorch 1.13 and 2.x.

Run as a Trainyard job (examples/programs/gpt.yaml), or under torchrun alone:
  torchrun --nproc_per_node 2 gpt_loop.py --text kjv.txt --steps 150
"""

import argparse
import math
import os

import torch
import torch.distributed as dist
from torch import nn
from torch.nn import functional as F

import trainyard


class Block(nn.Module):
    def __init__(self, dim, heads):
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.qkv(self.norm1(x)).split(c, dim=2)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        att = (q @ k.transpose(-2, -1)) / math.sqrt(c // self.heads)
        mask = torch.ones(t, t, dtype=torch.bool).tril()
        att = att.masked_fill(~mask, float("-inf")).softmax(-1)
        x = x + self.proj((att @ v).transpose(1, 2).reshape(b, t, c))
        return x + self.mlp(self.norm2(x))


class Gpt(nn.Module):
    def __init__(self, vocab=256, context=64, dim=64, heads=4, layers=2):
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, dim), nn.Embedding(context, dim)
        self.blocks = nn.Sequential(*[Block(dim, heads) for _ in range(layers)])
        self.norm = nn.LayerNorm(dim)

    def forward(self, idx):
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1]))
        return self.norm(self.blocks(x)) @ self.tok.weight.t()  # the head tied to the embedding


def learning_rate(step, steps, peak, warmup=20):
    if step <= warmup:
        return peak * step / warmup
    return peak * 0.5 * (1 + math.cos(math.pi * (step - warmup) / max(1, steps - warmup)))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--text", required=True)
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--batch", type=int, default=32, help="global batch of windows")
    parser.add_argument("--context", type=int, default=64)
    parser.add_argument("--lr", type=float, default=3e-3)
    args = parser.parse_args()

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    with open(args.text, "rb") as f:
        data = torch.frombuffer(bytearray(f.read()), dtype=torch.uint8).long()
    split = int(len(data) * 0.95)  # the end of the book is held out
    train, held = data[:split], data[split:]
    torch.manual_seed(0)
    net = Gpt(context=args.context)
    model = torch.nn.parallel.DistributedDataParallel(net)
    decay = [p for n, p in net.named_parameters() if p.dim() >= 2]
    rest = [p for n, p in net.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                             {"params": rest, "weight_decay": 0.0}], lr=args.lr)
    if trainyard.restore_dir:
        state = torch.load(os.path.join(trainyard.restore_dir, f"rank-{rank}.pt"))
        net.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])

    def windows(source, generator, n):
        starts = torch.randint(0, len(source) - args.context - 1, (n,), generator=generator)
        x = torch.stack([source[s:s + args.context] for s in starts])
        y = torch.stack([source[s + 1:s + 1 + args.context] for s in starts])
        return x, y

    for step in range(trainyard.start_step + 1, args.steps + 1):
        # The step's windows depend on the step alone: a resumed run reads the same text.
        g = torch.Generator().manual_seed(step)
        x, y = windows(train, g, args.batch)
        x, y = x[rank::world], y[rank::world]
        lr = learning_rate(step, args.steps, args.lr)
        for group in opt.param_groups:
            group["lr"] = lr
        loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten())
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        figures = {"loss": loss.item(), "lr": lr, "total_steps": args.steps}
        if step % 50 == 0 or step == args.steps:
            with torch.no_grad():
                vx, vy = windows(held, torch.Generator().manual_seed(0), 64)
                figures["val_loss"] = F.cross_entropy(net(vx).flatten(0, 1), vy.flatten()).item()
            if rank == 0:
                print(f"step={step} loss={loss.item():.4f} val_loss={figures['val_loss']:.4f}",
                      flush=True)
        trainyard.report(step, **figures)
        if trainyard.should_checkpoint(step):
            # Each rank its own file, as sharded checkpoints are written (here the same state).
            torch.save({"model": net.state_dict(), "optimizer": opt.state_dict()},
                       os.path.join(trainyard.checkpoint_dir, f"rank-{rank}.pt"))
            trainyard.commit_checkpoint(step)
        if trainyard.should_stop(step):
            print(f"rank {rank}: stopping at step {step}, saved", flush=True)
            return
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
