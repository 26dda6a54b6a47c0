"""ABS-SGD: delayed synchronous SGD with adaptive batch size (Zhou et al. 2023, "ABS-SGD: A
Delayed Synchronous Stochastic Gradient Descent Algorithm with Adaptive Batch Size for
Heterogeneous GPU Clusters").

In the paper every rank computes micro-batches for a compute window of T_k seconds, adding
up the per-sample gradients and counting its samples, so a fast rank simply gets through
more micro-batches. Here a rank computes micro-batches up to its quota for window k, its
share of the target batch at its measured rate, the window's length as a cap (the window rule
below says why). When its window closes, the rank starts an asynchronous Horovod allreduce
(op=Sum) of [gradient sum, loss sum, stop request, and in the rank's own slots its sample
count, compute seconds and reduction time], and begins window k+1 at once, while the
reduction runs. At the
end of window k+1 it waits for reduction k, applies

    w <- SGD step with g_k = (sum over ranks of gradient sums of window k) / N_k,

N_k being the global sample count of window k, and starts the reduction of window k+1. So
every sample weighs the same wherever it was computed, workers do not wait for each other,
and the gradient applied is exactly one window stale (window k+1 is computed on the weights
before g_k is applied; `training/staleness.py` compensates for it). The first window's
gradient is applied after the second window; after the last window the pending gradient is
flushed (waited for and applied), so every window's samples enter exactly one update. All
ranks apply the same reduced gradient to the same weights, so the model stays identical
everywhere.

The window rule (`WindowRule`), from the paper's aim of a global batch near the target B for
which the learning rate was set. A window of T seconds yields N = R * T samples, R being the
sum of the ranks' rates (samples per second of compute), so the window is T = B / R. Each
reduction carries every rank's sample count and compute seconds, so every rank knows every
rank's rate and computes the same window. Each rank's rate estimate follows its readings
with weight `gain` (smoothing the noise of single windows) and jumps to a reading that
moves more than `jump` from it (a real change of speed, e.g. a node that slowed down).

A window ends on each rank by count, not by the clock: the rank's quota is its share of B,
in proportion to its estimated rate (the same integers on every rank, `controller.apportion`),
and T only bounds it (`next_micro_batch`): a rank that reaches (1 + `slack`) T before its
quota stops there, its last micro-batch cut to the samples that fit (`last_micro_batch`),
and a rank that meets its quota before `floor` T goes on to `floor` T. Why: ending by the clock,
each window's count carries the noise of every rank's speed over that window; on a 2-core VM
the fast rank's speed moves +-25% from one 45 ms window to the next, and the global count
spread by a standard deviation of 17-26% of B. By quota, a rank that is faster than its
estimate ends early and starts its next window early: the ranks may drift apart by up to a
window before one waits for another's reduction, so its speed's noise costs no time while
the drift stays within that, and the count stays B. A real change of speed is followed through the cap and the next readings: the
rule uses reading k to set window k+2 (window k+1 is already running when reduction k
arrives), so a rank that slowed down ends up to two windows at the cap, short of its quota,
and a rank that sped up more than twofold would idle for most of them at its old quota
without the floor (two ranks swapping speeds 1:4 every 10 windows: the fewest samples in a
window rose from 44-54 to 88-109 of 256 with it).

The window is never shorter than a reduction takes, or the reduction would no longer hide
behind compute (the quotas then add up to more than B). A rank's measured reduction time
includes waiting for the last rank to submit, so each rank takes the shortest of its recent
ones as its estimate, and the floor is the shortest of these over the ranks, the last rank to
submit having waited for no one (with their mean, the waits of the first windows, which take
several times the later ones, once set a floor of 0.4 s: a window of 1,881 samples for a
target of 256).
"""
from __future__ import annotations

import math
from typing import NamedTuple, Tuple

from ..errors import DynBatchError
from .controller import apportion


class Window(NamedTuple):
    """One window's plan: each rank's quota of samples, the expected length, the cap
    (seconds) at which a rank stops short of its quota, and the floor up to which a rank
    that met its quota goes on."""

    quotas: Tuple[int, ...]
    seconds: float
    cap: float
    floor: float


class WindowRule:
    """The compute-window rule: every rank's share of the target batch at the estimated
    rates. Pure; its state is the rate estimates."""

    gain = 0.5     # weight of the newest window's rate in a rank's estimate
    jump = 0.5     # a reading this far (relative) from the estimate replaces it
    slack = 0.5    # a rank stops at its quota or at (1 + slack) x the window
    floor = 0.5    # a rank that met its quota goes on to floor x the window

    def __init__(self, target_batch: int, gain: float = gain):
        if target_batch < 1:
            raise DynBatchError(f"the target global batch must be positive, got {target_batch}")
        if not 0 < gain <= 1:
            raise DynBatchError(f"the window gain (--window-gain) must be in (0, 1], got {gain}")
        self.target_batch, self.gain = target_batch, gain
        self.rates = []   # each rank's samples per second of compute; NaN until read

    def next_window(self, counts, seconds, reduce_seconds: float) -> Window:
        """The next window from every rank's samples and compute seconds in the last window
        read, and the reduction time. Until every rank's rate is known, each rank's quota is
        an equal share of the target batch, with no cap."""
        if len(self.rates) != len(counts):
            self.rates = [math.nan] * len(counts)
        for rank, (count, spent) in enumerate(zip(counts, seconds)):
            if count > 0 and spent > 0:
                rate, estimate = count / spent, self.rates[rank]
                if math.isnan(estimate) or abs(rate / estimate - 1) > self.jump:
                    self.rates[rank] = rate
                else:
                    self.rates[rank] += self.gain * (rate - estimate)
        if any(math.isnan(r) for r in self.rates):
            return self.first_window(len(counts))
        total = sum(self.rates)
        length = max(self.target_batch / total, reduce_seconds)
        batch = max(round(total * length), len(counts))
        return Window(tuple(int(q) for q in apportion(self.rates, batch, lower=1)), length,
                      (1 + self.slack) * length, self.floor * length)

    def first_window(self, world_size: int) -> Window:
        """A window before any rate is known: equal shares of the target batch, no cap."""
        return Window((math.ceil(self.target_batch / world_size),) * world_size, math.nan,
                      math.inf, 0.0)

    def state_dict(self) -> dict:
        return {"rates": list(self.rates)}

    def load_state_dict(self, state: dict) -> None:
        self.rates = [float(r) for r in state["rates"]]


def next_micro_batch(window: Window, rank: int, count: int, elapsed: float,
                     seconds_per_sample: float, micro_batch: int, least: int = 1) -> int:
    """The size of `rank`'s next micro-batch in `window`, `count` samples and `elapsed`
    seconds into it; 0 when the window is done. The first is always taken; then full
    micro-batches up to the quota (the last one cut to it), each cut to what fits before
    the cap; past the quota, only what fits before the floor. At least `least` samples."""
    quota = window.quotas[rank]
    if count == 0:
        return max(min(micro_batch, quota), least)
    if count < quota:
        size = min(micro_batch, quota - count)
        if math.isfinite(window.cap):
            size = min(size, last_micro_batch(window.cap - elapsed, seconds_per_sample,
                                              micro_batch, least))
    else:
        size = last_micro_batch(window.floor - elapsed, seconds_per_sample, micro_batch, least)
    return max(size, least) if size else 0


def last_micro_batch(remaining: float, seconds_per_sample: float, micro_batch: int,
                     least: int = 1) -> int:
    """The size of the next micro-batch with `remaining` seconds of the window left: a full
    one while it fits, else the samples that fit (rounded), at least `least` (batch norm's
    minimum); 0 when the window is better closed now."""
    if remaining <= 0:
        return 0
    if seconds_per_sample <= 0:
        return micro_batch
    fits = round(remaining / seconds_per_sample)
    if fits < 1:
        return 0
    return min(micro_batch, max(fits, least))
