"""Writes a small image data set for the ResNet example: PNG files of 32x32 pictures of ten kinds
(a disc, a ring, a square, bars, a cross, ... each in a random colour, place and size, on a noisy
background), in folders named after their class, as torchvision's ImageFolder reads them.

  python3 write_images.py OUT_DIR [--per-class N]
"""

import argparse
import os
import random

from PIL import Image, ImageDraw

KINDS = ["disc", "ring", "square", "frame", "hbars", "vbars", "cross", "diamond", "triangle",
         "dots"]


def draw(kind, rng):
    size = 32
    img = Image.new("RGB", (size, size),
                    tuple(rng.randrange(0, 80) for _ in range(3)))
    d = ImageDraw.Draw(img)
    colour = tuple(rng.randrange(120, 256) for _ in range(3))
    r = rng.randrange(7, 13)
    cx, cy = rng.randrange(r + 1, size - r - 1), rng.randrange(r + 1, size - r - 1)
    box = [cx - r, cy - r, cx + r, cy + r]
    if kind == "disc":
        d.ellipse(box, fill=colour)
    elif kind == "ring":
        d.ellipse(box, outline=colour, width=3)
    elif kind == "square":
        d.rectangle(box, fill=colour)
    elif kind == "frame":
        d.rectangle(box, outline=colour, width=3)
    elif kind == "hbars":
        for y in range(box[1], box[3], 5):
            d.rectangle([box[0], y, box[2], y + 1], fill=colour)
    elif kind == "vbars":
        for x in range(box[0], box[2], 5):
            d.rectangle([x, box[1], x + 1, box[3]], fill=colour)
    elif kind == "cross":
        d.rectangle([cx - 2, box[1], cx + 2, box[3]], fill=colour)
        d.rectangle([box[0], cy - 2, box[2], cy + 2], fill=colour)
    elif kind == "diamond":
        d.polygon([(cx, box[1]), (box[2], cy), (cx, box[3]), (box[0], cy)], fill=colour)
    elif kind == "triangle":
        d.polygon([(cx, box[1]), (box[2], box[3]), (box[0], box[3])], fill=colour)
    else:
        for _ in range(6):
            x, y = rng.randrange(box[0], box[2]), rng.randrange(box[1], box[3])
            d.ellipse([x - 2, y - 2, x + 2, y + 2], fill=colour)
    # Noise, so that no class is told by a single pixel.
    px = img.load()
    for _ in range(60):
        x, y = rng.randrange(size), rng.randrange(size)
        px[x, y] = tuple(rng.randrange(0, 256) for _ in range(3))
    return img


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--per-class", type=int, default=200)
    args = parser.parse_args()
    rng = random.Random(7)
    for kind in KINDS:
        folder = os.path.join(args.out, kind)
        os.makedirs(folder, exist_ok=True)
        for i in range(args.per_class):
            draw(kind, rng).save(os.path.join(folder, f"{i:05d}.png"))
    print(f"wrote {len(KINDS) * args.per_class} images of {len(KINDS)} kinds under {args.out}")


if __name__ == "__main__":
    main()
