#!/usr/bin/python3
"""Writes a small scripted classifier that `model: {torchscript: PATH}` can train.

  /usr/bin/python3 examples/write_torchscript_model.py --out /tmp/net.pt --inputs 16 \
      --hidden 32 --classes 4 --seed 1

The module takes x of shape [N, inputs] (anything that flattens to it) and returns logits
[N, classes].
"""

import argparse

import torch
from torch import nn


class Classifier(nn.Module):
    def __init__(self, inputs, hidden, classes):
        super().__init__()
        layers = []
        width = inputs
        for h in hidden:
            layers.append(nn.Linear(width, h))
            layers.append(nn.ReLU())
            width = h
        layers.append(nn.Linear(width, classes))
        self.net = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x.flatten(1))


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True, help="where to write the .pt file")
    parser.add_argument("--inputs", type=int, default=16)
    parser.add_argument("--hidden", type=int, nargs="*", default=[32],
                        help="hidden layer widths, e.g. --hidden 64 32")
    parser.add_argument("--classes", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    torch.manual_seed(args.seed)
    module = torch.jit.script(Classifier(args.inputs, args.hidden, args.classes))
    module.save(args.out)
    params = sum(p.numel() for p in module.parameters())
    print("%s: %d parameters" % (args.out, params))


if __name__ == "__main__":
    main()
