"""Comparison matrix: static, dynamic "p", dynamic "pid" and ABS-SGD at heterogeneity levels.

Each level is a preset of `hvd_dynbatch.core.heterogeneity.preset_factors`: HL1..HL8 on `--ranks`
ranks, and the CPU-core splits 12/12/12/12 and 6/6/4/32 on four. On this machine the factors
are emulated with `--slowdown`; with more ranks than cores every factor is multiplied by
ranks / cores, so emulated workers do not compete for cores (and the figures stay comparable
with the standalone rate of one rank alone). Every method trains the same CNN on the synthetic
data (class patterns in noise, learnt in a few epochs) with the same global batch (ABS-SGD:
target batch), learning rate, momentum and number of epochs, evaluating every few steps.

Figures: samples/s over the run and in the steady state; training time to the target test
accuracy; the final test accuracy; efficiency = steady samples/s / sum of the workers'
standalone rates, the physical limit (one rank alone at factor 1 measured once at batch B/n,
worker i's rate taken as that over its factor, which is what the emulator's sleep makes it).
On a cluster, run `hvd-dynbatch train` with the same options and no --slowdown.

    python benchmarks/matrix.py [--levels HL1 HL2 HL4 HL8 cores:12/12/12/12 cores:6/6/4/32]
                                [--methods static p pid abs] [--plots DIR [--plot-levels HL8 ...]]
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from common import print_report, time_to_accuracy

from hvd_dynbatch.core.heterogeneity import preset_factors
from hvd_dynbatch.tools.jobs import run_training_job, standalone_rates, summary_of
from hvd_dynbatch.tools.plot import plot_comparison, plot_run
from hvd_dynbatch.training.metrics import steady_throughput

# name on the command line: (name in the table, train options)
METHODS = {"static": ("static", ["--batching", "static"]),
           "p": ("dynamic p", ["--batching", "dynamic", "--controller", "p"]),
           "pid": ("dynamic pid", ["--batching", "dynamic", "--controller", "pid"]),
           "abs": ("ABS-SGD", ["--batching", "abs", "--micro-batch", "16"])}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--levels", nargs="+", default=[
        "HL1", "HL2", "HL4", "HL8", "cores:12/12/12/12", "cores:6/6/4/32"])
    parser.add_argument("--ranks", type=int, default=2, help="Ranks for the HL levels.")
    parser.add_argument("--global-batch", type=int, default=256)
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--target", type=float, default=0.9)
    parser.add_argument("--methods", nargs="+", choices=list(METHODS), default=list(METHODS))
    parser.add_argument("--plots", help="Directory for PNG plots of the runs.")
    parser.add_argument("--plot-levels", nargs="+", default=["HL8", "cores:6/6/4/32"],
                        help="Levels to plot, with --plots.")
    args = parser.parse_args()
    # Momentum 0.5, as in the earlier tables: uncompensated, ABS-SGD's stale gradient diverged
    # at 0.9 here (abs_compare.py runs 0.9, with and without compensation).
    base = ["--model", "cnn", "--dataset", "synthetic", "--global-batch", str(args.global_batch),
            "--lr", "0.1", "--momentum", "0.5", "--seed", "0", "--epochs", str(args.epochs),
            "--eval-every", "5", "--adjust-every", "3"]
    cores = os.cpu_count() or 1
    standalone = {}
    rows = []
    for level in args.levels:
        factors = preset_factors(level, args.ranks)
        n = len(factors)
        scale = max(1.0, n / cores)
        emulated = [f * scale for f in factors]
        batch = args.global_batch // n
        if batch not in standalone:
            print(f"standalone rate at batch {batch} ...", file=sys.stderr)
            standalone[batch] = standalone_rates(["1"], batch, base)["1"]
        limit = sum(standalone[batch] / f for f in emulated)
        runs = {}
        for method, options in (METHODS[name] for name in args.methods):
            print(f"{level}: {method} ...", file=sys.stderr)
            runs[method] = run_training_job(n, [
                *base, *options, "--slowdown", ",".join(f"{f:g}" for f in emulated)])
            summary = summary_of(runs[method])
            steady = steady_throughput(runs[method])
            rows.append([level, ",".join(f"{f:g}" for f in emulated), method,
                         round(summary["samples_per_sec"]), round(steady),
                         time_to_accuracy(runs[method], args.target),
                         summary["final_accuracy"], round(limit), f"{steady / limit:.0%}"])
        if args.plots and level in args.plot_levels:
            _plot(Path(args.plots), level, runs)
    alone = ", ".join(f"{v:.0f} samples/s at batch {b}" for b, v in standalone.items())
    print_report(
        f"Comparison matrix: CNN on synthetic data, global batch (ABS-SGD: target batch) "
        f"{args.global_batch}, lr 0.1, momentum 0.5, {args.epochs} epochs, seed 0, one run "
        f"each; HL levels on {args.ranks} ranks, core splits on 4; emulated factors scaled by "
        f"ranks/cores where ranks > {cores} cores. Time to {args.target:.0%} test accuracy is "
        f"training time (evaluation every 5 steps excluded); limit = sum of standalone rates "
        f"(one rank alone: {alone}); "
        f"steady = from the median step time of the last 75% of steps; efficiency = steady / "
        f"limit. ABS-SGD computes micro-batches of 16, whose per-sample cost on this CPU is "
        f"lower than at batch B/n, so its efficiency can pass 100%.",
        ["level", "emulated factors", "method", "samples/s (run)", "samples/s (steady)",
         "time to target (s)", "final accuracy", "limit (samples/s)", "efficiency"], rows)


def _plot(directory: Path, level: str, runs: dict) -> None:
    """Loss and accuracy against time for every method; the pid run's split and timings, if
    it ran."""
    directory.mkdir(parents=True, exist_ok=True)
    name = level.replace(":", "-").replace("/", "-")
    plot_comparison(runs, str(directory / f"matrix-{name}.png"),
                    f"{level}: loss and test accuracy against training time")
    if "dynamic pid" in runs:
        plot_run(runs["dynamic pid"], str(directory / f"matrix-{name}-pid.png"),
                 f"{level}, dynamic pid: per-rank batch size and compute time")


if __name__ == "__main__":
    main()
