"""Emulated heterogeneity on one machine: rank i's steps take s_i times as long.

A rank with factor s sleeps in each step until the step has cost s times the machine's
typical compute and update for it, what it would cost on hardware s times slower. A schedule
changes the factors at given steps, to emulate transient interference. On a real cluster
nothing is emulated.

The sleep comes after backward, sized from the recent computes and optimizer updates of the
ranks at factor 1, or in a 1-rank job from its own first steps at full speed (see `Emulator`):
slower hardware is slower at both. Horovod's hooks have sent the gradients by then, so the
other ranks finish that step's allreduce and start their next step while this rank sleeps; but
that next step's allreduce waits for this rank, so they lead by one step at most and every rank
runs at the emulated worker's pace. The time this rank reports for the step (and gathers, for
the controller) includes the sleep.

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
from typing import Callable, NamedTuple, Optional

from ..errors import DynBatchError
from .timing import WARMUP_STEPS

# How many computes a rank alone runs at full speed to learn its typical compute (`Emulator`).
CALIBRATION_STEPS = 12
# A compute per sample over this many times the fastest of the recent ones paid for something
# besides its samples (fresh memory, a stall), and is not typical (`Emulator`).
STALL_RATIO = 1.5
# A rank's own compute per sample is taken from its recent steps at batches within this
# factor of the one it runs now (`Emulator`).
NEAR_BATCH = 1.25


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


class Typical(NamedTuple):
    """The recent unslowed steps an `Emulator` takes this machine's typical costs from."""

    per_sample: tuple = ()   # seconds of compute (fetch, forward, backward) per sample
    update: tuple = ()       # seconds of the optimizer's update, whatever the batch
    samples: tuple = ()      # the samples each per-sample compute was measured over


def _median(values, default: float) -> float:
    return statistics.median(values) if values else default


def _weighted_median(values, weights, default: float) -> float:
    """The value below which half the total weight lies (the lower one at an exact half)."""
    if not values:
        return default
    pairs = sorted(zip(values, weights))
    half, cumulative = sum(weights) / 2, 0.0
    for value, weight in pairs:
        cumulative += weight
        if cumulative >= half:
            return value
    return pairs[-1][0]


class Emulator:
    """Sleeps after each compute of one rank as its slowdown factor says.

    A step at factor s should cost s times the typical cost of its batch on this machine:
    the typical compute (forward plus backward) per sample times the batch, plus the typical
    optimizer update, which costs the same at any batch. The update is slowed too, as real
    slow hardware's is: left at full speed, factors 4 and 8 measured 7-10% low. The sleep is
    that target less this rank's own typical compute of the batch and its own typical update,
    not (s - 1) times the step's own compute, so a stall (another process, a page fault)
    lengthens the step once, as on slower hardware, and is not multiplied into jumps the
    "model" rule reads as changes of speed.

    The typical costs are those of the job's ranks at factor 1, once an exchange has shown
    their steps (`observe`); until then, or if every rank is slowed, this rank's own (its
    fastest recent compute per sample, its median update). On 2 shared cores a sleeping rank
    computes 2-27% more slowly than one that does not, and its own compute would carry that
    excess s times. Each typical cost is a median over the last `memory` steps:

    * per sample, each step weighing as many as its samples: the benchmarked models' compute
      per sample is flat in the batch except at a few samples, where fixed costs show, and a
      rank just relieved of a slowdown runs a few samples for a window;
    * from step `WARMUP_STEPS` on: a process's first computes run slowly, and the slowed
      rank would carry them into the next window;
    * without steps over `STALL_RATIO` times the fastest per sample: they paid for something
      besides their samples, such as fresh memory from the kernel (about 9 us a page on this
      project's VM), which slower hardware would not pay s times. 1.25 also cut ordinary
      steps (a factor of 4 measured 3.61); at 1.5 every row of
      `benchmarks/emulator_fidelity.py` was within 4%.

    This rank's own compute, which the sleep leaves out, is its median per sample over its
    recent slowed steps at about the batch it runs now (within a factor of `NEAR_BATCH`): a
    sleeping rank's compute per sample grows as its batch falls, and a median over all its
    batches showed the controller a slow rank slower at a smaller batch, a fixed cost that no
    slow worker has. The first step at a new batch is its own median.

    A rank alone (a 1-rank job, as standalone rates are measured) has no rank to follow, and
    once it sleeps its compute is not its compute at full speed (12-18% slower after a pause).
    Its first `calibration` computes therefore run at full speed, back to back, and their
    medians are its typical costs; those steps are `calibrated` and measure nothing emulated
    (`metrics.steady_steps` leaves them out). A rank that an elastic job leaves alone keeps
    the typical costs of the world before (`typical`) and does not calibrate again.

    The ranks of an emulated run wait by napping (`backend.weighting.wait_napping`): on 2
    ranks sharing 2 cores, a rank spinning in Horovod's wait slowed the sleeping rank's
    compute, and a factor of 4 measured 5-7x. The measurements behind these choices are in
    `benchmarks/RESULTS.md`, "Emulator fidelity" and "Settling".
    """

    def __init__(self, slowdown: Optional[Slowdown], rank: int, world_size: int,
                 memory: int = 9, calibration: int = CALIBRATION_STEPS,
                 sleep: Callable[[float], None] = time.sleep, typical: Typical = Typical()):
        self.slowdown, self.rank = slowdown, rank
        self._own = collections.deque(maxlen=memory)
        self._own_update = collections.deque(maxlen=memory)
        self._unslowed = collections.deque(typical.per_sample, maxlen=memory)
        self._unslowed_samples = collections.deque(typical.samples, maxlen=memory)
        self._unslowed_update = collections.deque(typical.update, maxlen=memory)
        self._calibration = calibration if world_size == 1 and not self._unslowed else 0
        self._calibrated = set()
        self._sleep = sleep

    @property
    def typical(self) -> Typical:
        """The recent unslowed costs whose medians are the typical ones, for the emulator of
        this rank in the next world (`typical=`)."""
        return Typical(tuple(self._unslowed), tuple(self._unslowed_update),
                       tuple(self._unslowed_samples))

    def calibrated(self, step: int) -> bool:
        """Whether `step` ran at full speed to calibrate a rank alone (see the class)."""
        return step in self._calibrated

    def observe(self, records) -> None:
        """Take the exchanged steps (`StepRecord`s, the same on every rank): the compute per
        sample and the update of their ranks at factor 1 become the typical ones (an update
        of 0 was not timed), from step `WARMUP_STEPS` on (steps count from 0)."""
        if self.slowdown is None:
            return
        for record in records:
            if record.step < WARMUP_STEPS:
                continue
            unslowed = [(batch, seconds, update) for rank, (batch, seconds, update) in
                        enumerate(zip(record.batch_sizes, record.compute_times,
                                      record.update_times or [0.0] * len(record.batch_sizes)))
                        if batch > 0 and seconds > 0
                        and self.slowdown.factor(record.step, rank) == 1]
            if unslowed:
                samples = sum(batch for batch, _, _ in unslowed)
                self._unslowed.append(sum(seconds for _, seconds, _ in unslowed) / samples)
                self._unslowed_samples.append(samples)
                updates = [update for _, _, update in unslowed if update > 0]
                if updates:
                    self._unslowed_update.append(statistics.median(updates))

    def after_compute(self, step: int, batch: int, compute_seconds: float,
                      update_seconds: float = 0.0) -> None:
        """Record that `batch` samples took `compute_seconds` in `step`, after an update of
        `update_seconds` (0: not timed), then sleep until the step has cost s times the
        typical compute of `batch` samples and the typical update, taking this rank's own
        to be its medians over its recent slowed steps."""
        if self.slowdown is None or batch <= 0 or compute_seconds <= 0:
            return
        if self._calibration:
            self._calibration -= 1
            self._calibrated.add(step)
            self._unslowed.append(compute_seconds / batch)
            self._unslowed_samples.append(batch)
            if update_seconds > 0:
                self._unslowed_update.append(update_seconds)
            return
        factor = self.slowdown.factor(step, self.rank)
        if factor > 1:
            # Only steps that sleep: those at factor 1 ran faster, back to back.
            self._own.append((step, batch, compute_seconds / batch))
            if update_seconds > 0:
                self._own_update.append(update_seconds)
            own = self._own_compute(step, batch)
            own_update = _median(self._own_update, 0.0)
            typical = self._typical_compute(own) * batch \
                + _median(self._unslowed_update, own_update)
            self._sleep(max(0.0, factor * typical - own * batch - own_update))

    def _own_compute(self, step: int, batch: int) -> float:
        """This rank's own compute per sample in `step` at `batch`: the median (before any
        exchange, the fastest) of its recent slowed steps at batches within `NEAR_BATCH` of
        `batch`, from step `WARMUP_STEPS` on, and this one (see the class)."""
        near = [per_sample for at, size, per_sample in self._own
                if at == step or at >= WARMUP_STEPS
                and max(size, batch) <= NEAR_BATCH * min(size, batch)]
        return statistics.median(near) if self._unslowed else min(near)

    def _typical_compute(self, default: float) -> float:
        """The typical compute per sample: the median, each step weighing its samples, of the
        recent unslowed ones within `STALL_RATIO` of the fastest (see the class); `default`
        before any."""
        if not self._unslowed:
            return default
        usual = STALL_RATIO * min(self._unslowed)
        kept = [(value, samples) for value, samples in zip(self._unslowed, self._unslowed_samples)
                if value <= usual]
        return _weighted_median([value for value, _ in kept], [samples for _, samples in kept],
                                default)
