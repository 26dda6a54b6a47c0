"""The step clock against ground truth: is a rank's measured compute time the GPU's?

CUDA kernels run asynchronously, so a clock read when `backward()` returns measures how fast
the CPU queued the step, not how long the GPU ran it; the toolkit waits for the GPU's stream
before it reads the clock (`backend.device.wait_for_compute`). This script trains a few steps
of a model whose kernels the CPU queues much faster than the GPU runs them (ResNet-50 at
224 px) through `hvd_dynbatch.train`, a Horovod job of one rank, and reads the compute time
each step recorded. Then it times the same work (the batch fetched and moved, forward,
backward) in a plain loop twice: with `torch.cuda.synchronize()` before and after each step
(the ground truth), and without the wait at the end (the host clock). It prints the median of
each and fails unless the toolkit's clock is within 5% of the ground truth and, on a GPU, the
host clock is not (under 80% of it).

    python benchmarks/step_clock.py                       (on a GPU node)
    python benchmarks/step_clock.py --device cpu --model cnn --image-size 32   (a dry run)
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

from hvd_dynbatch.backend.device import resolve_device, to_device
from hvd_dynbatch.data.datasets import load_dataset
from hvd_dynbatch.training.config import TrainConfig
from hvd_dynbatch.training.metrics import read_metrics, steady_steps
from hvd_dynbatch.training.models import build_model
from hvd_dynbatch.training.trainer import train


def toolkit_clock(args) -> list:
    """The compute seconds of the steady steps of a one-rank run."""
    with tempfile.TemporaryDirectory() as tmp:
        metrics = str(Path(tmp) / "metrics.jsonl")
        train(TrainConfig(model=args.model, dataset="synthetic", image_size=args.image_size,
                          global_batch=args.batch, max_steps=args.steps, eval_every=100000,
                          device=args.device, metrics=metrics, progress=False,
                          adjust_every=args.steps))
        return [r["compute_times"][0] for r in steady_steps(read_metrics(metrics))]


def plain_clocks(args) -> tuple:
    """The seconds of the same steps in a plain loop: waited for (ground truth), not waited."""
    device = resolve_device(args.device, 0)
    data = load_dataset("synthetic", image_size=args.image_size)
    model = build_model(args.model, data.input_shape, data.num_classes).to(device)
    waited, unwaited = [], []
    for step in range(args.steps):
        indices = [(step * args.batch + i) % len(data.train) for i in range(args.batch)]
        for times, wait in ((waited, True), (unwaited, False)):
            model.zero_grad()
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            began = time.perf_counter()
            x, y = to_device(data.train.fetch(indices), device)
            F.cross_entropy(model(x), y).backward()
            if wait and device.type == "cuda":
                torch.cuda.synchronize(device)
            times.append(time.perf_counter() - began)
    skip = args.steps // 4      # start-up steps, as steady_steps skips them
    return waited[skip:], unwaited[skip:]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="resnet50")
    parser.add_argument("--image-size", type=int, default=224)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--steps", type=int, default=24)
    parser.add_argument("--device", default="cuda")
    args = parser.parse_args()
    measured = statistics.median(toolkit_clock(args))
    waited, unwaited = (statistics.median(t) for t in plain_clocks(args))
    print(f"Step clock, {args.model} at {args.image_size} px, batch {args.batch}, "
          f"{args.device}: median seconds of a step's compute (steps {args.steps // 4}-"
          f"{args.steps - 1})\n")
    print("| clock | median ms | / ground truth |\n|---|---|---|")
    for name, value in (("torch.cuda.synchronize around the step (ground truth)", waited),
                        ("hvd-dynbatch's compute time", measured),
                        ("host clock, no wait", unwaited)):
        print(f"| {name} | {value * 1e3:.2f} | {value / waited:.3f} |")
    agrees = abs(measured / waited - 1) <= 0.05
    print(f"\nhvd-dynbatch's clock {'agrees' if agrees else 'DOES NOT agree'} with the ground "
          f"truth within 5%")
    if not args.device.startswith("cuda"):
        print("(on the CPU every operation has finished when it returns: the host clock is "
              "the ground truth, nothing to tell apart)")
        return 0 if agrees else 1
    host_differs = unwaited / waited < 0.8
    print(f"the host clock without the wait {'is' if host_differs else 'is NOT'} below 80% of "
          f"it (it must be, or the model does not tell the clocks apart)")
    return 0 if agrees and host_differs else 1


if __name__ == "__main__":
    sys.exit(main())
