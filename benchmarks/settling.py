"""How fast and how steadily each controller rule balances real ranks.

Two ranks train with dynamic batching from an even split; the emulated slowdown moves from one
rank to the other mid-run. For each adjustment window (the steps between two timing exchanges,
over which the split is fixed) it takes each rank's median busy time (compute and update, what
the controller balances) and the imbalance max/min of those. It reports the adjustments needed
to reach imbalance <= 1.10 from the start and after the change, and how much of the global
batch changes hands per adjustment once settled, and the efficiency: the steady throughput over
the sum of the two workers' standalone rates at B/2 (measured before and after the runs, as
this machine's speed drifts), and rank 0's steady batch in each phase (its median over the
phase's second half), to show whether the rules hold the same split, and after how many
adjustments its batch holds within 2% of B of it: the rule's own settling, which the imbalance
of a 5-step window, noisy on a shared machine, can hide. The same schedule runs in the cluster
model (`hvd_dynbatch.core.simulator`) with matching rates and noise, as a noise-controlled
reference, and a second table runs it over many seeds with drift: each worker's speed also
takes a lognormal factor drawn afresh each window, as this machine's windows move by 10-20%
where the steps within one move by 2-5%. It reports the share of seeds settled (noise-free
max/min <= 1.10 at the split) within 3 adjustments from even and after the change, the mean
noise-free efficiency from the fourth window on, and the seeds in which a worker's batch fell
to 3 samples or fewer, which no balanced split of these schedules comes near.

With `--repeats N` every real-rank row lists its N runs' figures in order. Each repeat runs the
rules between two standalone measurements (a repeat's last is the next one's first), in the
reverse order from one repeat to the next, so that no rule always runs first.

    python benchmarks/settling.py [--models cnn resnet18] [--schedules "0:1,4;75:4,1"]
        [--steps 150] [--repeats 1] [--drift 0.15] [--seeds 100] [--records DIR]
"""
from __future__ import annotations

import argparse
import sys
import statistics
from pathlib import Path

import numpy as np
from common import print_report

from hvd_dynbatch.core.controller import BatchController, ControllerConfig, Rule
from hvd_dynbatch.core.heterogeneity import Slowdown
from hvd_dynbatch.core.simulator import ClusterModel, run_adjustments
from hvd_dynbatch.tools.jobs import measuring_run, run_training_job, standalone_rates
from hvd_dynbatch.training.metrics import (MetricsWriter, busy_times, steady_throughput,
                                           step_records)

SETTLED = 1.10
# A split holds once rank 0's batch stays within this share of B of its steady value.
HOLDS = 0.02
# The drift table: settled within this many adjustments; a batch this small is a fall.
WITHIN, FALLEN = 3, 3


def windows(records: list, adjust_every: int) -> list:
    """(split, imbalance) for each adjustment window of a run."""
    steps = step_records(records)
    out = []
    for start in range(0, len(steps) - adjust_every + 1, adjust_every):
        chunk = steps[start:start + adjust_every]
        times = [statistics.median(busy_times(r)[i] for r in chunk)
                 for i in range(len(chunk[0]["batch_sizes"]))]
        out.append((chunk[0]["batch_sizes"], max(times) / min(times)))
    return out


def settle_figures(splits: list, imbalances: list, change_at: int, global_batch: int) -> list:
    """Adjustments to settle from the start and after the change; movement once settled;
    the median imbalance; rank 0's steady batch before / after the change, and the
    adjustments after which its batch holds there (within `HOLDS` of B to the phase's end:
    the rule's own settling, which a window's timing noise does not move)."""
    def first_settled(start, stop):
        for k in range(start, stop):
            if imbalances[k] <= SETTLED:
                return k - start
        return None

    def holds_from(start, stop, steady):
        for k in range(start, stop):
            if all(abs(s[0] - steady) <= HOLDS * global_batch for s in splits[k:stop]):
                return k - start
        return None

    to_settle = first_settled(0, change_at)
    after_change = first_settled(change_at, len(imbalances))
    moves = [np.abs(np.subtract(splits[k + 1], splits[k])).sum() / (2 * global_batch)
             for k in range(len(splits) - 1)]
    settled_moves = [m for k, m in enumerate(moves)
                     if to_settle is not None and to_settle + 2 <= k < change_at - 1
                     or after_change is not None and change_at + after_change + 2 <= k]
    phases = ((0, change_at), (change_at, len(splits)))
    steady = [statistics.median(s[0] for s in splits[(start + stop) // 2:stop])
              for start, stop in phases]
    holds = [holds_from(start, stop, batch) for (start, stop), batch in zip(phases, steady)]
    return [to_settle, after_change,
            f"{statistics.mean(settled_moves):.2%}" if settled_moves else None,
            f"{statistics.median(imbalances):.2f}", "/".join(f"{b:g}" for b in steady),
            "/".join("-" if k is None else str(k) for k in holds)]


def cluster_history(slowdown: Slowdown, change_at: int, args, rule: Rule, seed: int,
                    drift: float = 0.0) -> list:
    """`run_adjustments` of `rule` on 2 workers of the cluster model that follow `slowdown`
    (1000 samples/s over each factor), 2 ms of fixed cost and 5% noise per step."""
    cluster = ClusterModel(
        1000.0 / np.asarray(slowdown.factors[0]), overhead=0.002, noise=0.05, seed=seed,
        steps=args.adjust_every, drift=drift,
        rate_changes={change_at: 1000.0 / np.asarray(slowdown.factors[1])})
    return run_adjustments(BatchController(ControllerConfig(args.global_batch, rule=rule)),
                           cluster, args.steps // args.adjust_every)


def drift_row(slowdown: Slowdown, change_at: int, args, rule: Rule) -> list:
    """The drift table's figures of one rule over `args.seeds` seeds (see the module)."""
    within, after, efficiency, fallen = [], [], [], 0
    for seed in range(args.seeds):
        history = cluster_history(slowdown, change_at, args, rule, seed, args.drift)
        settle = settle_figures([h["split"] for h in history],
                                [h["imbalance"] for h in history], change_at, args.global_batch)
        within.append(settle[0] is not None and settle[0] <= WITHIN)
        after.append(settle[1] is not None and settle[1] <= WITHIN)
        efficiency.append(statistics.mean(h["noise_free_efficiency"] for h in history[3:]))
        fallen += any(min(h["split"]) <= FALLEN for h in history)
    return [f"{statistics.mean(within):.0%}", f"{statistics.mean(after):.0%}",
            f"{statistics.mean(efficiency):.1%}", fallen]


def standalone_limit(factors: list, batch: int, options: list) -> float:
    """The sum of the workers' standalone rates at `batch` (samples/s), measured now."""
    rates = standalone_rates(factors, batch, options)
    return sum(rates[f] for f in factors)


def joined(runs: list) -> list:
    """One table row's cells from several runs' cells: each column's values in run order."""
    return [", ".join("-" if v is None else str(v) for v in column) for column in zip(*runs)]


def keep_records(directory: str, records: list, schedule: str, model: str, rule: Rule,
                 repeat: int) -> None:
    """Write one job's metrics records to `directory` as the train command's `--metrics`
    file (`read_metrics` reads it back), under a name that says which job."""
    name = "_".join([schedule.replace(":", "-").replace(";", "+"), model, rule.value,
                     str(repeat + 1)])
    writer = MetricsWriter(str(Path(directory) / f"{name}.jsonl"))
    for record in records:
        writer.write(record)
    writer.close()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--adjust-every", type=int, default=5)
    parser.add_argument("--schedules", nargs="+", default=["0:1,4;75:4,1"])
    parser.add_argument("--models", nargs="+", default=["cnn"])
    parser.add_argument("--global-batch", type=int, default=256)
    parser.add_argument("--rules", nargs="+", default=[r.value for r in Rule],
                        choices=[r.value for r in Rule])
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--drift", type=float, default=0.15)
    parser.add_argument("--seeds", type=int, default=100)
    parser.add_argument("--records", metavar="DIR",
                        help="also write each real-rank job's per-step records to DIR as "
                             "metrics files (SCHEDULE_MODEL_RULE_REPEAT.jsonl), to trace a "
                             "window that missed")
    args = parser.parse_args()
    if args.repeats < 1 or args.seeds < 1 or args.drift < 0:
        parser.error("--repeats and --seeds must be at least 1, --drift not negative")
    rules = [Rule(r) for r in args.rules]
    rows, drift_rows = [], []
    for schedule in args.schedules:
        slowdown = Slowdown.parse(schedule)
        change_at = slowdown.starts[1] // args.adjust_every
        for model in args.models:
            options = ["--model", model, "--dataset", "synthetic"]
            factors = [f"{f:g}" for f in slowdown.factors[0]]
            runs = {rule: [] for rule in rules}
            limits = [standalone_limit(factors, args.global_batch // 2, options)]
            for repeat in range(args.repeats):
                jobs = []
                for rule in rules if repeat % 2 == 0 else rules[::-1]:
                    records = run_training_job(2, [
                        *options, "--global-batch", str(args.global_batch),
                        *measuring_run(args.steps),
                        "--adjust-every", str(args.adjust_every), "--batching", "dynamic",
                        "--controller", rule.value, "--slowdown", schedule], timeout=3600)
                    jobs.append((rule, records))
                    if args.records:
                        keep_records(args.records, records, schedule, model, rule, repeat)
                limits.append(standalone_limit(factors, args.global_batch // 2, options))
                limit = statistics.mean(limits[-2:])
                for rule, records in jobs:
                    splits, imbalances = zip(*windows(records, args.adjust_every))
                    runs[rule].append(
                        [*settle_figures(splits, imbalances, change_at, args.global_batch),
                         f"{limits[-1] / limits[-2]:.2f}",
                         f"{steady_throughput(records) / limit:.0%}"])
                    print(f"{schedule} {model} {rule.value}, repeat {repeat + 1}: imbalance "
                          f"per window {[round(x, 2) for x in imbalances]}, rank 0's batch "
                          f"{[s[0] for s in splits]}", file=sys.stderr)
            rows += [[schedule, f"{model} (real ranks)", rule.value, *joined(runs[rule])]
                     for rule in rules]
        for rule in rules:
            history = cluster_history(slowdown, change_at, args, rule, seed=1)
            rows.append([schedule, "cluster model, 5% noise", rule.value, *settle_figures(
                [h["split"] for h in history], [h["imbalance"] for h in history], change_at,
                args.global_batch), None, None])
            drift_rows.append([schedule, rule.value, *drift_row(slowdown, change_at, args,
                                                                  rule)])
    print_report(
        f"Controller settling: 2 ranks on synthetic data, global batch {args.global_batch}, "
        f"{args.steps} steps, adjustment every {args.adjust_every} steps, from an even split; "
        f"the slowdown schedule moves the slow worker at the given step. Settled means "
        f"max/min busy time (compute and update) <= {SETTLED}; 'moved' is the share of the "
        f"global batch that changes rank per adjustment once settled; efficiency = steady "
        f"throughput (median step time of the last 75% of steps) / the sum of the workers' "
        f"standalone rates at B/2, the mean of that sum measured (in one 1-rank job of "
        f"interleaved phases) before and after the repeat's runs; 'standalone drift' is the "
        f"second sum over the first, how far this machine's speed moved meanwhile. Rank 0's "
        f"steady batch is its median over the second half of each phase; 'holds from' counts "
        f"the adjustments after which rank 0's batch stays within {HOLDS:.0%} of B of it to "
        f"the phase's end. {args.repeats} repeat(s): real-rank cells list each run's figure "
        f"in order.",
        ["schedule", "ranks", "rule", "adjustments to settle", "to settle after the change",
         "moved per adjustment when settled", "median imbalance",
         "rank 0's steady batch, before / after", "holds from, before / after",
         "standalone drift", "efficiency"], rows)
    print()
    print_report(
        f"The same schedules in the cluster model (2 workers, 1000 samples/s over each factor, "
        f"2 ms fixed cost, 5% noise per step) with drift {args.drift}: each worker's speed "
        f"also takes a factor exp({args.drift} N(0, 1)) drawn afresh each window, {args.seeds} "
        f"seeds. Settled: noise-free max/min <= {SETTLED} at the split within {WITHIN} "
        f"adjustments; efficiency: the mean noise-free efficiency from the fourth window on; "
        f"fell: the seeds in which a worker's batch fell to {FALLEN} samples or fewer.",
        ["schedule", "rule", f"settled within {WITHIN} from even",
         f"within {WITHIN} after the change", "efficiency", "fell"], drift_rows)


if __name__ == "__main__":
    main()
