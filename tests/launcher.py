"""Test helper: run a command as N local ranks under a launcher and collect what each rank said.

Ranks report by printing JSON objects, one per line (see `hvd_dynbatch.launch.json_records`).
"""
from __future__ import annotations

import sys
from dataclasses import dataclass, field

from hvd_dynbatch.launch import JobResult, Launcher, json_records, run_local

PYTHON = sys.executable
CLI = [PYTHON, "-m", "hvd_dynbatch"]


@dataclass
class Ranks:
    """A finished local job and the JSON records its ranks printed."""

    job: JobResult
    records: list = field(default_factory=list)

    @property
    def returncode(self) -> int:
        return self.job.returncode

    def by_rank(self, key: str = "rank") -> dict:
        """Records keyed by the rank each one names (the last record of a rank wins)."""
        return {rec[key]: rec for rec in self.records if key in rec}

    def explain(self) -> str:
        """The job's output, for assertion messages."""
        return (f"exit {self.job.returncode}, timed out: {self.job.timed_out}\n"
                f"--- stdout\n{self.job.stdout[-4000:]}\n--- stderr\n{self.job.stderr[-4000:]}")


def run_ranks(launcher: Launcher, np: int, argv, timeout: float = 120, **kwargs) -> Ranks:
    """Run `argv` as `np` local ranks under `launcher`, bounded by `timeout` seconds."""
    job = run_local(launcher, np, list(argv), timeout=timeout, **kwargs)
    return Ranks(job, json_records(job.stdout))
