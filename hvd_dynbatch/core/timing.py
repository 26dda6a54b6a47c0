"""This rank's compute time per step, smoothed over a window of recent steps, and how far
that smoothed value can be trusted."""
from __future__ import annotations

import math
import statistics
import time
from collections import deque

import numpy as np

# A process's first steps, which run slowly and are not timed (`StepTimer`, and the emulator's
# typical costs in `core.heterogeneity`).
WARMUP_STEPS = 2
# While the split holds, the timing exchange comes at least this often (seconds of steps) and
# at most this many times `adjust_every` steps apart (`hold_steps`).
HOLD_SECONDS = 0.25
HOLD_FACTOR = 4
# A move of the split from busy times within this ratio (max/min) of each other starts a hold
# too (`holds`): the ratio at which the benchmarks call a split settled.
HOLD_IMBALANCE = 1.1


def hold_steps(adjust_every: int, hold_seconds: float, step_seconds: float) -> int:
    """Steps from an exchange at which the split held to the next exchange: as many as take
    `hold_seconds` at `step_seconds` a step, from `adjust_every` to `HOLD_FACTOR` times it
    (`adjust_every` when the step time is unknown).

    An exchange and the controller cost about the same at any step time (on 2 CPU ranks
    1-1.6 ms under Gloo, 0.8-0.9 ms under MPI, a third or less of it the controller), so on
    10 ms steps every 5 steps they take 2-3% of the training time, and on 1 s steps 0.03%.
    Spacing them while the split holds cuts the first and leaves the second as it is; a
    change of speed while it holds is then seen, and a stop request
    (`DynamicBatching.request_stop`) heard, within `hold_seconds` or `adjust_every` steps,
    whichever is longer. The cap bounds the steps each exchange carries.
    """
    if not (hold_seconds > 0 and step_seconds > 0 and math.isfinite(step_seconds)):
        return adjust_every
    most = HOLD_FACTOR * adjust_every
    return max(math.ceil(min(hold_seconds / step_seconds, most)), adjust_every)


def holds(split, decided, times) -> bool:
    """Whether an exchange that read the ranks' smoothed busy `times` at `split`, and after
    which the controller decided `decided`, starts a hold (`hold_steps`): the controller kept
    the split, or moved it from times within `HOLD_IMBALANCE` of each other.

    Such a move is a touch-up of a settled split. On two CPU ranks the controller makes
    them by a sample or two at a time in some jobs, as their speeds drift, and holds after
    kept splits alone then left those jobs exchanging every `adjust_every` steps: 1.1-2.5% of
    the training time on 7.5 ms steps (`benchmarks/RESULTS.md`, "Overhead"). A hold lasts
    at most `HOLD_SECONDS` of steps, so a touch-up that misses is corrected that much later.
    """
    if tuple(split) == tuple(decided):
        return True
    times = np.asarray(times, dtype=np.float64)
    return bool(np.all(times > 0) and times.max() <= HOLD_IMBALANCE * times.min())


def hold_end(step: int, hold: int, sync_every: int = 0) -> int:
    """The step at which a hold of `hold` steps from `step` ends: `step + hold`, or the last
    of the caller's own exchanges (every `sync_every` steps; 0: none) in between.

    The exchanges a caller makes during a hold gather the steps and leave the controller
    alone; where the hold ends the controller acts again. Ending it at the caller's exchange
    costs no exchange of its own: an elastic job commits (and exchanges) every 10 steps,
    and a hold of 20 steps on 7.5 ms steps then runs the controller at every other commit,
    not at each (on 2 CPU ranks an adjustment of 2 workers took 0.4-0.8 ms in a job, half of
    the exchange's cost, against 0.14 ms in a loop of its own: the step leaves the caches
    cold)."""
    end = step + hold
    if sync_every > 0 and end // sync_every * sync_every > step:
        return end // sync_every * sync_every
    return end


def exchange_due(steps_done: int, adjust_every: int, quiet_until: int = 0,
                 sync_every: int = 0) -> bool:
    """Whether a timing exchange follows the step that makes `steps_done` steps: every
    `adjust_every` steps but none before a hold ends at step `quiet_until` (`hold_steps`),
    and every `sync_every` steps whatever the hold (0: never), where a caller exchanges on a
    cadence of its own (an elastic job's commits)."""
    if sync_every and steps_done % sync_every == 0:
        return True
    return steps_done % adjust_every == 0 and steps_done >= quiet_until


# 1.2533 sigma / sqrt(n) is the standard error of the median of n normal samples, and 1.4826
# times the median absolute deviation estimates sigma.
_MEDIAN_SE, _MAD_SIGMA = 1.2533, 1.4826


def median_error(samples, axis: int = 0):
    """The standard error of the median of `samples` along `axis`, as a fraction of it,
    from their median absolute deviation, so a stalled step moves it no more than it moves
    the median. NaN for fewer than 2 samples. `StepTimer.error` is the same for one window.
    """
    x = np.asarray(samples, dtype=np.float64)
    n = x.shape[axis]
    if n < 2:
        return np.full(np.delete(x.shape, axis), np.nan)[()]
    median = np.median(x, axis=axis)
    spread = _MAD_SIGMA * np.median(np.abs(x - np.expand_dims(median, axis)), axis=axis)
    return _MEDIAN_SE * spread / math.sqrt(n) / median


class StepTimer:
    """Times this rank's part of each step: data loading to the end of backward, with the
    optimizer's update before it (`training.batching` records the two).

    The smoothed value is the median of the last `window` steps, which ignores the odd slow
    step (a page fault, a noisy neighbour) that a mean would chase. `time_at(split)` before
    each step's record restarts the window when the split changes: times taken at the old
    batch say nothing about the new one.

    The first `warmup` durations it is given are left out, and `reset()` does not count them
    again: a process's first steps run slowly (lazy initialisation, caches and allocator
    pools filling) and say little about the ones after. On one machine (2026-12-03) the CNN's
    first step took 599-2016 us a sample and its second 296-658, where later ones took about
    300; over 24 traced 2-rank jobs there (`benchmarks/RESULTS.md`, Settling) the unslowed
    rank's first
    window read 1.07 times its later median (0.85-1.93), 1.01 (0.76-1.55) without its
    first two steps, and the first proportional move from it would have landed 4.7 samples
    from the steady split on average instead of 6.3. Measured side by side on a slower
    machine (24 jobs each, `RESULTS.md`, "The timer leaves out a process's first two
    steps"), the first move landed 3.9 samples from it with the warm-up left out, 4.3 with
    it: there the first window read 1.05 times the later ones (0.87-1.15), 1.06 (0.91-1.22)
    with the warm-up in.
    """

    def __init__(self, window: int = 5, warmup: int = 0):
        if window < 1:
            raise ValueError(f"the timing window must be at least 1 step, got {window}")
        if warmup < 0:
            raise ValueError(f"the warm-up must not be negative, got {warmup} steps")
        self._times = deque(maxlen=window)
        self._started = None
        self._warmup = warmup
        self._split = None

    def start(self) -> None:
        self._started = time.perf_counter()

    def stop(self) -> float:
        """End the step started by `start()`, record it, and return its duration in seconds."""
        if self._started is None:
            raise RuntimeError("StepTimer.stop() called without start()")
        elapsed = time.perf_counter() - self._started
        self._started = None
        self.record(elapsed)
        return elapsed

    def time_at(self, split) -> None:
        """Time the steps that follow at `split` (every rank's batch): a split other than the
        one timed so far restarts the window."""
        if split != self._split:
            self.reset()
            self._split = split

    @property
    def split(self):
        """The split the window was taken at (`time_at`), None after a reset."""
        return self._split

    def record(self, seconds: float) -> None:
        """Record a duration measured elsewhere (left out while warming up)."""
        if self._warmup > 0:
            self._warmup -= 1
        else:
            self._times.append(float(seconds))

    @property
    def smoothed(self) -> float:
        """The median of the recorded window, or NaN before the first step."""
        return statistics.median(self._times) if self._times else math.nan

    @property
    def error(self) -> float:
        """The relative standard error of `smoothed` (`median_error`), NaN before two steps.

        In plain Python: it is read at every exchange, and on a window of a few steps
        NumPy's median costs tens of microseconds (0.3 ms in a job, its caches cold)."""
        n = len(self._times)
        if n < 2:
            return math.nan
        median = statistics.median(self._times)
        spread = _MAD_SIGMA * statistics.median(abs(t - median) for t in self._times)
        return _MEDIAN_SE * spread / math.sqrt(n) / median

    def reset(self) -> None:
        """Forget the window and the split it was taken at (not the warm-up)."""
        self._times.clear()
        self._split = None
