"""Static batching, dynamic batching (pid) and ABS-SGD under the same emulated heterogeneity.

Two ranks train the demo's CNN on the embedded digits with the same global batch (ABS-SGD's
target batch), learning rate and seed, under a static slowdown and under a fluctuating one
(a schedule that swaps which rank is slow every few steps). For each: throughput (all
samples / training time), the training time to the target test accuracy, and the samples
used to reach it (a run stops at its target), also as a multiple of static batching's; for
ABS-SGD, the share of settled windows whose global sample count is within 10% of the target
batch (settled: from window 2, when every rank's rate is known, and not the two windows
after a change of speed, which were planned from the old rates).

    python benchmarks/abs_compare.py [--target 0.9] [--repeats 2] [--scenarios static fluctuating]
        [--methods static pid abs abs-none]
"""
from __future__ import annotations

import argparse
import math
import statistics
import sys

from common import print_report

from hvd_dynbatch.core.heterogeneity import Slowdown
from hvd_dynbatch.tools.jobs import run_training_job, summary_of
from hvd_dynbatch.training.metrics import step_records

# name on the command line: (name in the table, slowdown)
SCENARIOS = {
    "static": ("static 1,4", "1,4"),
    "fluctuating": ("fluctuating (1,4 and 4,1, swapped every 10 steps)", ";".join(
        f"{s}:{'1,4' if (s // 10) % 2 == 0 else '4,1'}" for s in range(0, 400, 10))),
}
# name on the command line: (name in the table, train options); static comes first, as the
# others' samples to target are given as multiples of its.
METHODS = {"static": ("static", ["--batching", "static"]),
           "pid": ("dynamic (pid)", ["--batching", "dynamic", "--controller", "pid"]),
           "abs": ("ABS-SGD (staleness: predict)", ["--batching", "abs", "--micro-batch", "16"]),
           "abs-none": ("ABS-SGD (staleness: none)", ["--batching", "abs", "--micro-batch",
                                                      "16", "--staleness", "none"])}


def settled_within(records: list, slowdown: str, target: int, tolerance: float = 0.1) -> float:
    """The share of settled windows (see above) whose global count is within `tolerance` of
    `target`."""
    changes = {s + k for s in Slowdown.parse(slowdown).starts[1:] for k in (0, 1)}
    counts = [r["global_batch"] for r in step_records(records)
              if r["step"] >= 2 and r["step"] not in changes]
    if not counts:
        return math.nan
    return sum(abs(c - target) <= tolerance * target for c in counts) / len(counts)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", type=float, default=0.9)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--global-batch", type=int, default=256)
    parser.add_argument("--scenarios", nargs="+", choices=list(SCENARIOS),
                        default=list(SCENARIOS))
    parser.add_argument("--methods", nargs="+", choices=list(METHODS), default=list(METHODS))
    parser.add_argument("--epochs", type=int, default=60,
                        help="The most a run trains when it does not reach --target.")
    args = parser.parse_args()
    base = ["--model", "cnn", "--dataset", "digits", "--global-batch", str(args.global_batch),
            "--lr", "0.05", "--momentum", "0.9", "--seed", "0", "--epochs", str(args.epochs),
            "--eval-every", "5", "--adjust-every", "3",
            "--target-accuracy", str(args.target)]
    rows = []
    for scenario, slowdown in (SCENARIOS[name] for name in args.scenarios):
        static_samples = None
        for method, options in (METHODS[name] for name in METHODS if name in args.methods):
            runs, within = [], []
            for _ in range(args.repeats):
                print(f"{scenario}: {method} ...", file=sys.stderr)
                records = run_training_job(2, [*base, *options, "--slowdown", slowdown])
                runs.append(summary_of(records))
                within.append(settled_within(records, slowdown, args.global_batch))
            reached = [r for r in runs if r["time_to_target"] is not None]
            samples = statistics.median(r["samples"] for r in reached) if reached else None
            if method == "static":
                static_samples = samples
            rows.append([scenario, method,
                         statistics.median(r["samples_per_sec"] for r in runs),
                         statistics.median(r["time_to_target"] for r in reached)
                         if reached else None,
                         samples, samples / static_samples if samples and static_samples
                         else None,
                         f"{len(reached)}/{len(runs)}",
                         statistics.median(r["steps"] for r in runs),
                         statistics.median(r["final_accuracy"] for r in runs),
                         f"{statistics.median(within):.0%}" if "ABS" in method else "-"])
    print_report(
        f"Static vs dynamic (pid) vs ABS-SGD: 2 ranks x 1 thread, CNN on digits, global batch "
        f"(ABS-SGD: target batch) {args.global_batch}, lr 0.05, momentum 0.9, micro-batch 16, "
        f"seed 0, "
        f"{args.repeats} runs each (medians); time to {args.target:.0%} test accuracy is "
        f"training time, evaluation (every 5 steps) excluded.",
        ["heterogeneity", "method", "samples/s", "time to target (s)", "samples to target",
         "x static", "runs reaching it",
         "steps", "accuracy at stop", "settled windows within 10% of B"], rows)


if __name__ == "__main__":
    main()
