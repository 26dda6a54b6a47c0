"""Emulated heterogeneity on one machine: rank i's compute takes s_i times as long.

A rank with factor s sleeps (s - 1) times its compute in each step, so the step costs what it
would on hardware s times slower. A schedule changes the factors at given steps, to emulate
transient interference. On a real cluster nothing is emulated.

The sleep comes after backward, sized from the rank's recent computes (see `Emulator`). Horovod's
hooks have sent the gradients by then, so the other ranks finish that step's allreduce and
start their next step while this rank sleeps; but that next step's allreduce waits for this
rank, so they lead by one step at most and every rank runs at the emulated worker's pace. The
time this rank reports for the step (and gathers, for the controller) includes the sleep.

Spec syntax: "1,1,2,4" (from step 0 on), or "0:1,4;50:4,1;80:1,1" (factors from each step on).
`preset_factors` turns the papers' set-ups into factors: heterogeneity levels "HL4" (the
fastest worker 4 times the slowest) and CPU-core splits "cores:6/6/4/32".
"""
from __future__ import annotations

import bisect
import collections
import math
import statistics
import time
from dataclasses import dataclass
from typing import Callable, Optional

from ..errors import DynBatchError


@dataclass(frozen=True)
class Slowdown:
    """Per-rank slowdown factors over steps; parse with `Slowdown.parse`."""

    starts: tuple    # steps at which each entry begins, ascending, the first 0
    factors: tuple   # one tuple of per-rank factors for each start

    @classmethod
    def parse(cls, spec: str) -> "Slowdown":
        """Read "1,4" or "0:1,4;50:4,1"; raise `DynBatchError` for anything else."""
        starts, factors = [], []
        for part in [p.strip() for p in spec.split(";") if p.strip()]:
            step, _, values = part.rpartition(":")
            try:
                start = int(step) if step else 0
                row = tuple(float(v) for v in values.split(","))
            except ValueError:
                raise DynBatchError(f"cannot read slowdown '{spec}': expected factors like "
                                    f"'1,4' or a schedule like '0:1,4;50:4,1'") from None
            if any(not math.isfinite(f) or f < 1 for f in row):
                raise DynBatchError(f"slowdown factors must be numbers >= 1, got '{values}'")
            starts.append(start)
            factors.append(row)
        if not starts or starts[0] != 0 or starts != sorted(set(starts)):
            raise DynBatchError(f"slowdown schedule '{spec}' must start at step 0 and have "
                                f"increasing steps")
        if len({len(f) for f in factors}) != 1:
            raise DynBatchError(f"every entry of slowdown schedule '{spec}' must list the "
                                f"same number of ranks")
        return cls(tuple(starts), tuple(factors))

    @property
    def world_size(self) -> int:
        return len(self.factors[0])

    def check_world(self, world_size: int, elastic: bool = False) -> None:
        """Raise unless there is a factor for every rank (exactly one each, unless elastic:
        an elastic job's ranks take the first factors of a list that covers its largest size)."""
        if self.world_size < world_size or (self.world_size != world_size and not elastic):
            raise DynBatchError(f"--slowdown lists {self.world_size} factors but the job has "
                                f"{world_size} ranks")

    def factor(self, step: int, rank: int) -> float:
        return self.factors[bisect.bisect_right(self.starts, step) - 1][rank]


def preset_factors(preset: str, ranks: int = 2) -> tuple:
    """Slowdown factors for a named set-up of heterogeneous workers.

    "HL<k>" (heterogeneity level k): `ranks` workers whose speeds are spaced evenly on a log
    scale from the fastest to k times slower; HL1 is a homogeneous cluster.
    "cores:<c1>/<c2>/...": one worker per entry, as fast as its CPU core count (training
    throughput taken as proportional to cores), so factor_i = max(c) / c_i; the set-ups of
    Tyagi & Sharma compare 12/12/12/12 with 6/6/4/32, the same 48 cores split unevenly.
    """
    name = preset.strip()
    try:
        if name.upper().startswith("HL"):
            level = float(name[2:])
            if not math.isfinite(level) or level < 1 or ranks < 1:
                raise ValueError
            return tuple(round(level ** (i / max(ranks - 1, 1)), 3) for i in range(ranks))
        if name.startswith("cores:"):
            cores = [int(c) for c in name[len("cores:"):].split("/")]
            if min(cores) < 1:
                raise ValueError
            return tuple(round(max(cores) / c, 3) for c in cores)
    except ValueError:
        pass
    raise DynBatchError(f"unknown heterogeneity preset '{preset}': expected HL<k> with k >= 1 "
                        f"(e.g. HL4) or cores:<c1>/<c2>/... (e.g. cores:6/6/4/32)")


class Emulator:
    """Sleeps after each compute of one rank as its slowdown factor says.

    The sleep is (s - 1) times this rank's typical compute for the step's batch: the median
    per-sample compute time (forward plus backward, the sleep excluded) of its last `memory`
    steps, this one included, times the batch. A stall of the machine (another process, a
    page fault) then lengthens the step once, as it would on slower hardware, not s times
    as a sleep of (s - 1) times the step's own compute made it: in a 2-rank job a 4x rank's
    compute at batch 30 then ranged 126-315 ms over 10 steps, and the "model" rule, which
    reads such jumps as changes of speed, did not settle after the slowdown moved.

    What the median is taken over must be clean: on 2 ranks sharing 2 cores, a rank spinning
    in Horovod's wait slowed the sleeping rank's compute, the median grew with it, and a
    factor of 4 measured 5-7x against the rank at factor 1. Ranks of an emulated run
    therefore wait by napping (`backend.weighting.wait_napping`).
    """

    def __init__(self, slowdown: Optional[Slowdown], rank: int, memory: int = 9,
                 sleep: Callable[[float], None] = time.sleep):
        self.slowdown, self.rank = slowdown, rank
        self._per_sample = collections.deque(maxlen=memory)
        self._sleep = sleep

    def after_compute(self, step: int, batch: int, compute_seconds: float) -> None:
        """Record that `batch` samples took `compute_seconds` in `step`, then sleep (s - 1)
        times the typical compute of `batch` samples."""
        if self.slowdown is None or batch <= 0 or compute_seconds <= 0:
            return
        self._per_sample.append(compute_seconds / batch)
        factor = self.slowdown.factor(step, self.rank)
        if factor > 1:
            self._sleep((factor - 1.0) * statistics.median(self._per_sample) * batch)
