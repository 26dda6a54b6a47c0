"""The controller rules on simulated clusters whose steps have fixed costs (issue 14).

A worker's step takes overhead + b / rate seconds; the proportional rules assume time is
proportional to the batch and only creep to the equal-time split, the "model" rule fits each
worker's fixed and per-sample cost. For every overhead, rate spread, worker count and rule,
the cluster model (`hvd_dynbatch.core.simulator`) runs twice: without noise, where a rule's
settling is its own, and with 5% noise per step, where the split also carries the noise of
the timings. Reported: adjustments until every later window holds the target share of the
ideal split's throughput ('-': never within the run), the noise-free efficiency then held
(median), and the controller's time per adjustment. A second table does the same after each
event of a schedule (a tenth of the workers slows down, a quarter leaves, a quarter joins).
A third runs with drift: each worker's speed also takes a lognormal factor drawn afresh each
window, which no rule can foresee; it reports how much of the ideal (mean-speed) split's
throughput each rule's split keeps, under the same draws.
With `--seeds N` every figure is the median over N clusters (rates and noise drawn from seeds
0 to N - 1), as one seed's noise can move a rule's adjustments to the target by several.

    python benchmarks/fixed_costs.py [--target 0.97] [--workers 8,64,256,1024,4096] [--seeds 1]
        [--events "10:slow=0.1@2;20:leave=0.25;30:join=0.25"]
"""
from __future__ import annotations

import argparse
import dataclasses
import statistics

from common import print_report

from hvd_dynbatch.core.controller import Rule
from hvd_dynbatch.core.simulator import Event, Scenario, simulate

OVERHEADS = (0.0, 0.05, 0.2)
SPREADS = (4.0, 8.0)
EVENTS = "10:slow=0.1@2;20:leave=0.25;30:join=0.25"
DRIFTS = (0.1, 0.2)
# Drift runs: efficiencies from this window on, past the start from an even split.
DRIFT_FROM = 5


def settled(segments: list) -> list:
    """The median over seeds of one segment's adjustments to the target (a segment that
    never got there counting as the longest) and of the noise-free efficiency it holds."""
    never = float("inf")
    settle = statistics.median_low(never if s["settle"] is None else s["settle"]
                                   for s in segments)
    held = statistics.median(s["noise_free_efficiency"] for s in segments)
    return [None if settle == never else settle, f"{held:.1%}"]


def quiet_and_noisy(base: Scenario, rule: Rule, target: float, seeds: int) -> tuple:
    """Per seed, `simulate` of `base` without noise and with its own (5%): the segments of
    each (lists over the seeds, one per segment), and the median controller seconds with
    noise."""
    runs = [[simulate(dataclasses.replace(base, noise=noise, seed=seed), rule, target)
             for seed in range(seeds)] for noise in (0.0, base.noise)]
    quiet, noisy = ([list(per_seed) for per_seed in zip(*(r["segments"] for r in run))]
                    for run in runs)
    return quiet, noisy, statistics.median(r["controller_seconds"] for r in runs[1])


def drifting(scenario: Scenario, rule: Rule) -> tuple:
    """The mean efficiency (same draws) and noise-free efficiency of a drift run's windows
    from `DRIFT_FROM` on."""
    history = simulate(scenario, rule)["history"][DRIFT_FROM:]
    return tuple(statistics.mean(h[key] for h in history)
                 for key in ("efficiency", "noise_free_efficiency"))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", type=float, default=0.97)
    parser.add_argument("--workers", default="8,64,256,1024,4096")
    parser.add_argument("--adjustments", type=int, default=30)
    parser.add_argument("--seeds", type=int, default=1)
    parser.add_argument("--events", default=EVENTS,
                        help="the second table's schedule (simulator.Event syntax)")
    args = parser.parse_args()
    if args.seeds < 1:
        parser.error(f"--seeds must be at least 1, got {args.seeds}")
    workers = [int(w) for w in args.workers.split(",")]
    rows, event_rows = [], []
    for overhead in OVERHEADS:
        for spread in SPREADS:
            for n in workers:
                for rule in Rule:
                    base = Scenario(n, spread=spread, overhead=overhead,
                                    adjustments=args.adjustments)
                    quiet, noisy, seconds = quiet_and_noisy(base, rule, args.target,
                                                            args.seeds)
                    rows.append([overhead, f"{spread:g}", n, rule.value, *settled(quiet[0]),
                                 *settled(noisy[0]), f"{seconds * 1e3:.3f}"])
    for n in workers:
        for rule in Rule:
            base = Scenario(n, overhead=0.05, adjustments=40,
                            events=tuple(Event.parse_schedule(args.events)))
            quiet, noisy, _ = quiet_and_noisy(base, rule, args.target, args.seeds)
            for q, s in zip(quiet[1:], noisy[1:]):
                event_rows.append([n, rule.value, f"at {q[0]['start']}", q[0]["workers"],
                                   *settled(q), *settled(s)])
    drift_rows = []
    for drift in DRIFTS:
        for n in workers:
            for rule in Rule:
                held = [drifting(Scenario(n, overhead=0.05, drift=drift, seed=seed), rule)
                        for seed in range(args.seeds)]
                drift_rows.append([drift, n, rule.value,
                                   *(f"{statistics.median(h):.1%}" for h in zip(*held))])
    target = f"{args.target:.0%}"
    seeds = ("seed 0" if args.seeds == 1 else
             f"medians over seeds 0-{args.seeds - 1} (rates and noise drawn from each)")
    print_report(
        f"Controller rules against fixed step costs: simulated clusters, lognormal rates with "
        f"the given spread, per-step overhead (s) the same on every worker, 5 steps per "
        f"adjustment, global batch 64 x workers, ResNet-50-sized ring allreduce, {seeds}, "
        f"{args.adjustments} adjustments. 'to {target}': adjustments until every later "
        f"window's noise-free efficiency (throughput at the split over the ideal split's, "
        f"from expected step times) is at least {target}; 'held': its median from then on "
        f"(over the run when never settled). Controller ms: median BatchController.update "
        f"on this machine (the 5% noise run).",
        ["overhead", "spread", "workers", "rule", f"no noise: to {target}", "no noise: held",
         f"5% noise: to {target}", "5% noise: held", "controller ms"], rows)
    print()
    print_report(
        f"After events ({args.events}): overhead 0.05 s, spread 4, 40 adjustments; the same "
        f"columns per segment after each event (a leave or join restarts from an even split).",
        ["workers", "rule", "event", "workers after", f"no noise: to {target}",
         "no noise: held", f"5% noise: to {target}", "5% noise: held"], event_rows)
    print()
    print_report(
        f"Drift: each worker's speed times exp(drift x N(0, 1)), drawn afresh each window, "
        f"besides 5% noise per step; overhead 0.05 s, spread 4, 30 adjustments, {seeds}. "
        f"Efficiency of each window's split from window {DRIFT_FROM} on (mean): 'same draws' "
        f"against the ideal split of the workers' mean speeds under the same draws (what a "
        f"job would see), 'noise-free' from expected step times.",
        ["drift", "workers", "rule", "efficiency, same draws", "efficiency, noise-free"],
        drift_rows)


if __name__ == "__main__":
    main()
