#!/usr/bin/python3
"""Writes a small scripted classifier that `model: {torchscript: PATH}` can train.

  /usr/bin/python3 examples/write_torchscript_model.py --out /tmp/net.pt --inputs 16 \
      --hidden 32 --classes 4 --seed 1

The module takes x of shape [N, inputs] (anything that flattens to it) and returns logits
[N, classes]. With --conv it is a CNN over images of --image C H W (inputs = C * H * W): per
entry of --conv a block of 3x3 convolution with that many channels, ReLU and 2x2 max-pooling, as
the built-in `cnn` has, then the --hidden layers and the classifier. A job that trains a
TorchScript model exports one (final/model.pt), which another job can use as its `distill.teacher`.

With --sequential the scripted module is the torch.nn.Sequential of the layers itself (a conv
model's starts with nn.Unflatten to the image shape): what `strategy: pipeline` splits into
stages, one child of the Sequential being one layer.

With --stages N the layers are written as N files instead, each a scripted nn.Sequential of
consecutive layers (as even as the layer count allows): --out PREFIX writes PREFIX-0.pt to
PREFIX-<N-1>.pt, for `model: {stages: [PREFIX-0.pt, ...]}`, where each stage of a pipeline loads
only its own file.
"""

import argparse

import torch
from torch import nn


class Classifier(nn.Module):
    def __init__(self, inputs, hidden, classes, image=None, conv=()):
        super().__init__()
        layers = []
        width = inputs
        self.shape = [-1, inputs]
        if conv:
            channels, rows, cols = image
            self.shape = [-1, channels, rows, cols]
            for c in conv:
                layers += [nn.Conv2d(channels, c, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2)]
                channels, rows, cols = c, rows // 2, cols // 2
            layers.append(nn.Flatten())
            width = channels * rows * cols
        for h in hidden:
            layers.append(nn.Linear(width, h))
            layers.append(nn.ReLU())
            width = h
        layers.append(nn.Linear(width, classes))
        self.net = nn.Sequential(*layers)
        self.layers = layers

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x.reshape(self.shape))


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True,
                        help="where to write the .pt file (with --stages: the files' prefix)")
    parser.add_argument("--inputs", type=int, default=16)
    parser.add_argument("--hidden", type=int, nargs="*", default=[32],
                        help="hidden layer widths, e.g. --hidden 64 32")
    parser.add_argument("--classes", type=int, default=4)
    parser.add_argument("--conv", type=int, nargs="*", default=[],
                        help="channels of each convolution block, e.g. --conv 16 32")
    parser.add_argument("--image", type=int, nargs=3, metavar=("C", "H", "W"),
                        help="with --conv: the shape of a sample (C * H * W = --inputs)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--sequential", action="store_true",
                        help="script the layers' nn.Sequential itself (for strategy: pipeline)")
    parser.add_argument("--stages", type=int, default=0,
                        help="write the layers as this many files, --out being their prefix "
                        "(for model.stages)")
    args = parser.parse_args()
    if args.conv:
        if not args.image or args.image[0] * args.image[1] * args.image[2] != args.inputs:
            parser.error("--conv needs --image C H W with C * H * W = --inputs")
        if min(args.image[1:]) >> len(args.conv) < 1:
            parser.error("too many --conv blocks for the image: each halves its height and width")

    torch.manual_seed(args.seed)
    classifier = Classifier(args.inputs, args.hidden, args.classes, args.image, args.conv)
    if args.stages:
        layers = ([nn.Unflatten(1, tuple(args.image))] if args.conv else []) + classifier.layers
        if not 1 <= args.stages <= len(layers):
            parser.error("--stages must be between 1 and the model's %d layers" % len(layers))
        begin = 0
        for i in range(args.stages):
            end = begin - (begin - len(layers)) // (args.stages - i)  # rounded up
            module = torch.jit.script(nn.Sequential(*layers[begin:end]))
            path = "%s-%d.pt" % (args.out, i)
            module.save(path)
            print("%s: layers %d to %d, %d parameters" %
                  (path, begin, end - 1, sum(p.numel() for p in module.parameters())))
            begin = end
        return
    if args.sequential:
        first = [nn.Unflatten(1, tuple(args.image))] if args.conv else []
        module = torch.jit.script(nn.Sequential(*first, *classifier.layers))
    else:
        module = torch.jit.script(classifier)
    module.save(args.out)
    params = sum(p.numel() for p in module.parameters())
    print("%s: %d parameters" % (args.out, params))


if __name__ == "__main__":
    main()
