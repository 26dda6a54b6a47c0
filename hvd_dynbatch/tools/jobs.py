"""Run `hvd-dynbatch train` as a job on this machine and collect what it measured.

The demo and the benchmark scripts are built from this: a job is a list of `train` options,
started as N local ranks, whose metrics file is read back when it ends.
"""
from __future__ import annotations

import sys
import tempfile
from pathlib import Path
from typing import Optional, Sequence

from ..errors import DynBatchError
from ..training.metrics import read_metrics, steady_throughput
from .launch import Launcher, run_local


def run_training_job(np: int, options: Sequence[str], *, launcher: Launcher = Launcher.GLOO,
                     timeout: float = 600, workdir: Optional[str] = None, **launch) -> list:
    """Run `hvd-dynbatch train OPTIONS` on `np` local ranks; return its metrics records.

    `launch` goes to `launch.run_local` (an elastic job's discovery script, its bounds, extra
    environment). The last record is the run's summary. Raises `DynBatchError` with the
    job's last output lines if it fails or runs out of time.
    """
    with tempfile.TemporaryDirectory(dir=workdir) as tmp:
        metrics = str(Path(tmp) / "metrics.jsonl")
        argv = [sys.executable, "-m", "hvd_dynbatch", "train", *options,
                "--metrics", metrics, "--no-progress"]
        job = run_local(launcher, np, argv, timeout=timeout, **launch)
        if job.timed_out or job.returncode != 0:
            tail = "\n".join((job.stdout + job.stderr).splitlines()[-15:])
            reason = "ran out of time" if job.timed_out else f"failed (exit {job.returncode})"
            raise DynBatchError(f"training job {' '.join(options)} {reason}:\n{tail}")
        return read_metrics(metrics)


def summary_of(records: list) -> dict:
    """The summary record of a run's metrics."""
    if not records or records[-1].get("type") != "summary":
        raise DynBatchError("the run's metrics end without a summary record")
    return records[-1]


def measuring_run(steps: int) -> list:
    """`train` options for a run that measures: exactly `steps` steps (the epoch limit out of
    reach) and no evaluation on the way."""
    return ["--max-steps", str(steps), "--epochs", "1000", "--eval-every", "100000"]


def standalone_rates(factors: Sequence[str], batch: int, options: Sequence[str],
                     steps: int = 30) -> dict:
    """Each worker alone: for each distinct slowdown factor, the steady samples/s of a 1-rank
    job of `options` at batch `batch` with that emulated factor, over `steps` steps.

    A slowed rank alone runs its first 12 steps at full speed to learn its typical compute
    (`Emulator`); the rate comes from the steps after them in the last 75%."""
    rates = {}
    for factor in factors:
        if factor not in rates:
            rates[factor] = steady_throughput(run_training_job(1, [
                *options, "--global-batch", str(batch), "--slowdown", str(factor),
                *measuring_run(steps)]))
    return rates


def ideal_speedup(rates: Sequence[float]) -> float:
    """The most any split can gain over equal batches, from the workers' standalone rates:
    equal batches run at n * min(r_i) (all wait for the slowest), the best split at sum(r_i)."""
    return sum(rates) / (len(rates) * min(rates))
