"""Shared by the benchmark scripts: steady-state figures from a run's metrics, machine facts."""
from __future__ import annotations

import os
import platform
import statistics

from hvd_dynbatch.training.metrics import step_records


def steady_steps(records: list, skip_fraction: float = 0.25) -> list:
    """The step records after the first `skip_fraction` of the run, which hold start-up
    costs and, under dynamic batching, the even split the controller starts from."""
    steps = step_records(records)
    return steps[int(len(steps) * skip_fraction):]


def steady_throughput(records: list, skip_fraction: float = 0.25) -> float:
    """Samples per second of a typical step of the steady state (`steady_steps`).

    The median step time is used because this shared machine stalls a process now and then,
    and one stall would dominate a mean over a few dozen steps.
    """
    kept = steady_steps(records, skip_fraction)
    batch = statistics.median(r["global_batch"] for r in kept)
    return batch / statistics.median(r["step_time"] for r in kept)


def print_report(description: str, headers: list, rows: list) -> None:
    """A benchmark's report on stdout: what was run, on what machine, and its table."""
    from hvd_dynbatch.tools.report import markdown_table

    print(description)
    print(f"Machine: {machine()}")
    print()
    print(markdown_table(headers, rows))


def machine() -> str:
    """One line that says what the figures were measured on."""
    return (f"{platform.node()}: {os.cpu_count()} cores, {platform.machine()}, "
            f"Python {platform.python_version()}, {platform.platform(terse=True)}")


def time_to_accuracy(records: list, target: float):
    """Training seconds at the first evaluation that reached `target`, or None."""
    for r in records:
        if r.get("type") == "eval" and r["accuracy"] >= target:
            return r["time"]
    return None
