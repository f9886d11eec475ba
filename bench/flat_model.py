"""Wraps an image model so that it takes a job's features, [N, C*H*W], as a Trainyard job's
TorchScript model must (the benchmarks' PyTorch side uses the same wrapper)."""
import torch.nn as nn


class Flat(nn.Module):
    def __init__(self, net, shape):
        super().__init__()
        self.net = net
        self.shape = shape

    def forward(self, x):
        return self.net(x.view(self.shape))
