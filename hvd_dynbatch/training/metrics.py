"""Metrics as JSON lines: one record per step, then one `"type": "summary"` record.

Only rank 0 writes. Records are flushed as they are written, so a run that dies leaves every
step it reported.
"""
from __future__ import annotations

import json
import math
import os
import statistics
from pathlib import Path
from typing import Optional

from ..errors import DynBatchError
from .files import replaced_atomically


def _plain(value):
    """JSON has no NaN or infinity: write them as null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


class MetricsWriter:
    """Writes records to a JSON-lines file; a writer without a path writes nothing.

    In an elastic job the rank that writes can change: `set_path` hands the file to this
    process (appending, when the job has written before) or takes it away.
    """

    def __init__(self, path: Optional[str], append: bool = False):
        self._file, self._path = None, None
        self.set_path(path, append)

    def set_path(self, path: Optional[str], append: bool = False) -> None:
        if path == self._path and self._file is not None:
            return
        self.close()
        if path:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            self._file = open(path, "a" if append else "w", encoding="utf-8")
            self._path = path

    def write(self, record: dict) -> None:
        if self._file is not None:
            self._file.write(json.dumps(_plain(record)) + "\n")
            self._file.flush()

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
        self._file, self._path = None, None


class SampleLog:
    """An audit of which samples this process trained on: one JSON line per step.

    Each process appends to its own file in `directory` (named by host and process id, as
    ranks are renumbered when an elastic job changes). A record holds the world generation,
    the step, the epoch and offset, the rank and its sample indices; a step redone after a
    reset appears again with a later generation, and the latest one is what counted.
    """

    def __init__(self, directory: Optional[str]):
        self._file = None
        if directory:
            import socket

            try:
                Path(directory).mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise DynBatchError(f"--sample-log {directory}: cannot create it "
                                    f"({exc.strerror})") from None
            # Horovod tells each worker the host name it was placed on.
            host = os.environ.get("HOROVOD_HOSTNAME", socket.gethostname())
            name = f"{host}-{os.getpid()}.jsonl"
            self._file = open(Path(directory) / name, "a", encoding="utf-8")

    def write(self, generation: int, step: int, plan, rank: int) -> None:
        if self._file is not None:
            self._file.write(json.dumps({
                "generation": generation, "step": step, "epoch": plan.epoch,
                "offset": plan.offset, "rank": rank,
                "indices": [int(i) for i in plan.indices]}) + "\n")
            self._file.flush()


def read_metrics(path: str) -> list:
    """All records of a metrics file, in order."""
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def step_records(records: list) -> list:
    """The per-step records of a run's metrics (those with every rank's batch size)."""
    return [r for r in records if "batch_sizes" in r]


def busy_times(record: dict) -> list:
    """Each rank's busy seconds in a step record: its compute and the update before it, what
    the controller balances (the compute alone in a file written before updates were timed)."""
    updates = record.get("update_times") or [0.0] * len(record["compute_times"])
    return [c + u for c, u in zip(record["compute_times"], updates)]


def steady_steps(records: list, skip_fraction: float = 0.25) -> list:
    """The step records after the first `skip_fraction` of the run, which hold start-up
    costs and, under dynamic batching, the even split the controller starts from; without
    the steps that ran at full speed to calibrate an emulated slowdown (`Emulator`)."""
    steps = step_records(records)
    return [r for r in steps[int(len(steps) * skip_fraction):]
            if not r.get("emulator_calibration")]


def steady_throughput(records: list, skip_fraction: float = 0.25) -> float:
    """Samples per second of a typical step of the steady state (`steady_steps`).

    The median step time is used because a shared machine stalls a process now and then,
    and one stall would dominate a mean over a few dozen steps.
    """
    kept = steady_steps(records, skip_fraction)
    if not kept:
        raise DynBatchError("the run recorded no steps to measure a throughput from")
    batch = statistics.median(r["global_batch"] for r in kept)
    return batch / statistics.median(r["step_time"] for r in kept)


def first_move(records: list) -> Optional[int]:
    """The first step a run trained at an uneven split (two ranks' batches more than one
    sample apart): under dynamic batching, where the controller's first move took effect.
    None if every step ran at equal batches."""
    return next((r["step"] for r in step_records(records)
                 if max(r["batch_sizes"]) - min(r["batch_sizes"]) > 1), None)


def clock_before(records: list, step: int) -> float:
    """A run's training clock (its steps and exchanges) when `step` started: the time of
    the last step recorded before it, 0 at the start. For a run whose steps were recorded
    once each (no elastic reset)."""
    before = [r["time"] for r in step_records(records) if r["step"] < step]
    return before[-1] if before else 0.0


def throughput_from(records: list, step: int) -> float:
    """Samples per second of a run's steps from `step` on, by its training clock, as the
    summary's `samples_per_sec` counts them (`clock_before`)."""
    after = [r for r in step_records(records) if r["step"] >= step]
    if not after:
        raise DynBatchError(f"the run recorded no steps from step {step} on")
    seconds = after[-1]["time"] - clock_before(records, step)
    return sum(r["global_batch"] for r in after) / seconds


def truncate_metrics(path: str, step: int) -> None:
    """Keep what a run resumed at `step` has already done: the records of steps before
    `step` and of events (evaluations, resets) at it or before; drop the rest and the
    summary. Rewritten atomically; a missing file stays missing."""
    try:
        records = read_metrics(path)
    except FileNotFoundError:
        return
    kept = [r for r in records if r.get("type") != "summary" and
            (r["step"] < step if "batch_sizes" in r else r.get("step", 0) <= step)]
    with replaced_atomically(path) as f:
        f.write("".join(json.dumps(r) + "\n" for r in kept).encode("utf-8"))
