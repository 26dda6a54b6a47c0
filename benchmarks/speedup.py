"""Static versus dynamic batching throughput on 2 emulated-heterogeneous ranks.

For each slowdown pair, three kinds of run with the same model, data and global batch:
each worker alone (1 rank, its slowdown, batch B/2; `standalone_rates` measures the workers of
a pair in one job, in interleaved phases) for its standalone rate r_i; both workers
with static batching; both with dynamic batching. It prints each speedup next to the ideal
sum(r_i) / (n * min r_i), the most any split can give over equal batches.

    python benchmarks/speedup.py [--slowdowns 1,4 1,8] [--steps 40]
"""
from __future__ import annotations

import argparse
import sys

from common import print_report

from hvd_dynbatch.tools.jobs import ideal_speedup, measuring_run, run_training_job, standalone_rates
from hvd_dynbatch.training.metrics import steady_throughput


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--slowdowns", nargs="+", default=["1,4", "1,8"])
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--global-batch", type=int, default=256)
    parser.add_argument("--model", default="cnn")
    parser.add_argument("--dataset", default="synthetic")
    args = parser.parse_args()
    model = ["--model", args.model, "--dataset", args.dataset, "--adjust-every", "3"]
    base = [*model, *measuring_run(args.steps)]
    rates = {}

    def standalone(factors: tuple, batch: int) -> dict:
        """Workers alone: the rate of each of `factors` at batch `batch`, measured in one
        job (cached)."""
        if (factors, batch) not in rates:
            rates[factors, batch] = standalone_rates(factors, batch, model)
        return rates[factors, batch]

    rows = []
    for spec in args.slowdowns:
        factors = tuple(spec.split(","))
        n = len(factors)
        alone = standalone(factors, args.global_batch // n)
        even = [alone[f] for f in factors]
        ideal = ideal_speedup(even)
        measured = {}
        for batching in ("static", "dynamic"):
            records = run_training_job(n, [
                *base, "--global-batch", str(args.global_batch), "--slowdown", spec,
                "--batching", batching])
            measured[batching] = steady_throughput(records)
        split = records[-1]["final_split"]
        limit = sum(standalone((f,), b)[f] for f, b in zip(factors, split))
        speedup = measured["dynamic"] / measured["static"]
        rows.append([spec, [round(r) for r in even], measured["static"], measured["dynamic"],
                     f"{speedup:.2f}x", f"{ideal:.2f}x", f"{speedup / ideal:.0%}", split,
                     round(limit), f"{measured['dynamic'] / limit:.0%}"])
        print(f"slowdown {spec}: speedup {speedup:.2f}x, ideal {ideal:.2f}x", file=sys.stderr)
    print_report(
        f"Static vs dynamic batching: {args.model} on {args.dataset}, global batch "
        f"{args.global_batch}, {args.steps} steps, 2 ranks x 1 thread. Throughput from the "
        f"median step time of the last 75% of steps. Ideal = sum(r_i) / (n min r_i) with "
        f"r_i each worker's standalone rate at batch B/n; limit = the sum of standalone "
        f"rates at the final split's batches, and efficiency = dynamic / limit.",
        ["slowdown", "standalone r_i at B/n", "static (samples/s)",
         "dynamic (samples/s)", "speedup", "ideal", "of ideal",
         "final split", "limit at final split", "efficiency"], rows)


if __name__ == "__main__":
    main()
