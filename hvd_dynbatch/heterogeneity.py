"""Emulated heterogeneity on one machine: rank i's compute takes s_i times as long.

A rank with factor s sleeps (s - 1) times its compute in each step, so the step costs what it
would on hardware s times slower. A schedule changes the factors at given steps, to emulate
transient interference. On a real cluster nothing is emulated.

The sleep comes between forward and backward, not after backward: Horovod's hooks send each
gradient as soon as backward produces it, so after backward the other ranks could already
go on while this rank slept, and the emulated worker would be faster than the one it stands
for. The backward pass has not run at that point, so its length is estimated from the
previous step's backward-to-forward ratio.

Spec syntax: "1,1,2,4" (from step 0 on), or "0:1,4;50:4,1;80:1,1" (factors from each step on).
"""
from __future__ import annotations

import bisect
import math
import time
from dataclasses import dataclass
from typing import Optional

from .errors import DynBatchError


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


class Emulator:
    """Sleeps inside each step of one rank as its slowdown factor says."""

    def __init__(self, slowdown: Optional[Slowdown], rank: int):
        self.slowdown, self.rank = slowdown, rank
        self._backward_ratio = 2.0  # backward takes about twice the forward pass

    def after_forward(self, step: int, forward_seconds: float) -> None:
        """Sleep (s - 1) times this step's expected compute (forward plus backward)."""
        if self.slowdown is None:
            return
        expected = forward_seconds * (1.0 + self._backward_ratio)
        extra = (self.slowdown.factor(step, self.rank) - 1.0) * expected
        if extra > 0:
            time.sleep(extra)

    def after_backward(self, forward_seconds: float, backward_seconds: float) -> None:
        """Learn the backward-to-forward ratio for the next step's estimate."""
        if forward_seconds > 0:
            self._backward_ratio = backward_seconds / forward_seconds
