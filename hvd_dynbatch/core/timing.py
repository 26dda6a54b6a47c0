"""This rank's compute time per step, smoothed over a window of recent steps."""
from __future__ import annotations

import math
import statistics
import time
from collections import deque


class StepTimer:
    """Times the compute part of each step (data loading to the end of backward).

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

    def reset(self) -> None:
        self._times.clear()
