"""How close the emulated slowdown lands to the factor asked for.

For each model, two measurements, `--repeats` rounds each; the table gives the median and the
range over rounds:
- alone: one worker (a 1-rank job, as the demo and `speedup.py` measure the standalone rates
  their ideal speedups come from) at factor 1 and at each factor, in turns. A round's factor
  is its rate at factor 1 over its rate at the factor. The emulation slows a step's compute
  (fetch, forward, backward), not the optimizer's update after it, so a step whose share u
  is outside the compute at factor 1 is expected at f (1 - u) + u times; the table gives that
  too. Factor 1 alone is the control: a second job at factor 1 against the round's first,
  how far apart two jobs of this machine already are.
- in a job: 2 ranks at slowdown 1,f with equal static batches, sharing the machine's cores
  as the demo's ranks do. A round's factor is the median, over the steady steps, of rank 1's
  compute time over rank 0's; this is the factor the controller sees. Slowdown 1,1 is the
  control: how far apart two unslowed ranks of this machine already are.

    python benchmarks/emulator_fidelity.py [--factors 4 8] [--repeats 3]
"""
from __future__ import annotations

import argparse
import statistics
import sys

from common import print_report

from hvd_dynbatch.tools.jobs import measuring_run, run_training_job
from hvd_dynbatch.training.metrics import steady_steps, steady_throughput

# (model options, batch of one worker, steps): the CNN at the per-rank batches of the demo
# (digits, 512 on 2 ranks) and of speedup.py (synthetic, 256 on 2 ranks), a small batch, and
# ResNet-18. A slowed rank alone calibrates on its first 12 steps (`Emulator`), so ResNet-18's
# 24 steps leave 12 to measure.
CASES = [
    (["--model", "cnn", "--dataset", "digits"], 256, 30),
    (["--model", "cnn", "--dataset", "synthetic"], 128, 30),
    (["--model", "cnn", "--dataset", "synthetic"], 16, 30),
    (["--model", "resnet18", "--dataset", "synthetic"], 32, 24),
]


def alone_job(factor: str, batch: int, options: list, steps: int) -> tuple:
    """A 1-rank job at `factor`: its steady samples/s, and the median share of its step
    outside the compute."""
    records = run_training_job(1, [*options, "--global-batch", str(batch),
                                   "--slowdown", factor, *measuring_run(steps)])
    outside = statistics.median(1 - r["compute_times"][0] / r["step_time"]
                                for r in steady_steps(records))
    return steady_throughput(records), outside


def in_job_factor(factor: str, batch: int, options: list, steps: int) -> float:
    """Rank 1's compute time over rank 0's in a 2-rank job at slowdown 1,`factor`."""
    records = run_training_job(2, [
        *options, "--global-batch", str(2 * batch), "--batching", "static",
        "--slowdown", f"1,{factor}", *measuring_run(steps)])
    return statistics.median(r["compute_times"][1] / r["compute_times"][0]
                             for r in steady_steps(records))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--factors", nargs="+", default=["4", "8"])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    rows = []
    for options, batch, steps in CASES:
        alone = {f: [] for f in ["1", *args.factors]}
        in_job = {f: [] for f in ["1", *args.factors]}
        outside = []
        for repeat in range(args.repeats):
            # Each round starts with a different factor, so none always runs first.
            order = ["1", *args.factors]
            order = order[repeat % len(order):] + order[:repeat % len(order)]
            jobs = {f: alone_job(f, batch, options, steps) for f in order}
            again, _ = alone_job("1", batch, options, steps)
            base, share = jobs["1"]
            outside.append(share)
            for f in alone:
                alone[f].append(base / (again if f == "1" else jobs[f][0]))
            for f in in_job:
                in_job[f].append(in_job_factor(f, batch, options, steps))
        share = statistics.median(outside)
        for where, measured in (("alone", alone), ("in a job", in_job)):
            for f, values in measured.items():
                median = statistics.median(values)
                expected = float(f) * (1 - share) + share if where == "alone" else float(f)
                rows.append([" ".join(options[1::2]), batch, f, where, f"{median:.2f}",
                             f"{min(values):.2f}-{max(values):.2f}",
                             f"{median / float(f) - 1:+.0%}", f"{expected:.2f}"])
                print(f"{rows[-1][0]} batch {batch}: factor {f} {where} measured {median:.2f}",
                      file=sys.stderr)
    print_report(
        f"Emulated slowdown, {args.repeats} rounds, 1 thread per rank. Alone: samples/s of a "
        f"1-rank job at factor 1 / at the factor (f = 1: / a second job at factor 1), from "
        f"the median step time of the last 75% of steps, without the 12 it calibrates on; "
        f"expected f (1 - u) + u, u the median share of the step outside the compute at "
        f"factor 1. In a job: median of rank 1's / rank 0's compute time over the last 75% "
        f"of steps of a 2-rank job at slowdown 1,f with equal batches (f = 1: the machine's "
        f"own spread).",
        ["model, data", "batch", "factor", "where", "measured (median)", "range", "off by",
         "expected"],
        rows)


if __name__ == "__main__":
    main()
