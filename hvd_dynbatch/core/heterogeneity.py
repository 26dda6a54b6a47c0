"""Emulated heterogeneity on one machine: rank i's compute takes s_i times as long.

A rank with factor s sleeps (s - 1) times its compute in each step, so the step costs what it
would on hardware s times slower. A schedule changes the factors at given steps, to emulate
transient interference. On a real cluster nothing is emulated.

The sleep comes between forward and backward, not after backward: Horovod's hooks send each
gradient as soon as backward produces it, so after backward the other ranks could already
go on while this rank slept, and the emulated worker would be faster than the one it stands
for. The backward pass has not run at that point, so the sleep is sized from the rank's
recent steps (see `Emulator`).

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
    """Sleeps inside each step of one rank as its slowdown factor says.

    The sleep is (s - 1) times this rank's typical compute for the step's batch: the median
    per-sample compute time (forward plus backward, the sleep excluded) of its last `memory`
    steps, times the batch. Sizing it from the step's own forward pass, times a backward ratio
    read from the step before, made the emulated factor the product of two noisy readings:
    on 2 ranks sharing 2 cores a factor of 4 measured about 6x, and a stall in one forward
    pass became a sleep s - 1 times as long. Until a step has been recorded, the sleep is
    sized from the forward pass, with backward taken as twice the forward.
    """

    def __init__(self, slowdown: Optional[Slowdown], rank: int, memory: int = 9,
                 sleep: Callable[[float], None] = time.sleep):
        self.slowdown, self.rank = slowdown, rank
        self._per_sample = collections.deque(maxlen=memory)
        self._sleep = sleep

    def after_forward(self, step: int, batch: int, forward_seconds: float) -> None:
        """Sleep (s - 1) times the expected compute of `batch` samples."""
        if self.slowdown is None:
            return
        factor = self.slowdown.factor(step, self.rank)
        if factor > 1:
            expected = (statistics.median(self._per_sample) * batch if self._per_sample
                        else 3.0 * forward_seconds)
            self._sleep((factor - 1.0) * expected)

    def after_backward(self, batch: int, compute_seconds: float) -> None:
        """Record that `batch` samples took `compute_seconds` (forward plus backward)."""
        if self.slowdown is not None and batch > 0 and compute_seconds > 0:
            self._per_sample.append(compute_seconds / batch)
