"""ABS-SGD: delayed synchronous SGD with adaptive batch size (Zhou et al. 2023, "ABS-SGD: A
Delayed Synchronous Stochastic Gradient Descent Algorithm with Adaptive Batch Size for
Heterogeneous GPU Clusters").

No batch size is planned. In iteration k every rank computes micro-batches for a compute
window of T_k seconds, adding up the per-sample gradients and counting its samples; a fast
rank simply gets through more micro-batches. When the window closes, the rank starts an
asynchronous Horovod allreduce (op=Sum) of [gradient sum, sample count, loss sum, window
time, last reduce time], and begins iteration k+1 at once, while the reduction runs. At the
end of window k+1 it waits for reduction k, applies

    w <- SGD step with g_k = (sum over ranks of gradient sums of window k) / N_k,

N_k being the global sample count of window k, and starts the reduction of window k+1. So
every sample weighs the same wherever it was computed, workers never wait for each other,
and the gradient applied is exactly one iteration stale (window k+1 is computed on the
weights before g_k is applied). The first window's gradient is applied after the second
window; after the last window the pending gradient is flushed (waited for and applied), so
every window's samples enter exactly one update. All ranks apply the same reduced gradient
to the same weights, so the model stays identical everywhere.

The window rule (`next_window`), from the paper's aim of a global batch near the target B
for which the learning rate was set: the window is a proportional controller on its own
length, T_{k+1} = T_k * (1 + gain * (B / N_k - 1)) (one adjustment changing it at most
`max_factor` times), since the samples a window yields grow in proportion to its length; and
it is never shorter than a reduction takes, or the reduction would no longer hide behind
compute. A rank's measured reduction time includes waiting for the last rank to submit, so
each rank takes the shortest of its recent ones as its estimate, and the floor is the mean of
these over the ranks. Every quantity in the rule comes out of the allreduce, so every rank
computes the same window.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..errors import DynBatchError


@dataclass(frozen=True)
class WindowRule:
    """The compute-window controller. Pure."""

    target_batch: int
    gain: float = 0.5
    max_factor: float = 2.0   # one adjustment changes the window at most this many times

    def __post_init__(self):
        if self.target_batch < 1:
            raise DynBatchError(f"the target global batch must be positive, "
                                f"got {self.target_batch}")
        if not 0 < self.gain <= 1:
            raise DynBatchError(f"the window gain (--window-gain) must be in (0, 1], "
                                f"got {self.gain}")

    def next_window(self, window: float, samples: float, reduce_seconds: float) -> float:
        """T_{k+1} from T_k, the global sample count N_k it gave, and the reduction time."""
        if samples <= 0 or window <= 0:
            return max(window, reduce_seconds)
        factor = 1.0 + self.gain * (self.target_batch / samples - 1.0)
        factor = min(max(factor, 1.0 / self.max_factor), self.max_factor)
        return max(window * factor, reduce_seconds)
