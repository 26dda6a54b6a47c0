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

    A step should cost s times the typical cost of its batch on this machine: the median
    per-sample compute (forward plus backward) of the last `memory` steps, each step
    weighing as many as the samples it computed and those over `STALL_RATIO` times the
    fastest of them left out (below), times the batch, plus the median optimizer
    update, which costs the same at any batch (the update before the step, which delays its
    arrival at the allreduce as the compute does). Slowing only the compute left the update
    at full speed: alone, a step whose update took u = 4-7% of it measured f (1 - u) + u
    times, 7-10% under f at factor 4 and 8 (cnn at batch 16, ResNet-18 at 32), and in a job
    the slowed rank's slow update, which real slow hardware has, was missing. The sleep is
    that less this rank's own median compute of the batch and its own median update, so a
    stall (another process, a page fault) lengthens its step once, as it would on slower
    hardware, not s times as a sleep of (s - 1) times the step's own compute made it: in a
    2-rank job a 4x rank's compute at batch 30 then ranged 126-315 ms over 10 steps, and the
    "model" rule, which reads such jumps as changes of speed, did not settle after the
    slowdown moved.

    The typical costs are those of the job's ranks at factor 1, once an exchange has shown
    their steps (`observe`); until then, or if every rank is slowed, they are this rank's
    own: its fastest recent compute per sample and its median update. Its median compute
    lagged behind its warm-up: in a 2-rank job (cnn, synthetic data, 1,4, global batch 256)
    the slowed rank's steps before the first exchange took 2.82, 2.53, 2.24, 1.95 and 2.04
    ms a sample, the unslowed rank's 0.93 and then 0.44-0.48. In 9 such jobs the window
    before the first exchange measured 3.8-5.5 times the unslowed rank, four of them over
    4.5, where a job that kept the even split measured 4.1-4.4 in its later windows; the
    controller's first move is made from that window, and at 5.5 it took the split to
    217/39 against a balanced 205/51. A rank that sleeps computes more slowly than one that
    does not: in 2-rank jobs on 2 cores (cnn, digits, batch 256, factor 8) the slowed rank's
    own compute ran 2-27% over the other rank's, and a sleep of (s - 1) times it carried that
    excess s times, measuring 8.2-10.2x (now 8.0-8.3x). A per-sample compute seen at the
    unslowed ranks' batches is taken to hold at this rank's: for the benchmarked models it
    is flat within this machine's noise (ResNet-18 18.2-19.3 ms a sample at batches 8 to 56,
    the CNN 237-419 us with no trend from 30 to 226), but not at a few samples, where a
    step's fixed costs show, and after the slowdown of a 2-rank job moves from one rank to
    the other the newly unslowed rank runs a few samples for a window: at 5 (ResNet-18,
    global batch 64, 1,8 to 8,1) its steps took 288 ms, 58 ms a sample, where at 57 they
    took 2.08 s, 37 ms a sample. With its steps weighing one each, the slowed rank's next
    window took 9.24 s at 27 samples, 1.16 times 8 x 37 ms a sample; the controller read
    the moving speed as a fixed cost of 2.4 s, and in a replay of those readings it moved
    the slowed rank to 1 sample. Weighed by their samples, a few steps at 5 samples are
    outweighed by the window's others.

    Nor are the typical costs taken from the job's steps before `WARMUP_STEPS`: a process's
    first computes run slowly (below; its very first took 599-2016 us a sample in the five
    jobs below, the second 296-658), and the slowed rank, which takes its typical costs from
    the previous exchange, carried that into the next window, where the unslowed rank had
    sped up. In a 2-rank job (cnn, synthetic data, 1,4, global batch 256) the unslowed rank
    computed steps 1-4 at 0.79 ms a sample and steps 6-9 at 0.64-0.72, the split 205/51 the
    controller chose from the even split's window measured an imbalance of 1.22 (the slowed
    rank the slower) where the times are equal, and it moved the split to 213/43. Since CPU
    ranks keep freed memory (`backend.host_memory`) the warm-up is shorter, and the typical
    costs come from step 2 on: from step 4 on, the first window's typical compute was step 4
    alone, 316-392 us a sample in five jobs (1,4), where the next window's steps took
    298-314 in the three that faulted no fresh memory; in one of them step 4 took 385 and
    the next window 300, and from step 2 on the typical one is 325.

    Nor are the steps that took over `STALL_RATIO` times the fastest per sample of those
    remembered: they paid for something besides their samples, which a slower worker would
    not pay s times. A process whose tensors grow takes fresh memory from the kernel, and
    its first steps at a new size pay for it: one process training the cnn at a 2-rank job's
    batches (128, then 187, 194, 218, ...) faulted 6,000-14,000 pages in 4 of its 5 steps at
    187 and 3 of 5 at 218, which took 642-1359 us a sample against about 300 with no fault.
    On this project's machine a page touched for the first time costs about 9 us (the
    hypervisor takes back memory left free for a few seconds: 128 MiB took 270-350 ms to
    touch after a pause, 10 ms straight after; with huge pages, 13 faults where there were
    6,000, a step cost as much). The slowed rank, sized from such a window, ran the next one
    slow. In five 2-rank jobs (cnn, synthetic data, 1,4, global batch 256) the median of the
    unslowed rank's remembered steps was 497 and 550 us a sample after a window at a new
    size (in two jobs), where the next window's steps took 367 and 387; without the steps
    over 1.5 times the fastest it is 392 and 362. Leaving out instead the steps of a rank
    whose batch grew past its largest kept one early step as the typical one for three
    windows in one job, which then measured 5.3-5.8 times the unslowed rank at factor 4 (its
    step 4, above). A ratio of 1.25 cut the spread of ordinary steps too:
    `benchmarks/emulator_fidelity.py` measured a factor of 4 in a job (cnn, digits, batch
    256) as 3.61 and 8 as 7.24, 6 of its 12 slowed rows more than 4% low; at 1.5 the largest
    miss was -4.0%.

    This rank's own compute, which the sleep leaves out, is its median per sample over its
    recent slowed steps at about the batch it runs now (within a factor of `NEAR_BATCH`),
    and from step `WARMUP_STEPS` on. A sleeping rank's compute per sample grows as its batch
    falls: in a 2-rank job (cnn, synthetic data, 1,4, global batch 256) the slowed rank
    computed 0.46-0.48 ms a sample at 128 and 0.49-0.66 at 71 in the window after the
    controller's first move, and 0.47-1.03 at 50 in the next; its first two steps took 5.9
    and 1.5 ms a sample. A median over all its last 9 steps, those at 128 and the first two
    among them, was off by as much, and in 24 such traced jobs (1,4 and 1,8) the slowed
    rank's window after the first move took 1.046 times the emulator's target (median;
    1.02-1.25), the next 1.014 and the eighth 1.002: the controller read a slow rank slower
    at its smaller batch, a fixed cost that no slow worker has. The first step at a new
    batch is its own median, so it costs its target exactly.

    A rank alone (a 1-rank job, as standalone rates are measured) has no other rank to
    follow, and its own compute once it sleeps is not its compute at full speed: here a step
    after a pause of 45 ms, slept or spun, computed 12-18% more slowly than a step after a
    step (cnn, batch 16), and 1-rank jobs at factor 8 ran 9.2-10.2 times as long a step as
    at factor 1. Its first `calibration` computes therefore run at full speed, back to
    back, and the medians of the last `memory` of them are its typical costs; the steps
    they belong to are `calibrated` and measure nothing emulated (`metrics.steady_steps`
    leaves them out). The first few computes of a process are not typical: against the
    median of its steps from the 13th on (1-rank jobs at factor 1, cnn on synthetic data at
    batch 16 and on digits at 256), the median of its first 9 computes was -4% to +17% off
    (median 5%), that of computes 4 to 12 -1% to +12% (median 1%). In a job the ranks at
    factor 1 pause too, waiting for the slowed one, so the typical compute taken from them
    already carries that cost.

    A rank that an elastic job leaves alone has its typical costs already: `typical` carries
    them from the emulator of the world before, so the rank does not calibrate again (its next
    12 steps would have run at full speed, as no slowed worker does).

    What the medians are taken over must be clean: on 2 ranks sharing 2 cores, a rank
    spinning in Horovod's wait slowed the sleeping rank's compute, and a factor of 4
    measured 5-7x against the rank at factor 1. Ranks of an emulated run therefore wait by
    napping (`backend.weighting.wait_napping`).
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
