"""Test helpers: run the `hvd-dynbatch` command in one process, or a command as N local ranks
under a launcher, and collect what it reported.

Ranks report by printing JSON objects, one per line (see `hvd_dynbatch.tools.launch.json_records`).
"""
from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import torch

from hvd_dynbatch.tools.launch import JobResult, Launcher, json_records, local_env, run_local
from hvd_dynbatch.training.metrics import read_metrics

PYTHON = sys.executable
CLI = [PYTHON, "-m", "hvd_dynbatch"]
# The project's host-discovery script, which elastic jobs here read their hosts through.
DISCOVER = str(Path(__file__).resolve().parent.parent / "hostfiles" / "discover_hosts.sh")


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


def gpu_env() -> dict:
    """The environment entries that give a started process the GPUs this one sees, for a
    test marked `gpu` (the suite's processes see none: see conftest)."""
    return {"CUDA_VISIBLE_DEVICES": os.environ["HVD_DYNBATCH_TEST_GPUS"]}


def run_cli(args, timeout: float = 120, env=None) -> subprocess.CompletedProcess:
    """`hvd-dynbatch ARGS` in one process (Horovod's world of one), its output captured;
    `env` adds to its environment."""
    return subprocess.run([*CLI, *args], env=local_env(extra=env), capture_output=True,
                          text=True, timeout=timeout)


def train_one_process(args, tmp_path, name: str = "run", env=None):
    """`hvd-dynbatch train ARGS` in one process; its saved weights and its metrics records."""
    model, metrics = tmp_path / f"{name}.pt", tmp_path / f"{name}.jsonl"
    out = run_cli(["train", *args, "--no-progress", "--save-model", str(model), "--metrics",
                   str(metrics)], timeout=300, env=env)
    assert out.returncode == 0, out.stderr
    return torch.load(model), read_metrics(str(metrics))


def assert_same_weights(actual: dict, expected: dict, rtol: float = 1e-6,
                        atol: float = 1e-6) -> None:
    """Two state dicts hold the same tensors, name by name, within the tolerances."""
    assert actual.keys() == expected.keys()
    for name, value in expected.items():
        torch.testing.assert_close(actual[name], value, rtol=rtol, atol=atol, msg=name)


def expect_user_error(out: subprocess.CompletedProcess, text: str) -> None:
    """The command failed as a user mistake should: exit 2, every error line saying `text`,
    no traceback."""
    assert out.returncode == 2, out.stderr
    errors = [line for line in out.stderr.splitlines() if "hvd-dynbatch: error:" in line]
    assert errors and all(text in line for line in errors), out.stderr
    assert "Traceback" not in out.stderr


def table_rows(out: str, first: str) -> list:
    """The cells of the rows of the markdown tables in `out` whose first cell is `first`."""
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in out.splitlines()
            if line.startswith("|")]
    return [row for row in rows if row[0] == first]


def run_ranks(launcher: Launcher, np: int, argv, timeout: float = 120, **kwargs) -> Ranks:
    """Run `argv` as `np` local ranks under `launcher`, bounded by `timeout` seconds."""
    job = run_local(launcher, np, list(argv), timeout=timeout, **kwargs)
    return Ranks(job, json_records(job.stdout))
