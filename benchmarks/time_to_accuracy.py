"""Wall time to a target test accuracy on the embedded digits, static versus dynamic batching.

The demo's job (a small CNN, global batch 512, the same learning rate and seed for both)
under each slowdown, `--repeats` times in turns; the training clock excludes evaluation.

    python benchmarks/time_to_accuracy.py [--slowdowns 1,4 1,8] [--target 0.9] [--repeats 2]
"""
from __future__ import annotations

import argparse
import sys
import statistics

from common import print_report

from hvd_dynbatch.tools.demo import DEMO_TRAINING
from hvd_dynbatch.tools.jobs import run_training_job, summary_of


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--slowdowns", nargs="+", default=["1,4", "1,8"])
    parser.add_argument("--target", type=float, default=0.9)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    rows = []
    for spec in args.slowdowns:
        runs = {"static": [], "dynamic": []}
        for _ in range(args.repeats):
            for batching in runs:
                runs[batching].append(summary_of(run_training_job(2, [
                    *DEMO_TRAINING, "--slowdown", spec, "--target-accuracy", str(args.target),
                    "--batching", batching])))
        times = {b: [s["time_to_target"] for s in runs[b]] for b in runs}
        reached = {b: [t for t in times[b] if t is not None] for b in runs}
        median = {b: statistics.median(reached[b]) if reached[b] else None for b in runs}
        for batching in runs:
            rounded = [None if t is None else round(t, 2) for t in times[batching]]
            rows.append([spec, batching, rounded,
                         median[batching], [s["steps"] for s in runs[batching]],
                         [round(s["final_accuracy"], 3) for s in runs[batching]]])
        if median["static"] and median["dynamic"]:
            print(f"slowdown {spec}: dynamic reaches {args.target:.0%} "
                  f"{median['static'] / median['dynamic']:.2f}x sooner", file=sys.stderr)
    print_report(
        f"Time to {args.target:.0%} test accuracy on digits (CNN, global batch 512, lr 0.1, "
        f"momentum 0.9, seed 0), 2 ranks x 1 thread, {args.repeats} runs each; training "
        f"seconds, evaluation excluded.",
        ["slowdown", "batching", "time to target per run (s)", "median (s)", "steps",
         "accuracy at stop"], rows)


if __name__ == "__main__":
    main()
