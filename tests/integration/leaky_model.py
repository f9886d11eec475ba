#!/usr/bin/env python3
"""Writes a TorchScript model that leaks: every forward pass keeps another block of memory.

Its parameters are a small linear layer (16 inputs, 4 classes, as the synthetic test data), so
nothing read from the file tells how much memory it will hold: only running it does.
"""
import argparse
from typing import List

import torch


class Leaky(torch.nn.Module):
    hoard: List[torch.Tensor]

    def __init__(self, mib_per_step: int):
        super().__init__()
        self.fc = torch.nn.Linear(16, 4)
        self.hoard = []
        self.floats = mib_per_step * (1 << 20) // 4

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training:
            self.hoard.append(torch.ones([self.floats]))
        return self.fc(x)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", required=True)
    parser.add_argument("--mib-per-step", type=int, default=16)
    args = parser.parse_args()
    torch.manual_seed(0)
    torch.jit.script(Leaky(args.mib_per_step)).save(args.out)


if __name__ == "__main__":
    main()
