"""How fast and how steadily each controller rule balances real ranks.

Two ranks train with dynamic batching from an even split; the emulated slowdown moves from one
rank to the other mid-run. For each adjustment window (the steps between two timing exchanges,
over which the split is fixed; the jobs run with `--hold-seconds 0`, so that each window of
`--adjust-every` steps is one) it takes each rank's median busy time (compute and update, what
the controller balances) and the imbalance max/min of those. It reports the adjustments needed
to reach imbalance <= 1.10 from the start and after the change, and how much of the global
batch changes hands per adjustment once settled, and the efficiency: the steady throughput over
the sum of the two workers' standalone rates at B/2 (measured before and after the runs, as
this machine's speed drifts), and rank 0's steady batch in each phase (its median over the
phase's second half), to show whether the rules hold the same split, and after how many
adjustments its batch holds within 2% of B of it: the rule's own settling, which the imbalance
of a 5-step window, noisy on a shared machine, can hide.

It also reports the balance: in each window, the step time the ranks' throughputs at their
batches would allow over the slowest rank's busy time, its median over the steady windows.
Read within a window, it leaves out the drift of this machine's speed from job to job, which
moves a rule's efficiency by up to 13 points between repeats (`RESULTS.md`, Settling), and so
shows what the controller itself gains or loses; a table pairs each rule's runs with the first
rule's of the same repeat.

The same schedule runs in the cluster model (`hvd_dynbatch.core.simulator`) with matching
rates and noise, as a noise-controlled reference, and a last table runs it over many seeds with
drift: each worker's speed also takes a lognormal factor drawn afresh each window, as this
machine's windows move by 10-20% where the steps within one move by 2-5%. It reports the share
of seeds settled (noise-free max/min <= 1.10 at the split) within 3 adjustments from even and
after the change, the mean noise-free efficiency from the fourth window on, and the seeds in
which a worker's batch fell to 3 samples or fewer, which no balanced split of these schedules
comes near.

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
    """(split, imbalance, balance) for each adjustment window of a run: balance is
    B / (max_i t_i * sum_i b_i / t_i), the step time the ranks' throughputs at their batches
    b_i would allow over the slowest rank's busy time t_i, 1 when the busy times are equal."""
    steps = step_records(records)
    out = []
    for start in range(0, len(steps) - adjust_every + 1, adjust_every):
        chunk = steps[start:start + adjust_every]
        split = chunk[0]["batch_sizes"]
        times = [statistics.median(busy_times(r)[i] for r in chunk) for i in range(len(split))]
        balance = sum(split) / (max(times) * sum(b / t for b, t in zip(split, times)))
        out.append((split, max(times) / min(times), balance))
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


def paired(first: list, other: list) -> str:
    """`other` less `first`, run by run: the mean difference with its standard error, and in
    how many pairs `other` matched or beat `first`."""
    diffs = np.subtract(other, first)
    error = diffs.std(ddof=1) / np.sqrt(len(diffs)) if len(diffs) > 1 else np.nan
    return f"{diffs.mean():+.1%} (+-{error:.1%}), {int((diffs >= 0).sum())} of {len(diffs)}"


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
    slowdowns = [Slowdown.parse(schedule) for schedule in args.schedules]
    if any(len(slowdown.starts) < 2 for slowdown in slowdowns):
        parser.error("each of --schedules must change the factors at least once, as "
                     "'0:1,4;75:4,1' does: settling is measured from even and after a change")
    rules = [Rule(r) for r in args.rules]
    rows, pair_rows, drift_rows = [], [], []
    for schedule, slowdown in zip(args.schedules, slowdowns):
        change_at = slowdown.starts[1] // args.adjust_every
        for model in args.models:
            options = ["--model", model, "--dataset", "synthetic"]
            factors = [f"{f:g}" for f in slowdown.factors[0]]
            runs = {rule: [] for rule in rules}
            measured = {rule: [] for rule in rules}  # (efficiency, balance) of each run
            limits = [standalone_limit(factors, args.global_batch // 2, options)]
            for repeat in range(args.repeats):
                jobs = []
                for rule in rules if repeat % 2 == 0 else rules[::-1]:
                    records = run_training_job(2, [
                        *options, "--global-batch", str(args.global_batch),
                        *measuring_run(args.steps),
                        "--adjust-every", str(args.adjust_every), "--hold-seconds", "0",
                        "--batching", "dynamic",
                        "--controller", rule.value, "--slowdown", schedule], timeout=3600)
                    jobs.append((rule, records))
                    if args.records:
                        keep_records(args.records, records, schedule, model, rule, repeat)
                limits.append(standalone_limit(factors, args.global_batch // 2, options))
                limit = statistics.mean(limits[-2:])
                for rule, records in jobs:
                    splits, imbalances, balances = zip(*windows(records, args.adjust_every))
                    measured[rule].append((steady_throughput(records) / limit,
                                           statistics.median(balances[len(balances) // 4:])))
                    runs[rule].append(
                        [*settle_figures(splits, imbalances, change_at, args.global_batch),
                         f"{limits[-1] / limits[-2]:.2f}",
                         *(f"{x:.1%}" for x in measured[rule][-1])])
                    print(f"{schedule} {model} {rule.value}, repeat {repeat + 1}: imbalance "
                          f"per window {[round(x, 2) for x in imbalances]}, rank 0's batch "
                          f"{[s[0] for s in splits]}", file=sys.stderr)
            rows += [[schedule, f"{model} (real ranks)", rule.value, *joined(runs[rule])]
                     for rule in rules]
            pair_rows += [[schedule, model, f"{rule.value} - {rules[0].value}",
                           *(paired(first, other) for first, other in
                             zip(zip(*measured[rules[0]]), zip(*measured[rule])))]
                          for rule in rules[1:]]
        for rule in rules:
            history = cluster_history(slowdown, change_at, args, rule, seed=1)
            rows.append([schedule, "cluster model, 5% noise", rule.value, *settle_figures(
                [h["split"] for h in history], [h["imbalance"] for h in history], change_at,
                args.global_batch), None, None, None])
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
        f"second sum over the first, how far this machine's speed moved meanwhile. Balance is "
        f"the median over the windows of the last 75% of steps of B / (max_i t_i * sum_i "
        f"b_i / t_i) with each rank's batch b_i and median busy time t_i: the share of the "
        f"ranks' throughput at their batches the split uses, read within each window, so "
        f"that the machine's drift from job to job, which the efficiency carries, cancels. "
        f"Rank 0's steady batch is its median over the second half of each phase; 'holds "
        f"from' counts "
        f"the adjustments after which rank 0's batch stays within {HOLDS:.0%} of B of it to "
        f"the phase's end. {args.repeats} repeat(s): real-rank cells list each run's figure "
        f"in order.",
        ["schedule", "ranks", "rule", "adjustments to settle", "to settle after the change",
         "moved per adjustment when settled", "median imbalance",
         "rank 0's steady batch, before / after", "holds from, before / after",
         "standalone drift", "efficiency", "balance"], rows)
    if pair_rows:
        print()
        print_report(
            f"Each rule against the first listed, run by run (the runs of one repeat are "
            f"paired): the mean difference in efficiency and in balance with its standard "
            f"error over the {args.repeats} pairs, and in how many pairs the rule matched or "
            f"beat the first. The efficiency carries the machine's drift from job "
            f"to job; the balance, read within each window, does not.",
            ["schedule", "model", "rules", "efficiency", "balance"], pair_rows)
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
