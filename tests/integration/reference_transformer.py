#!/usr/bin/python3
"""The reference for the transformer's parity test: Trainyard's built-in transformer written in
plain PyTorch (examples/transformer/transformer.py), initialised from the job's seed as the
trainer does, trained by the plain PyTorch loop on the same token shards in file order (a job
with data.shuffle false): batch i of an epoch is windows [i * batch, (i + 1) * batch). Prints
`step=N loss=X` lines, and with --compare-with the largest difference between its parameters
and those of a job's exported model.safetensors (max_param_diff=X)."""
import argparse
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..",
                                "examples", "transformer"))
import transformer  # noqa: E402


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--tokens", required=True, help="glob of token shards")
    parser.add_argument("--vocab", type=int, required=True)
    parser.add_argument("--context", type=int, required=True)
    parser.add_argument("--layers", type=int, required=True)
    parser.add_argument("--dim", type=int, required=True)
    parser.add_argument("--heads", type=int, required=True)
    parser.add_argument("--mlp-ratio", type=int, default=4)
    parser.add_argument("--untied", action="store_true")
    parser.add_argument("--seed", type=int, required=True)
    parser.add_argument("--batch", type=int, required=True)
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--optimizer", choices=["sgd", "adamw"], required=True)
    parser.add_argument("--lr", type=float, required=True)
    parser.add_argument("--momentum", type=float, default=0.0)
    parser.add_argument("--weight-decay", type=float, default=0.0)
    parser.add_argument("--compare-with", default="")
    args = parser.parse_args()

    torch.set_num_threads(1)
    data = torch.from_numpy(transformer.windows(args.tokens, args.context))
    model = transformer.TransformerLM(args.vocab, args.context, args.layers, args.dim, args.heads,
                                      args.mlp_ratio, 0.0, not args.untied).initialise(args.seed)
    model.train()
    if args.optimizer == "sgd":
        optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum,
                                    weight_decay=args.weight_decay)
    else:
        optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr,
                                      weight_decay=args.weight_decay)
    steps_per_epoch = data.shape[0] // args.batch
    for step in range(args.steps):
        i = step % steps_per_epoch
        w = data[i * args.batch:(i + 1) * args.batch]
        optimizer.zero_grad()
        logits = model(w[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.size(-1)),
                                                 w[:, 1:].reshape(-1))
        loss.backward()
        optimizer.step()
        print(f"step={step + 1} loss={loss.item():.8f}", flush=True)
    if args.compare_with:
        trained, _ = transformer.read_safetensors(args.compare_with)
        ours = dict(model.named_parameters())
        if sorted(trained) != sorted(ours):
            raise SystemExit(f"parameter names differ: {sorted(trained)} vs {sorted(ours)}")
        diff = max(np.abs(trained[k] - ours[k].detach().numpy()).max() for k in ours)
        print(f"max_param_diff={diff:.3e} model={args.compare_with}", flush=True)


if __name__ == "__main__":
    main()
