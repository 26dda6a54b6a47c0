"""The scale study behind `hvd-dynbatch simulate`: the controller on simulated clusters of
many sizes, reported as Markdown tables.

For each worker count and rule it runs one `Scenario` (same rates distribution, noise,
allreduce and event schedule, the global batch scaled with the worker count) and reports how
many adjustments the split needs to reach the target efficiency, the efficiency it then holds,
the static (even) split's efficiency for comparison, and the controller's compute time per
adjustment. Events get a second table: the same figures for each segment after an event.
"""
from __future__ import annotations

import dataclasses
from typing import Callable, Iterable, Sequence

from ..core.controller import Rule
from ..core.simulator import Scenario, simulate
from .report import markdown_table


def scale_study(base: Scenario, worker_counts: Sequence[int], rules: Sequence[Rule],
                target: float, progress: Callable[[Iterable], Iterable] = iter) -> str:
    """Markdown tables of `simulate` over `worker_counts` x `rules`, `base` giving the rest.

    `progress` wraps the iterable of runs (for a progress bar).
    """
    scenarios = [dataclasses.replace(base, workers=n) for n in worker_counts]
    runs = [(scenario, Rule(rule)) for scenario in scenarios for rule in rules]
    rows, event_rows = [], []
    for scenario, rule in progress(runs):
        workers = scenario.workers
        result = simulate(scenario, rule, target)
        first, *after_events = result["segments"]
        allreduce_ms = scenario.allreduce.seconds(workers) * 1e3
        rows.append([workers, rule.value, first["settle"], _pct(first["noise_free_efficiency"]),
                     _pct(first["efficiency"]), _pct(first["static_efficiency"]),
                     f"{first['efficiency'] / first['static_efficiency']:.2f}x",
                     f"{allreduce_ms:.2f}", f"{result['controller_seconds'] * 1e3:.3f}",
                     f"{result['controller_seconds_max'] * 1e3:.3f}"])
        for segment in after_events:
            event_rows.append([workers, rule.value, _events_at(base, segment["start"]),
                               segment["workers"],
                               segment["settle"], _pct(segment["noise_free_efficiency"]),
                               _pct(segment["efficiency"]), _pct(segment["static_efficiency"])])
    tables = [describe(base, target), markdown_table(
        ["workers", "rule", f"adjustments to >= {target:.0%}", "efficiency (noise-free)",
         "efficiency (with noise)", "static efficiency", "speedup over static",
         "allreduce ms", "controller ms (median)", "controller ms (max)"], rows)]
    if event_rows:
        tables.append(markdown_table(
            ["workers", "rule", "event", "workers after", f"adjustments to >= {target:.0%}",
             "efficiency (noise-free)", "efficiency (with noise)", "static efficiency"],
            event_rows))
    return "\n\n".join(tables)


def describe(scenario: Scenario, target: float) -> str:
    """What was simulated and what the columns mean, in a paragraph."""
    ring = scenario.allreduce
    return (
        f"Simulated clusters: worker rates {scenario.distribution.value} with spread "
        f"{scenario.spread:g}x, {scenario.noise:.0%} noise per step, "
        f"{f'speed drift {scenario.drift:g} (log sd per window), ' if scenario.drift else ''}"
        f"{scenario.steps} steps per "
        f"adjustment (the controller sees each worker's median), {scenario.adjustments} "
        f"adjustments, global batch {scenario.batch_per_worker} x workers, per-step overhead "
        f"{scenario.overhead:g} s, ring allreduce of {ring.gradient_bytes / 1e6:g} MB at "
        f"{ring.bandwidth * 8 / 1e9:g} Gbit/s and {ring.latency * 1e6:g} us per message, seed "
        f"{scenario.seed}. Efficiency = throughput at the split / throughput at the ideal "
        f"split: 'noise-free' from expected step times, 'with noise' from the same noise "
        f"draws for both; the static split is even. 'Adjustments to >= {target:.0%}' counts "
        f"adjustments until every later window's noise-free efficiency is at least that "
        f"('-': never); efficiencies are medians from then on. Controller ms: one "
        f"BatchController.update on this machine.")


def _events_at(scenario: Scenario, start: int) -> str:
    """A label for the events that begin the segment at adjustment `start`."""
    labels = [f"{e.kind.value} {e.fraction:g}" + (f" x{e.factor:g}" if e.factor != 1 else "")
              for e in scenario.events if e.at == start]
    return f"at {start}: " + ", ".join(labels)


def _pct(value: float) -> str:
    return f"{value:.1%}"
