"""The cost of dynamic batching's machinery at equal batches, against plain Horovod.

Three jobs of 2 ranks with no emulated slowdown, the same model, data and global batch:
plain `hvd.DistributedOptimizer` (benchmarks/plain_horovod.py), `hvd-dynbatch train` with
static batching, and with dynamic batching. They run in turns, `--repeats` times, each round
starting with a different one, and the median of each is compared. It also prints the share
of the training time that the timing exchange and the controller took.

    python benchmarks/overhead.py [--repeats 6] [--steps 60]
"""
from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

from common import print_report, steady_throughput

from hvd_dynbatch.tools.jobs import run_training_job
from hvd_dynbatch.tools.launch import Launcher, json_records, run_local

HERE = Path(__file__).resolve().parent


def plain_horovod(args) -> float:
    job = run_local(Launcher.GLOO, 2, [sys.executable, str(HERE / "plain_horovod.py"),
                                       "--model", args.model, "--dataset", args.dataset,
                                       "--global-batch", str(args.global_batch),
                                       "--steps", str(args.steps)], timeout=600)
    if job.returncode != 0:
        raise SystemExit(f"plain Horovod run failed:\n{job.stderr[-2000:]}")
    return json_records(job.stdout)[-1]["samples_per_sec"]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=6)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--global-batch", type=int, default=256)
    parser.add_argument("--model", default="cnn")
    parser.add_argument("--dataset", default="synthetic")
    args = parser.parse_args()
    options = ["--model", args.model, "--dataset", args.dataset, "--global-batch",
               str(args.global_batch), "--epochs", "1000", "--max-steps", str(args.steps),
               "--eval-every", "100000", "--lr", "0.05"]
    loops = ["plain Horovod", "static", "dynamic"]
    rates = {name: [] for name in loops}
    exchange_share = {"static": [], "dynamic": []}
    for repeat in range(args.repeats):
        # Each round starts with a different loop, so none always runs first or last.
        for name in loops[repeat % 3:] + loops[:repeat % 3]:
            if name == "plain Horovod":
                rates[name].append(plain_horovod(args))
                continue
            records = run_training_job(2, [*options, "--batching", name])
            rates[name].append(steady_throughput(records))
            summary = records[-1]
            exchange_share[name].append(summary["exchange_seconds"] / summary["train_seconds"])
    base = statistics.median(rates["plain Horovod"])
    rows = []
    for name, values in rates.items():
        rate = statistics.median(values)
        share = exchange_share.get(name)
        rows.append([name, [round(v) for v in values], rate, f"{rate / base - 1:+.1%}",
                     None if share is None else f"{statistics.median(share):.2%}"])
    print_report(
        f"Equal batches, no slowdown: {args.model} on {args.dataset}, global batch "
        f"{args.global_batch}, {args.steps} steps, 2 ranks x 1 thread, {args.repeats} runs "
        f"each in rotating turns; throughput from the median step time of the last 75% of steps.",
        ["loop", "runs (samples/s)", "median (samples/s)",
         "vs plain Horovod", "exchange + controller share"], rows)


if __name__ == "__main__":
    main()
