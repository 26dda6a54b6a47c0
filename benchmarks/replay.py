"""Replay traced dynamic-batching jobs through the controller: what each adjustment saw.

`settling.py --records DIR` (or `hvd-dynbatch train --metrics FILE`) keeps a job's per-step
records. This rebuilds what the ranks gathered at each exchange, each rank's smoothed busy
time (compute and update) and its error from a `StepTimer` fed that rank's steps as
`DynamicBatching` feeds it (restarted at each new split, full steps only, the first
`--untimed-steps` left out), runs a fresh controller with the job's settings on them, and
prints for each job:

- whether every replayed split equals the recorded one (the rebuilt readings are what the
  controller saw only if they do);
- rank 0's batch after each of the first three adjustments, less its steady batch (its
  median over the second half of the first `--phase` steps): where the rule's moves landed;
- for the "model" rule, the fixed cost it holds for each rank after its third adjustment,
  the first that can fit a line to readings given with errors, in ms (after shrinkage, a
  negative fit as 0; nan for a rank with none fitted yet);
- the changes of speed the controller took, as STEP:RANKS (the exchange after step STEP
  found those ranks' speed changed and restarted their readings): a change taken where
  the slowdowns did not change is a noisy window taken for one.

    python benchmarks/replay.py DIR_OR_FILE... [--untimed-steps 2] [--lag 0] [--phase 75]
        [--min-batch 2]
"""
from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path
from typing import NamedTuple, Optional

import numpy as np
from common import print_report

from hvd_dynbatch.core.controller import BatchController, Rule
from hvd_dynbatch.core.timing import (WARMUP_STEPS, StepTimer, exchange_due, hold_end,
                                      hold_steps, holds)
from hvd_dynbatch.training.config import TrainConfig
from hvd_dynbatch.training.metrics import busy_times, read_metrics, step_records


class Replayed(NamedTuple):
    """What a replay found, adjustment by adjustment."""

    readings: list    # (split, every rank's smoothed time, their errors) as the timers read
    replayed: list    # the splits the controller decided from them
    recorded: list    # those the job ran from the step each took effect (None: past its end)
    fixed: Optional[np.ndarray]   # "model"'s fixed costs after the third adjustment
    changes: list     # (step, ranks): the changes of speed the controller took


def replay(records: list, untimed: int, lag: int, min_batch: int) -> Replayed:
    """Replay a job's records: the readings at each adjustment as the ranks' timers read
    them, the splits the controller decides from them, those the job ran from the step each
    decision took effect (`lag` steps after the next one), the fixed costs the "model" rule
    fitted at the third adjustment (None for other rules), and the changes of speed taken,
    with the step of the exchange that took each. The adjustments come at the job's exchanges
    (`core.timing.exchange_due`): every `adjust_every` steps, spaced out while the split
    holds (`holds`, `hold_steps`; runs whose config has no `hold_seconds` predate it and had
    none), and an elastic job's at each commit outside a hold (`hold_end`; jobs before
    e39657a adjusted at every commit, so their replays tell splits they did not make)."""
    config = TrainConfig(**records[-1]["config"])
    hold_seconds = records[-1]["config"].get("hold_seconds", 0.0)
    sync_every = config.commit_every if config.elastic else 0
    steps = step_records(records)
    controller = BatchController(config.controller_config(least_batch=min_batch))
    controller.initial_split(len(steps[0]["batch_sizes"]))
    timers = [StepTimer(config.timing_window, untimed) for _ in steps[0]["batch_sizes"]]
    ran = {r["step"]: r["batch_sizes"] for r in steps}
    readings, replayed, recorded, fixed, changes = [], [], [], None, []
    quiet_until = 0
    for record in steps:
        split = record["batch_sizes"]
        if sum(split) == config.global_batch:
            for timer, seconds in zip(timers, busy_times(record)):
                timer.time_at(split)
                timer.record(seconds)
        done = record["step"] + 1
        if done < quiet_until or not exchange_due(done, config.adjust_every,
                                                  sync_every=sync_every):
            continue
        times, errors = [t.smoothed for t in timers], [t.error for t in timers]
        readings.append((split, times, errors))
        decided = [int(b) for b in controller.update(split, times, errors)]
        replayed.append(decided)
        if controller.changed.any():
            changes.append((done, np.flatnonzero(controller.changed).tolist()))
        recorded.append(ran.get(done + lag))
        quiet_until = 0
        if holds(split, decided, times):
            quiet_until = hold_end(done, hold_steps(config.adjust_every, hold_seconds,
                                                    float(np.max(times))), sync_every)
        if len(replayed) == 3 and controller.config.rule is Rule.MODEL:
            fixed = controller.state.fixed.copy()
    return Replayed(readings, replayed, recorded, fixed, changes)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("paths", nargs="+", help="metrics files, or folders of them")
    parser.add_argument("--untimed-steps", type=int, default=WARMUP_STEPS,
                        help="the steps each rank's timer left out first (0 before 5fd50c8)")
    parser.add_argument("--lag", type=int, default=0,
                        help="the loader's prefetch depth (workers x prefetch factor; 0 "
                             "without loader workers, as the benchmarks run)")
    parser.add_argument("--phase", type=int, default=75,
                        help="steps of the first slowdown phase, for rank 0's steady batch")
    parser.add_argument("--min-batch", type=int, default=2,
                        help="the smallest batch the model trains on (2 with batch norm)")
    args = parser.parse_args()
    files = [f for p in map(Path, args.paths)
             for f in (sorted(p.glob("*.jsonl")) if p.is_dir() else [p])]
    if not files:
        parser.error("no metrics files found")
    rows = []
    for path in files:
        try:
            records = read_metrics(str(path))
        except (OSError, ValueError) as e:
            print(f"{path}: cannot read it as a metrics file ({e}); not replayed",
                  file=sys.stderr)
            continue
        steps = step_records(records)
        if not steps or "config" not in records[-1]:
            print(f"{path}: not the metrics of a finished run (step records, then a summary "
                  f"with its config); not replayed", file=sys.stderr)
            continue
        if len({len(r["batch_sizes"]) for r in steps}) != 1:
            print(f"{path}: the world size changed; not replayed", file=sys.stderr)
            continue
        found = replay(records, args.untimed_steps, args.lag, args.min_batch)
        ran = [(mine, theirs) for mine, theirs in zip(found.replayed, found.recorded) if theirs]
        phase = min(args.phase, len(steps))   # a job shorter than --phase: all of it
        steady = statistics.median(r["batch_sizes"][0] for r in steps[phase // 2:phase])
        rows.append([path.stem, "yes" if all(m == t for m, t in ran) else "no",
                     *("-" if split is None else f"{split[0] - steady:+g}"
                       for split in (found.recorded + [None] * 3)[:3]),
                     "-" if found.fixed is None
                     else "/".join(f"{1e3 * a:.1f}" for a in found.fixed),
                     " ".join(f"{step}:{','.join(map(str, ranks))}"
                              for step, ranks in found.changes) or "-"])
    if not rows:
        sys.exit("none of the files could be replayed")
    print_report("Each job's adjustments replayed through the controller from its records: "
                 "whether the replayed splits are the recorded ones, rank 0's batch after "
                 "each of the first three adjustments less its steady batch, and the fixed "
                 "costs (ms) 'model' holds after its third adjustment, per rank; the "
                 "changes of speed it took, STEP:RANKS.",
                 ["job", "replay matches", "first move", "second move", "third move",
                  "fixed costs", "changes taken"], rows)


if __name__ == "__main__":
    main()
