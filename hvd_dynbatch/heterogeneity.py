"""Emulated heterogeneity on one machine: rank i's compute takes s_i times as long.

After each forward/backward a rank with factor s sleeps (s - 1) times the compute it just
measured, so its step costs what it would on hardware s times slower. A schedule changes the
factors at given steps, to emulate transient interference. On a real cluster nothing is
emulated.

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

    def check_world(self, world_size: int) -> None:
        if self.world_size != world_size:
            raise DynBatchError(f"--slowdown lists {self.world_size} factors but the job has "
                                f"{world_size} ranks")

    def factor(self, step: int, rank: int) -> float:
        return self.factors[bisect.bisect_right(self.starts, step) - 1][rank]


def emulate(slowdown: Optional[Slowdown], step: int, rank: int, compute_seconds: float) -> None:
    """Sleep for the rest of what `compute_seconds` of work takes on a rank s times slower."""
    if slowdown is not None:
        extra = (slowdown.factor(step, rank) - 1.0) * compute_seconds
        if extra > 0:
            time.sleep(extra)
