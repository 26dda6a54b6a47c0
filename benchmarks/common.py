"""Shared by the benchmark scripts: the report, machine facts, time to accuracy (the
steady-state throughput is the library's, `training.metrics`, as the demo uses it too)."""
from __future__ import annotations

import os
import platform
from pathlib import Path

# The host-discovery script of the project's elastic examples, for elastic jobs here.
DISCOVER = str(Path(__file__).resolve().parent.parent / "hostfiles" / "discover_hosts.sh")


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
