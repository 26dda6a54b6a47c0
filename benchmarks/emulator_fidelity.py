"""How close the emulated slowdown lands to the factor asked for.

For each model, two measurements, `--repeats` rounds each; the table gives the median and the
range over rounds, and the progress lines (stderr) each round's figure: alone, a round's
factors share one reference, its phases at factor 1, and move together when that reference
runs slow or fast:
- alone: one worker (a 1-rank job, as the demo and `speedup.py` measure the standalone rates
  their ideal speedups come from, `standalone_records`) at factor 1 and at each factor, in
  interleaved phases of one job. A round's factor is its rate at factor 1 over its rate at
  the factor. The emulation slows a step's busy time (fetch, forward, backward, and the
  optimizer's update before them), not what lies outside it (the step's bookkeeping), so a
  step whose share u is outside the busy time at factor 1 is expected at f (1 - u) + u
  times; the table gives that too, and the ratio of busy times, which is expected at f.
  Factor 1 alone is the control: a second set of phases at factor 1 in the same job against
  the first.
- in a job: 2 ranks at slowdown 1,f with equal static batches, sharing the machine's cores
  as the demo's ranks do. A round's factor is the median, over the steady steps, of rank 1's
  busy time over rank 0's; this is the factor the controller sees. Slowdown 1,1 is the
  control: how far apart two unslowed ranks of this machine already are.

    python benchmarks/emulator_fidelity.py [--factors 4 8] [--repeats 3] [--models cnn resnet18]
        [--batches 256 128 16 32]
"""
from __future__ import annotations

import argparse
import statistics
import sys

from common import print_report

from hvd_dynbatch.tools.jobs import measuring_run, run_training_job, standalone_records
from hvd_dynbatch.training.metrics import busy_times, steady_steps

# (model options, batch of one worker, steps in a job, rounds of phases alone): the CNN at the
# per-rank batches of the demo (digits, 512 on 2 ranks) and of speedup.py (synthetic, 256 on 2
# ranks), a small batch, and ResNet-18, in fewer rounds alone: a 1-rank job of 3 rounds (132
# steps) ran past 600 s here.
CASES = [
    (["--model", "cnn", "--dataset", "digits"], 256, 30, 3),
    (["--model", "cnn", "--dataset", "synthetic"], 128, 30, 3),
    (["--model", "cnn", "--dataset", "synthetic"], 16, 30, 3),
    (["--model", "resnet18", "--dataset", "synthetic"], 32, 24, 2),
]
# A second name for factor 1 alone: its phases, interleaved with the first's, are the control.
AGAIN = "1.0"


def alone_factors(factors: list, batch: int, options: list, rounds: int) -> tuple:
    """One worker alone, in one job: for each factor, its rate at factor 1 over its rate at
    the factor and the same ratio of its busy times (at "1", the control's phases over the
    first's), and the median share of its step at factor 1 outside the busy time."""
    kept = standalone_records(["1", AGAIN, *factors], batch, options, rounds=rounds,
                              timeout=3600)

    def ratios(key) -> dict:
        median = {f: statistics.median(key(r) for r in records) for f, records in kept.items()}
        return {f: median[AGAIN if f == "1" else f] / median["1"] for f in ["1", *factors]}

    outside = statistics.median(1 - busy_times(r)[0] / r["step_time"] for r in kept["1"])
    return ratios(lambda r: r["step_time"]), ratios(lambda r: busy_times(r)[0]), outside


def in_job_factor(factor: str, batch: int, options: list, steps: int) -> float:
    """Rank 1's busy time over rank 0's in a 2-rank job at slowdown 1,`factor`."""
    records = run_training_job(2, [
        *options, "--global-batch", str(2 * batch), "--batching", "static",
        "--slowdown", f"1,{factor}", *measuring_run(steps)])
    return statistics.median(slowed / other
                             for other, slowed in map(busy_times, steady_steps(records)))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--factors", nargs="+", default=["4", "8"])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--models", nargs="+", choices=["cnn", "resnet18"],
                        default=["cnn", "resnet18"])
    parser.add_argument("--batches", nargs="+", type=int,
                        choices=sorted({batch for _, batch, _, _ in CASES}),
                        help="Only the cases at these batches of one worker [all].")
    args = parser.parse_args()
    rows = []
    for options, batch, steps, rounds in CASES:
        if options[1] not in args.models or (args.batches and batch not in args.batches):
            continue
        factors = ["1", *args.factors]
        alone, alone_compute, in_job = ({f: [] for f in factors} for _ in range(3))
        outside = []
        for _ in range(args.repeats):
            rates, computes, share = alone_factors(args.factors, batch, options, rounds)
            outside.append(share)
            for f in factors:
                alone[f].append(rates[f])
                alone_compute[f].append(computes[f])
                in_job[f].append(in_job_factor(f, batch, options, steps))
        share = statistics.median(outside)
        for where, measured in (("alone", alone), ("in a job", in_job)):
            for f, values in measured.items():
                median = statistics.median(values)
                expected = float(f) * (1 - share) + share if where == "alone" else float(f)
                compute = (f"{statistics.median(alone_compute[f]):.2f}" if where == "alone"
                           else "")
                rows.append([" ".join(options[1::2]), batch, f, where, f"{median:.2f}",
                             f"{min(values):.2f}-{max(values):.2f}",
                             f"{median / float(f) - 1:+.0%}", f"{expected:.2f}", compute])
                rounds_seen = ", ".join(f"{v:.2f}" for v in values)
                print(f"{rows[-1][0]} batch {batch}: factor {f} {where} measured {median:.2f}"
                      f" (rounds in order: {rounds_seen})", file=sys.stderr)
    print_report(
        f"Emulated slowdown, {args.repeats} rounds, 1 thread per rank. Alone: one 1-rank job "
        f"per round whose factor cycles through 1, 1 again and the factors in phases of 10 "
        f"steps, 3 times (ResNet-18 twice), after the 12 it calibrates on; the median step "
        f"time at the factor over that at factor 1 (f = 1: the second phases at 1 over the "
        f"first), each phase's first 2 steps left out; expected f (1 - u) + u, u the median "
        f"share of the step outside the busy time at factor 1; busy: the same ratio of busy "
        f"times (fetch, forward, backward, the update before them and the emulation's "
        f"sleep), which should read f. In a job: median of rank 1's / rank 0's busy time "
        f"over the last 75% of "
        f"steps of a 2-rank job at slowdown 1,f with equal batches (f = 1: the machine's own "
        f"spread).",
        ["model, data", "batch", "factor", "where", "measured (median)", "range", "off by",
         "expected", "busy"],
        rows)


if __name__ == "__main__":
    main()
