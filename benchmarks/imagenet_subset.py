"""ResNet on an ImageNet subset (ImageFolder layout): static vs dynamic batching, top-1/top-5,
and how much of data loading the DataLoader workers hide.

Two ranks on this machine train the same ResNet on the same ImageFolder with the usual
preprocessing (shorter side resized to 8/7 of the image size, random crop and flip for
training, centre crop for validation, ImageNet normalisation), the samples of each step
decoded in DataLoader workers (`--loader-workers`), once with static and once with dynamic
batching, under an emulated slowdown. It reports throughput, training time, and top-1 and
top-5 validation accuracy.

The second table is about loading. Each model of `--loading-models` trains on 1 and on 2
ranks (`--loading-ranks`; dynamic batching, no emulated slowdown, so nothing but compute
and loading sets the pace) three times: on photo-sized JPEGs (`--photo-size`, ImageNet's
typical 500x375 by default) decoded in the training process (0 workers); the same decoded
ahead by `--loader-workers` worker processes per rank; and on in-memory `synthetic` data of
the same image size, whose loading costs nothing. With t the steady seconds per sample of
each, loading costs t(0) - t(synthetic) and the workers hide 1 - (t(workers) - t(synthetic))
/ (t(0) - t(synthetic)) of it, when loading costs at least 10% of t(synthetic) (less is
within this shared machine's run-to-run noise). Workers hide loading only on cores the
training does not use: on this 2-core machine one rank leaves a core to its workers, two
ranks leave none. The small `cnn` stands for a fast accelerator, whose compute per image is
far below its decoding.

    python benchmarks/imagenet_subset.py [--data-dir ~/data/imagenette2-160]
        [--model resnet18] [--image-size 32] [--epochs 3] [--slowdown 1,4]
        [--loader-workers 2] [--loading-models cnn,resnet18] [--loading-steps 40]
        [--loading-ranks 1 2]

Without --data-dir it first writes small ImageFolders of generated images
(`hvd_dynbatch.data.datasets.write_image_folder`) to a temporary directory, so the whole path
runs without a download; with it, both tables use that folder. On a cluster the same
training is one command per job, e.g. `horovodrun -np 8 -H ... hvd-dynbatch train --dataset
imagefolder --data-dir /data/imagenette2 --model resnet50 --image-size 224 --loader-workers 8`.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile

from common import print_report

from hvd_dynbatch.data.datasets import SYNTHETIC_SHAPE, write_image_folder
from hvd_dynbatch.tools.jobs import run_training_job, summary_of
from hvd_dynbatch.training.metrics import steady_throughput

# Loading cheaper than this share of a sample's compute is within the run-to-run noise here.
NOISE = 0.10


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", help="An ImageFolder with train/ and val/ [generated].")
    parser.add_argument("--model", default="resnet18")
    parser.add_argument("--image-size", type=int, default=SYNTHETIC_SHAPE[-1])
    parser.add_argument("--global-batch", type=int, default=32)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--slowdown", default="1,4")
    parser.add_argument("--loader-workers", type=int, default=2)
    parser.add_argument("--loading-models", default="cnn,resnet18",
                        help="Models of the loading table, comma-separated ('' skips it).")
    parser.add_argument("--loading-steps", type=int, default=40,
                        help="Steps of each run of the loading table.")
    parser.add_argument("--loading-ranks", type=int, nargs="+", default=[1, 2],
                        help="Ranks of the loading table's runs, each in turn.")
    parser.add_argument("--photo-size", default="500x375",
                        help="WIDTH x HEIGHT of the generated JPEGs of the loading table.")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        if args.data_dir:
            small = photos = args.data_dir
            sources = (args.data_dir, args.data_dir)
        else:
            small, photos = os.path.join(tmp, "small"), os.path.join(tmp, "photos")
            width, height = (int(v) for v in args.photo_size.split("x"))
            print("writing the ImageFolders ...", file=sys.stderr)
            write_image_folder(small)
            write_image_folder(photos, size=(width, height))
            sources = [f"generated ImageFolder (10 classes, 40 train + 10 val images each, "
                       f"{w}x{h} JPEG)" for w, h in ((80, 64), (width, height))]
        compare_batching(args, small, sources[0])
        models = [m for m in args.loading_models.split(",") if m]
        if models:
            print()
            compare_loading(args, models, photos, sources[1])


def training(args, model: str, data: list) -> list:
    return ["--model", model, "--image-size", str(args.image_size), "--global-batch",
            str(args.global_batch), "--lr", str(args.lr), "--momentum", "0.9", *data]


def compare_batching(args, data_dir: str, source: str) -> None:
    """Static against dynamic batching under the emulated slowdown."""
    rows = []
    for batching in ("static", "dynamic"):
        print(f"{batching} ...", file=sys.stderr)
        records = run_training_job(2, training(args, args.model, [
            "--dataset", "imagefolder", "--data-dir", data_dir, "--epochs", str(args.epochs),
            "--batching", batching, "--slowdown", args.slowdown,
            "--loader-workers", str(args.loader_workers)]), timeout=3600)
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


def compare_loading(args, models: list, data_dir: str, source: str) -> None:
    """Images decoded in the step, decoded ahead by workers, and data that costs nothing."""
    size = SYNTHETIC_SHAPE[-1]
    if args.image_size != size:
        print(f"Data loading: not compared; the synthetic data is {size}x{size}, run with "
              f"--image-size {size} to compare.")
        return
    folder = ["--dataset", "imagefolder", "--data-dir", data_dir]
    kinds = [("decoded in the step", folder, 0),
             (f"decoded ahead by {args.loader_workers} workers", folder, args.loader_workers),
             ("synthetic (no loading)", ["--dataset", "synthetic"], 0)]
    rows = []
    for model in models:
        for ranks in args.loading_ranks:
            seconds = []
            for label, data, workers in kinds:
                print(f"{model} on {ranks} rank(s), {label} ...", file=sys.stderr)
                records = run_training_job(ranks, training(args, model, [
                    *data, "--max-steps", str(args.loading_steps), "--batching", "dynamic",
                    "--loader-workers", str(workers)]), timeout=3600)
                seconds.append(1 / steady_throughput(records))
            in_step, ahead, free = seconds
            loading = in_step - free
            hidden = (f"{1 - (ahead - free) / loading:.0%}" if loading >= NOISE * free
                      else "below noise")
            for (label, _, workers), t in zip(kinds, seconds):
                rows.append([model, ranks, label, round(1 / t, 1), round(1000 * t, 2),
                             round(1000 * (t - free), 2),
                             hidden if workers else ""])
    print_report(
        f"Data loading: {source} against synthetic data, image size {args.image_size}, global "
        f"batch {args.global_batch}, {args.loading_steps} steps, dynamic batching, 1 thread per "
        f"rank, no emulated slowdown. 'loading' = ms per sample over synthetic data; 'hidden' "
        f"= the share of the in-step loading cost that the workers removed (not given when "
        f"loading costs under {NOISE:.0%} of the compute).",
        ["model", "ranks", "data", "samples/s (steady)", "ms per sample", "loading (ms)",
         "hidden"], rows)


if __name__ == "__main__":
    main()
