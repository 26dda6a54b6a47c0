"""Write a small ImageFolder of generated images (Imagenette layout: train/CLASS, val/CLASS).

For trying the ImageNet-subset path end to end without a download:

    python benchmarks/make_imagefolder.py DIR [--classes 10] [--train-per-class 40]
    hvd-dynbatch train --dataset imagefolder --data-dir DIR --model resnet18 --image-size 32
"""
from __future__ import annotations

import argparse

from hvd_dynbatch.data.datasets import write_image_folder


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("directory")
    parser.add_argument("--classes", type=int, default=10)
    parser.add_argument("--train-per-class", type=int, default=40)
    parser.add_argument("--val-per-class", type=int, default=10)
    parser.add_argument("--width", type=int, default=80)
    parser.add_argument("--height", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    if min(args.classes, args.train_per_class, args.val_per_class, args.width, args.height) < 1:
        parser.error("every count and size must be positive")
    write_image_folder(args.directory, args.classes, args.train_per_class, args.val_per_class,
                       (args.width, args.height), args.seed)
    print(f"wrote {args.classes} classes x ({args.train_per_class} train + "
          f"{args.val_per_class} val) images to {args.directory}")


if __name__ == "__main__":
    main()
