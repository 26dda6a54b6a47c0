"""How fast and how steadily the controller balances real ranks, "p" against "pid".

Two ranks train with dynamic batching from an even split; the emulated slowdown moves from
one rank to the other mid-run. For each adjustment window (the steps between two timing
exchanges, over which the split is fixed) it takes each rank's median compute time and the
imbalance max/min of those. It reports the adjustments needed to reach imbalance <= 1.10 from
the start and after the change, and how much of the global batch changes hands per adjustment
once settled. The same schedule runs in the cluster model (`hvd_dynbatch.core.simulator`) with
matching rates and noise, as a noise-controlled reference.

    python benchmarks/settling.py [--steps 150] [--schedule "0:1,4;75:4,1"]
"""
from __future__ import annotations

import argparse
import sys
import statistics

import numpy as np
from common import print_report

from hvd_dynbatch.core.controller import BatchController, ControllerConfig, Rule
from hvd_dynbatch.core.heterogeneity import Slowdown
from hvd_dynbatch.core.simulator import ClusterModel, run_adjustments
from hvd_dynbatch.tools.jobs import run_training_job
from hvd_dynbatch.training.metrics import step_records

SETTLED = 1.10


def windows(records: list, adjust_every: int) -> list:
    """(split, imbalance) for each adjustment window of a run."""
    steps = step_records(records)
    out = []
    for start in range(0, len(steps) - adjust_every + 1, adjust_every):
        chunk = steps[start:start + adjust_every]
        times = [statistics.median(r["compute_times"][i] for r in chunk)
                 for i in range(len(chunk[0]["batch_sizes"]))]
        out.append((chunk[0]["batch_sizes"], max(times) / min(times)))
    return out


def settle_figures(splits: list, imbalances: list, change_at: int, global_batch: int) -> list:
    """Adjustments to settle from the start and after the change; movement once settled."""
    def first_settled(start, stop):
        for k in range(start, stop):
            if imbalances[k] <= SETTLED:
                return k - start
        return None

    to_settle = first_settled(0, change_at)
    after_change = first_settled(change_at, len(imbalances))
    moves = [np.abs(np.subtract(splits[k + 1], splits[k])).sum() / (2 * global_batch)
             for k in range(len(splits) - 1)]
    settled_moves = [m for k, m in enumerate(moves)
                     if to_settle is not None and to_settle + 2 <= k < change_at - 1
                     or after_change is not None and change_at + after_change + 2 <= k]
    return [to_settle, after_change,
            f"{statistics.mean(settled_moves):.2%}" if settled_moves else None,
            f"{statistics.median(imbalances):.2f}"]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--adjust-every", type=int, default=5)
    parser.add_argument("--schedule", default="0:1,4;75:4,1")
    parser.add_argument("--global-batch", type=int, default=256)
    args = parser.parse_args()
    slowdown = Slowdown.parse(args.schedule)
    change_at = slowdown.starts[1] // args.adjust_every
    rows = []
    for rule in Rule:
        records = run_training_job(2, [
            "--model", "cnn", "--dataset", "synthetic", "--global-batch",
            str(args.global_batch), "--epochs", "1000", "--max-steps", str(args.steps),
            "--eval-every", "100000", "--adjust-every", str(args.adjust_every),
            "--batching", "dynamic", "--controller", rule.value, "--slowdown", args.schedule])
        splits, imbalances = zip(*windows(records, args.adjust_every))
        rows.append([f"{rule.value} (real ranks)",
                     *settle_figures(splits, imbalances, change_at, args.global_batch)])
        print(f"{rule.value}: imbalance per window "
              f"{[round(x, 2) for x in imbalances]}", file=sys.stderr)
    for rule in Rule:
        rates = 1000.0 / np.asarray(slowdown.factors[0])
        cluster = ClusterModel(rates, overhead=0.002, noise=0.05, seed=1,
                               rate_changes={change_at: 1000.0 / np.asarray(slowdown.factors[1])})
        history = run_adjustments(BatchController(ControllerConfig(args.global_batch, rule=rule)),
                                  cluster, args.steps // args.adjust_every)
        rows.append([f"{rule.value} (cluster model, 5% noise)", *settle_figures(
            [h["split"] for h in history], [h["imbalance"] for h in history], change_at,
            args.global_batch)])
    print_report(
        f"Controller settling: 2 ranks, cnn on synthetic, global batch {args.global_batch}, "
        f"adjustment every {args.adjust_every} steps, slowdown schedule '{args.schedule}'. "
        f"Settled means max/min compute time <= {SETTLED}; 'moved' is the share of the "
        f"global batch that changes rank per adjustment once settled.",
        ["controller", "adjustments to settle", "to settle after the change",
         "moved per adjustment when settled", "median imbalance"], rows)


if __name__ == "__main__":
    main()
