"""What checkpoints cost: write time and size of one, and the share of training time that
writing one every N steps takes.

The first table writes the checkpoint `hvd-dynbatch train` writes (model, SGD momentum, the
run's state, random number generators) for each model of `--models` with 1000 classes, as
ImageNet has, `--writes` times through `CheckpointDir.save` (temporary file, fsync, rename)
and reports the median time and the file's size.

The second runs the same 2-rank training (`--train-model` on synthetic 32x32 data, dynamic
batching, `--steps` steps) without checkpoints and with `--checkpoint-every` N for each N of
`--every`, and reports the summary's `checkpoint_seconds` (rank 0's time writing them, which
the other ranks wait for at the next allreduce) as a share of the training time.

    python benchmarks/checkpoint_cost.py [--models resnet18,resnet50] [--every 5,20]
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from common import print_report

from hvd_dynbatch.tools.jobs import run_training_job, summary_of
from hvd_dynbatch.training.checkpoint import CheckpointDir, rng_state
from hvd_dynbatch.training.models import build_model
from hvd_dynbatch.training.metrics import steady_throughput


def write_cost(name: str, writes: int, directory: str) -> list:
    """[model, parameters (M), size (MB), median write seconds, MB/s] for `name`."""
    model = build_model(name, (3, 32, 32), 1000)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    # One step, so that the optimizer holds its momentum buffers as in a real run.
    F.cross_entropy(model(torch.randn(2, 3, 32, 32)), torch.tensor([0, 1])).backward()
    optimizer.step()
    state = {"model": model.state_dict(), "optimizer": optimizer.state_dict(),
             "rng": rng_state(), "trainer": {"run": {}, "steps": {}, "schedule": {}}}
    saved = CheckpointDir(directory, keep=1)
    seconds = []
    for step in range(writes):
        began = time.perf_counter()
        path = saved.save(state, step)
        seconds.append(time.perf_counter() - began)
    size = path.stat().st_size / 1e6
    median = statistics.median(seconds)
    return [name, round(sum(p.numel() for p in model.parameters()) / 1e6, 1), round(size, 1),
            round(median, 3), round(size / median)]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="resnet18,resnet50")
    parser.add_argument("--writes", type=int, default=5)
    parser.add_argument("--train-model", default="resnet18")
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--every", default="5,20",
                        help="Values of --checkpoint-every to compare, comma-separated.")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        rows = []
        for name in args.models.split(","):
            print(f"writing {name} checkpoints ...", file=sys.stderr)
            rows.append(write_cost(name, args.writes, str(Path(tmp) / name)))
        print_report(
            f"One checkpoint of each model with 1000 classes and SGD momentum, written "
            f"{args.writes} times to a temporary directory (this machine's disk): the "
            f"median time.",
            ["model", "parameters (M)", "size (MB)", "write (s)", "MB/s"], rows)
        print()
        rows = []
        for every in [None, *(int(n) for n in args.every.split(","))]:
            label = "none" if every is None else f"every {every} steps"
            print(f"training, checkpoints {label} ...", file=sys.stderr)
            options = ["--model", args.train_model, "--dataset", "synthetic", "--image-size",
                       "32", "--global-batch", "32", "--max-steps", str(args.steps)]
            if every is not None:
                options += ["--checkpoint-dir", str(Path(tmp) / f"every{every}"),
                            "--checkpoint-every", str(every)]
            records = run_training_job(2, options, timeout=3600)
            s = summary_of(records)
            written = 0 if every is None else len(range(every, args.steps, every)) + 1
            rows.append([label, written, round(s["train_seconds"], 1),
                         round(s["checkpoint_seconds"], 2),
                         f"{s['checkpoint_seconds'] / s['train_seconds']:.1%}",
                         round(steady_throughput(records), 1)])
        print_report(
            f"{args.train_model} on synthetic 32x32 data, 2 ranks x 1 thread, global batch 32, "
            f"{args.steps} steps, dynamic batching; a checkpoint is also written at the end. "
            f"Share = checkpoint seconds / training seconds.",
            ["checkpoints", "written", "training (s)", "checkpoint (s)", "share",
             "samples/s (steady)"], rows)


if __name__ == "__main__":
    main()
