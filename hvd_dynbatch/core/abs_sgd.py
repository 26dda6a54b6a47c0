"""ABS-SGD: delayed synchronous SGD with adaptive batch size (Zhou et al. 2023, "ABS-SGD: A
Delayed Synchronous Stochastic Gradient Descent Algorithm with Adaptive Batch Size for
Heterogeneous GPU Clusters").

No batch size is planned. In iteration k every rank computes micro-batches for a compute
window of T_k seconds, adding up the per-sample gradients and counting its samples; a fast
rank simply gets through more micro-batches. When the window closes, the rank starts an
asynchronous Horovod allreduce (op=Sum) of [gradient sum, loss sum, reduce time, and in the
rank's own slots its sample count and window], and begins iteration k+1 at once, while the
reduction runs. At the
end of window k+1 it waits for reduction k, applies

    w <- SGD step with g_k = (sum over ranks of gradient sums of window k) / N_k,

N_k being the global sample count of window k, and starts the reduction of window k+1. So
every sample weighs the same wherever it was computed, workers never wait for each other,
and the gradient applied is exactly one iteration stale (window k+1 is computed on the
weights before g_k is applied; `training/staleness.py` compensates for it). The first window's gradient is applied after the second
window; after the last window the pending gradient is flushed (waited for and applied), so
every window's samples enter exactly one update. All ranks apply the same reduced gradient
to the same weights, so the model stays identical everywhere.

The window rule (`WindowRule`), from the paper's aim of a global batch near the target B for
which the learning rate was set. A window of T seconds yields N = R * T samples, R being the
sum of the ranks' rates (samples per second of window compute), so the window is set from an
estimate of R: T = B / R. Each reduction carries every rank's sample count and compute time
of its window, so every rank knows every rank's rate and computes the same window. The
estimate follows the measured rates with weight `gain` (smoothing the noise of single
windows) and jumps to a reading that moves more than `jump` from it (a real change of speed,
e.g. a node that slowed down). The rule uses reading k to set window k+2 (window k+1 is
already running when reduction k arrives); a rule that corrects T step by step from its last
error would ring under that delay (a proportional one with gain 0.5 swung the window by
+-25% with a period of about 8 windows), while setting T from R does not depend on the
windows before. The window is never shorter than a reduction takes, or the reduction would
no longer hide behind compute. A rank's measured reduction time includes waiting for the
last rank to submit, so each rank takes the shortest of its recent ones as its estimate, and
the floor is the mean of these over the ranks.

A rank ends its window at the micro-batch boundary nearest to T: when less than a full
micro-batch of time is left, its last micro-batch is cut to the samples that fit
(`last_micro_batch`), so its count is its rate times T to within a sample rather than up to
a whole micro-batch over (a slow rank may do only three micro-batches in a window).
"""
from __future__ import annotations

import math

from ..errors import DynBatchError


class WindowRule:
    """The compute-window rule: the window that yields the target batch at the estimated
    global rate. Pure; its state is the rate estimate."""

    gain = 0.5     # weight of the newest window's rate in the estimate
    jump = 0.25    # a reading this far (relative) from the estimate replaces it

    def __init__(self, target_batch: int, gain: float = gain):
        if target_batch < 1:
            raise DynBatchError(f"the target global batch must be positive, got {target_batch}")
        if not 0 < gain <= 1:
            raise DynBatchError(f"the window gain (--window-gain) must be in (0, 1], got {gain}")
        self.target_batch, self.gain = target_batch, gain
        self.rate = math.nan   # global samples per second of window compute

    def next_window(self, counts, seconds, reduce_seconds: float) -> float:
        """The next window from every rank's samples and compute seconds in the last window
        read, and the reduction time."""
        rate = sum(c / s for c, s in zip(counts, seconds) if s > 0 and c > 0)
        if rate > 0:
            if math.isnan(self.rate) or abs(rate / self.rate - 1) > self.jump:
                self.rate = rate
            else:
                self.rate += self.gain * (rate - self.rate)
        if math.isnan(self.rate):
            return reduce_seconds
        return max(self.target_batch / self.rate, reduce_seconds)

    def state_dict(self) -> dict:
        return {"rate": self.rate}

    def load_state_dict(self, state: dict) -> None:
        self.rate = float(state["rate"])


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
