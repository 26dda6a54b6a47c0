"""This rank's compute time per step, smoothed over a window of recent steps, and how far
that smoothed value can be trusted."""
from __future__ import annotations

import math
import statistics
import time
from collections import deque

import numpy as np


def median_error(samples, axis: int = 0):
    """The standard error of the median of `samples` along `axis`, as a fraction of it.

    1.2533 sigma / sqrt(n) is the standard error of the median of n normal samples, and
    1.4826 times the median absolute deviation estimates sigma, so a stalled step moves this
    no more than it moves the median. NaN for fewer than 2 samples.
    """
    x = np.asarray(samples, dtype=np.float64)
    n = x.shape[axis]
    if n < 2:
        return np.full(np.delete(x.shape, axis), np.nan)[()]
    median = np.median(x, axis=axis)
    spread = 1.4826 * np.median(np.abs(x - np.expand_dims(median, axis)), axis=axis)
    return 1.2533 * spread / math.sqrt(n) / median


class StepTimer:
    """Times this rank's part of each step: data loading to the end of backward, with the
    optimizer's update before it (`training.batching` records the two).

    The smoothed value is the median of the last `window` steps, which ignores the odd slow
    step (a page fault, a noisy neighbour) that a mean would chase. Call `reset()` when the
    batch size changes: times taken at the old size say nothing about the new one.
    """

    def __init__(self, window: int = 5):
        if window < 1:
            raise ValueError(f"the timing window must be at least 1 step, got {window}")
        self._times = deque(maxlen=window)
        self._started = None

    def start(self) -> None:
        self._started = time.perf_counter()

    def stop(self) -> float:
        """End the step started by `start()`, record it, and return its duration in seconds."""
        if self._started is None:
            raise RuntimeError("StepTimer.stop() called without start()")
        elapsed = time.perf_counter() - self._started
        self._started = None
        self._times.append(elapsed)
        return elapsed

    def record(self, seconds: float) -> None:
        """Record a duration measured elsewhere."""
        self._times.append(float(seconds))

    @property
    def smoothed(self) -> float:
        """The median of the recorded window, or NaN before the first step."""
        return statistics.median(self._times) if self._times else math.nan

    @property
    def error(self) -> float:
        """The relative standard error of `smoothed` (`median_error`), NaN before two steps."""
        return float(median_error(list(self._times)))

    def reset(self) -> None:
        self._times.clear()
