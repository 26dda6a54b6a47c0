"""Run `hvd-dynbatch train` as a job on this machine and collect what it measured.

The demo and the benchmark scripts are built from this: a job is a list of `train` options,
started as N local ranks, whose metrics file is read back when it ends.
"""
from __future__ import annotations

import statistics
import sys
import tempfile
from pathlib import Path
from typing import Optional, Sequence

from ..core.heterogeneity import CALIBRATION_STEPS
from ..errors import DynBatchError
from ..training.metrics import read_metrics, step_records
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


def standalone_records(factors: Sequence[str], batch: int, options: Sequence[str],
                       phase_steps: int = 10, rounds: int = 3, timeout: float = 3600) -> dict:
    """Each worker alone: for each distinct slowdown factor, the step records of one 1-rank
    job of `options` at batch `batch` that ran at that emulated factor.

    The job's factor cycles through the distinct factors in phases of `phase_steps` steps,
    `rounds` times, after the steps a rank alone calibrates on (`Emulator`). Each phase's
    first two steps are left out: its first follows a step at another factor, and a compute
    after a sleep runs more slowly than one after a compute, while the emulator sizes a
    sleep from the computes that followed sleeps. One job rather than one per factor:
    this machine's speed moved by up to 70% between jobs a minute apart, and two 1-rank jobs
    at factor 1 measured 6-12% apart, so each factor's rate is taken from phases interleaved
    with the others' in one process. `timeout` (seconds) bounds the job; an hour, as the
    benchmarks give their jobs: at 600 s, ResNet-18's measurement at factors 1 and 8 (batch
    32, 2.5 s a step at factor 1 on this machine on 2026-12-02) ran out of time and ended
    `benchmarks/settling.py` with its first schedule's runs done and not reported."""
    if phase_steps < 3 or rounds < 1:
        raise DynBatchError(f"a standalone measurement needs phases of at least 3 steps and "
                            f"1 round, got {phase_steps} and {rounds}")
    distinct = list(dict.fromkeys(str(f) for f in factors))
    phases = distinct * rounds
    starts = [0] + [CALIBRATION_STEPS + i * phase_steps for i in range(1, len(phases))]
    schedule = ";".join(f"{start}:{factor}" for start, factor in zip(starts, phases))
    records = run_training_job(1, [
        *options, "--global-batch", str(batch), "--slowdown", schedule,
        *measuring_run(CALIBRATION_STEPS + len(phases) * phase_steps)], timeout=timeout)
    kept = {f: [] for f in distinct}
    for record in step_records(records):
        phase, into = divmod(record["step"] - CALIBRATION_STEPS, phase_steps)
        if phase >= 0 and into >= 2:
            kept[phases[phase]].append(record)
    return kept


def standalone_rates(factors: Sequence[str], batch: int, options: Sequence[str],
                     phase_steps: int = 10, rounds: int = 3) -> dict:
    """Each worker alone: for each distinct slowdown factor, the samples/s of one worker at
    that emulated factor and batch `batch`, from the median time of its steps in
    `standalone_records`."""
    return {factor: batch / statistics.median(r["step_time"] for r in kept)
            for factor, kept in standalone_records(factors, batch, options, phase_steps,
                                                   rounds).items()}


def ideal_speedup(rates: Sequence[float]) -> float:
    """The most any split can gain over equal batches, from the workers' standalone rates:
    equal batches run at n * min(r_i) (all wait for the slowest), the best split at sum(r_i)."""
    return sum(rates) / (len(rates) * min(rates))
