"""A model of a heterogeneous cluster, for driving the batch controller without one.

Pure numpy. Worker i computes a batch of b samples in

    t_i = overhead_i + b / rate_i,   times (1 + noise * N(0, 1)), floored at 1% of itself,

where `rate_i` (samples/s) can change at given adjustments to emulate interference. The same
`BatchController` that training uses runs against it, so what the simulator shows about
settling and efficiency is what the controller does.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, Optional, Sequence

import numpy as np

from .controller import BatchController


@dataclass
class ClusterModel:
    """Workers with per-sample rates, a fixed per-step overhead and multiplicative noise.

    rate_changes maps an adjustment index to the rates that hold from then on.
    """

    rates: np.ndarray
    overhead: float = 0.0
    noise: float = 0.0
    seed: int = 0
    rate_changes: Dict[int, Sequence[float]] = field(default_factory=dict)

    def __post_init__(self):
        self.rates = np.asarray(self.rates, dtype=np.float64)
        self._rng = np.random.default_rng(self.seed)

    def rates_at(self, adjustment: int) -> np.ndarray:
        current = self.rates
        for start in sorted(self.rate_changes):
            if start <= adjustment:
                current = np.asarray(self.rate_changes[start], dtype=np.float64)
        return current

    def step_times(self, batch_sizes: Sequence[int], adjustment: int = 0) -> np.ndarray:
        """Measured compute time of each worker for one step at `batch_sizes`."""
        b = np.asarray(batch_sizes, dtype=np.float64)
        exact = self.overhead + b / self.rates_at(adjustment)
        jitter = 1 + self.noise * self._rng.standard_normal(b.size)
        return exact * np.maximum(jitter, 0.01)

    def ideal_split(self, global_batch: int, adjustment: int = 0) -> np.ndarray:
        """The real-valued split at which every worker's expected time is equal."""
        r = self.rates_at(adjustment)
        # overhead + b_i / r_i = T for all i, sum b_i = B  =>  T = (B + overhead sum r) / sum r
        t = (global_batch + self.overhead * r.sum()) / r.sum()
        return (t - self.overhead) * r


def imbalance(times: Sequence[float]) -> float:
    """max(t) / min(t): 1.0 when every worker finishes together."""
    t = np.asarray(times, dtype=np.float64)
    return float(t.max() / t.min())


def run_adjustments(controller: BatchController, cluster: ClusterModel, adjustments: int,
                    split: Optional[np.ndarray] = None) -> list:
    """Drive `controller` for `adjustments` rounds; return one record per round.

    Each record holds the split that ran, the expected (noise-free) imbalance at it, and the
    split the controller chose next.
    """
    if split is None:
        split = controller.initial_split(cluster.rates.size)
    history = []
    for k in range(adjustments):
        measured = cluster.step_times(split, k)
        expected = cluster.overhead + split / cluster.rates_at(k)
        new = controller.update(split, measured)
        history.append({"adjustment": k, "split": split.copy(),
                        "imbalance": imbalance(expected), "next": new.copy()})
        split = new
    return history
