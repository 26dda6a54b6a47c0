"""ResNet on an ImageNet subset (ImageFolder layout): static vs dynamic batching, top-1/top-5.

Two ranks on this machine train the same ResNet on the same ImageFolder with the usual
preprocessing (shorter side resized to 8/7 of the image size, random crop and flip for
training, centre crop for validation, ImageNet normalisation), the samples of each step
decoded in DataLoader workers (`--loader-workers`), once with static and once with dynamic
batching, under an emulated slowdown. It reports throughput, training time, and top-1 and
top-5 validation accuracy.

    python benchmarks/imagenet_subset.py [--data-dir ~/data/imagenette2-160]
        [--model resnet18] [--image-size 32] [--epochs 3] [--slowdown 1,4]

Without --data-dir it first writes a small ImageFolder of generated images
(`hvd_dynbatch.data.write_image_folder`) to a temporary directory, so the whole path runs
without a download. On a cluster the same training is one command per job, e.g.
`horovodrun -np 8 -H ... hvd-dynbatch train --dataset imagefolder --data-dir
/data/imagenette2 --model resnet50 --image-size 224 --loader-workers 8`.
"""
from __future__ import annotations

import argparse
import sys
import tempfile

from common import print_report, steady_throughput

from hvd_dynbatch.data import write_image_folder
from hvd_dynbatch.jobs import run_training_job, summary_of


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", help="An ImageFolder with train/ and val/ [generated].")
    parser.add_argument("--model", default="resnet18")
    parser.add_argument("--image-size", type=int, default=32)
    parser.add_argument("--global-batch", type=int, default=32)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--slowdown", default="1,4")
    parser.add_argument("--loader-workers", type=int, default=1)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        data_dir = args.data_dir
        if data_dir is None:
            data_dir = tmp
            write_image_folder(data_dir)
            source = ("generated ImageFolder (10 classes, 40 train + 10 val images each, "
                      "80x64 JPEG)")
        else:
            source = data_dir
        rows = []
        for batching in ("static", "dynamic"):
            print(f"{batching} ...", file=sys.stderr)
            records = run_training_job(2, [
                "--dataset", "imagefolder", "--data-dir", data_dir, "--model", args.model,
                "--image-size", str(args.image_size), "--global-batch", str(args.global_batch),
                "--lr", str(args.lr), "--momentum", "0.9", "--epochs", str(args.epochs),
                "--batching", batching, "--slowdown", args.slowdown,
                "--loader-workers", str(args.loader_workers)], timeout=3600)
            s = summary_of(records)
            rows.append([batching, round(s["samples_per_sec"], 1),
                         round(steady_throughput(records), 1), round(s["train_seconds"], 1),
                         s["final_accuracy"], s["final_top5"], s["final_split"]])
    print_report(
        f"{args.model} on {source}: image size {args.image_size}, global batch "
        f"{args.global_batch}, lr {args.lr}, momentum 0.9, {args.epochs} epochs, 2 ranks x 1 "
        f"thread with slowdown {args.slowdown}, {args.loader_workers} DataLoader worker(s) per "
        f"rank; accuracy on the val split at the end.",
        ["batching", "samples/s (run)", "samples/s (steady)", "training time (s)",
         "top-1", "top-5", "final split"], rows)


if __name__ == "__main__":
    main()
