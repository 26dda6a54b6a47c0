"""A model of a heterogeneous cluster, for driving the batch controller at scale without one.

Pure numpy. Worker i computes a batch of b samples in

    t_i = overhead + b / rate_i,   times (1 + noise * N(0, 1)) per step, floored at 1% of itself,

and, with `drift`, times exp(drift * N(0, 1)) drawn afresh per worker and window: a speed that
moves between windows and holds within one, as a shared node's does, which the spread of a
window's steps does not show. The ideal split stays the one of the workers' mean speeds;
no controller can foresee the next window's draw.

and every step ends with a ring allreduce of the gradients (`RingAllreduce`), so a step of the
job takes max_i t_i plus the allreduce. The split is fixed for `steps` steps between two
adjustments; the controller then sees each worker's median time over them and its relative
standard error, as `StepTimer` gives them in training. Rates change, and workers join or
leave, at given adjustments (`Event`); after a change of the worker count the split starts
even again, as training's elastic resume does.

The same `BatchController` that training uses runs against the model, so what the simulator
shows about settling and efficiency is what the controller does. Efficiency compares the
throughput at the controller's split with the throughput at the ideal split (every worker's
expected time equal) under the very same noise draws, so per-step noise, which slows the ideal
split too, cancels out; the noise-free efficiency compares the expected step times.
"""
from __future__ import annotations

import enum
import math
import time
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence

import numpy as np

from ..errors import DynBatchError
from .controller import BatchController, ControllerConfig, Rule
from .timing import median_error


@dataclass(frozen=True)
class RingAllreduce:
    """Seconds for a ring allreduce of `gradient_bytes` over n workers.

    A ring sends 2(n-1) messages, each of 1/n of the data, through every link (Patarasuk &
    Yuan 2009): latency * 2(n-1) + 2(n-1)/n * gradient_bytes / bandwidth.
    """

    gradient_bytes: float = 0.0
    bandwidth: float = 10e9   # bytes per second through one link
    latency: float = 5e-6     # seconds per message

    def __post_init__(self):
        if self.gradient_bytes < 0 or self.latency < 0 or not self.bandwidth > 0:
            raise DynBatchError("the allreduce's gradient size and latency must not be "
                                "negative, and its bandwidth must be positive")

    def seconds(self, workers: int) -> float:
        if workers <= 1:
            return 0.0
        return (2 * (workers - 1) * self.latency
                + 2 * (workers - 1) / workers * self.gradient_bytes / self.bandwidth)


# The efficiency against the ideal split that counts as settled, unless a run says otherwise.
SETTLED = 0.95
# A ResNet-50's gradient (about 100 MB) over 100 Gbit/s links: the default of `Scenario`.
RESNET50_100GBIT = RingAllreduce(gradient_bytes=100e6, bandwidth=100e9 / 8, latency=5e-6)


class RateDistribution(str, enum.Enum):
    """How worker speeds spread between the slowest and `spread` times it."""

    LOGNORMAL = "lognormal"      # lognormal, clipped to its 1st-99th percentile range
    UNIFORM = "uniform"          # log-uniform over the range
    GENERATIONS = "generations"  # equal shares of three hardware generations: 1, sqrt(s), s


def worker_rates(workers: int, distribution: RateDistribution, spread: float,
                 rng: np.random.Generator, slowest: float = 100.0) -> np.ndarray:
    """`workers` rates (samples/s) between `slowest` and `spread * slowest`."""
    if workers < 1:
        raise DynBatchError(f"the number of workers must be positive, got {workers}")
    if not spread >= 1:
        raise DynBatchError(f"the rate spread must be at least 1, got {spread}")
    distribution = RateDistribution(distribution)
    log_spread = math.log(spread)
    if distribution is RateDistribution.LOGNORMAL:
        # 2.326 is the 99th percentile of N(0, 1): 98% of the draws fall inside the range.
        z = rng.standard_normal(workers) * log_spread / (2 * 2.326) + log_spread / 2
        position = np.clip(z, 0.0, log_spread)
    elif distribution is RateDistribution.UNIFORM:
        position = rng.uniform(0.0, log_spread, workers)
    else:
        position = rng.permutation(np.arange(workers) % 3) * log_spread / 2
    return slowest * np.exp(position)


class EventKind(str, enum.Enum):
    SLOW = "slow"    # a fraction of the workers becomes `factor` times slower
    LEAVE = "leave"  # a fraction of the workers leaves
    JOIN = "join"    # a fraction (of the current count) joins, rates from the same distribution


@dataclass(frozen=True)
class Event:
    """A change of the cluster at the start of adjustment `at`."""

    at: int
    kind: EventKind
    fraction: float
    factor: float = 1.0

    @classmethod
    def parse_schedule(cls, spec: Optional[str]) -> List["Event"]:
        """Read '20:slow=0.1@2;40:leave=0.25;60:join=0.25'; raise `DynBatchError` if wrong."""
        events = []
        for part in [p.strip() for p in (spec or "").split(";") if p.strip()]:
            try:
                at, action = part.split(":")
                kind, value = action.split("=")
                fraction, _, factor = value.partition("@")
                event = cls(int(at), EventKind(kind.strip()), float(fraction),
                            float(factor) if factor else 1.0)
            except ValueError:
                raise DynBatchError(
                    f"cannot read event '{part}': expected ADJUSTMENT:slow=FRACTION@FACTOR, "
                    f"ADJUSTMENT:leave=FRACTION or ADJUSTMENT:join=FRACTION") from None
            if event.at < 1 or not 0 < event.fraction <= 1 or not event.factor >= 1:
                raise DynBatchError(f"event '{part}' needs an adjustment >= 1, a fraction in "
                                    f"(0, 1] and a slowdown factor >= 1")
            if event.kind is EventKind.SLOW and not factor:
                raise DynBatchError(f"event '{part}' needs a factor: slow=FRACTION@FACTOR")
            events.append(event)
        return sorted(events, key=lambda e: e.at)

    def apply(self, rates: np.ndarray, new_rates, rng: np.random.Generator) -> np.ndarray:
        """The rates after this event; `new_rates(k)` draws k rates for joining workers."""
        count = max(1, round(self.fraction * rates.size))
        if self.kind is EventKind.JOIN:
            return np.concatenate([rates, new_rates(count)])
        if self.kind is EventKind.LEAVE:
            count = min(count, rates.size - 1)
        chosen = rng.choice(rates.size, size=count, replace=False)
        if self.kind is EventKind.LEAVE:
            return np.delete(rates, chosen)
        slowed = rates.copy()
        slowed[chosen] /= self.factor
        return slowed


@dataclass
class ClusterModel:
    """Workers with per-sample rates, a fixed per-step overhead, noise and an allreduce.

    rate_changes maps an adjustment index to the rates that hold from then on; a change of
    their number is workers joining or leaving. Each adjustment window has `steps` steps.
    """

    rates: np.ndarray
    overhead: float = 0.0
    noise: float = 0.0
    seed: int = 0
    rate_changes: Dict[int, Sequence[float]] = field(default_factory=dict)
    steps: int = 1
    allreduce: RingAllreduce = RingAllreduce()
    drift: float = 0.0

    def __post_init__(self):
        self.rates = np.asarray(self.rates, dtype=np.float64)
        self._rng = np.random.default_rng(self.seed)

    def rates_at(self, adjustment: int) -> np.ndarray:
        current = self.rates
        for start in sorted(self.rate_changes):
            if start <= adjustment:
                current = np.asarray(self.rate_changes[start], dtype=np.float64)
        return current

    def expected_times(self, split: Sequence[float], adjustment: int) -> np.ndarray:
        """Each worker's noise-free compute time at `split`."""
        return self.overhead + np.asarray(split, dtype=np.float64) / self.rates_at(adjustment)

    def ideal_split(self, global_batch: int, adjustment: int = 0) -> np.ndarray:
        """The real-valued split at which every worker's expected time is equal."""
        r = self.rates_at(adjustment)
        # overhead + b_i / r_i = T for all i, sum b_i = B  =>  T = (B + overhead sum r) / sum r
        t = (global_batch + self.overhead * r.sum()) / r.sum()
        return (t - self.overhead) * r

    def noise_draws(self, workers: int) -> np.ndarray:
        """Multiplicative noise for one window: `steps` x `workers`."""
        jitter = np.maximum(1 + self.noise * self._rng.standard_normal((self.steps, workers)),
                            0.01)
        if self.drift:
            jitter = jitter * np.exp(self.drift * self._rng.standard_normal(workers))
        return jitter

    def window_seconds(self, split: Sequence[float], adjustment: int,
                       draws: np.ndarray) -> float:
        """Wall time of one window at `split`: each step waits for its slowest worker, then
        for the allreduce."""
        times = self.expected_times(split, adjustment) * draws
        return float(times.max(axis=1).sum() + draws.shape[0] * self.allreduce.seconds(
            draws.shape[1]))


def imbalance(times: Sequence[float]) -> float:
    """max(t) / min(t): 1.0 when every worker finishes together."""
    t = np.asarray(times, dtype=np.float64)
    return float(t.max() / t.min())


def run_adjustments(controller: BatchController, cluster: ClusterModel, adjustments: int,
                    split: Optional[np.ndarray] = None) -> List[dict]:
    """Drive `controller` for `adjustments` windows; return one record per window.

    A record holds the worker count, the split that ran and the split the controller chose
    next, the noise-free imbalance at the split, the efficiency of the split and of a static
    (even) split against the ideal one (same noise draws), the noise-free efficiency, and the
    controller's own seconds for the update.
    """
    global_batch = controller.config.global_batch
    if split is None:
        split = controller.initial_split(cluster.rates_at(0).size)
    history = []
    for k in range(adjustments):
        workers = cluster.rates_at(k).size
        if split.size != workers:
            split = controller.initial_split(workers)
        draws = cluster.noise_draws(workers)
        ideal = cluster.ideal_split(global_batch, k)
        even = np.full(workers, global_batch / workers)
        ideal_seconds = cluster.window_seconds(ideal, k, draws)
        expected = cluster.expected_times(split, k)
        window = expected * draws
        measured, errors = np.median(window, axis=0), median_error(window)
        started = time.perf_counter()
        new = controller.update(split, measured, errors)
        seconds = time.perf_counter() - started
        allreduce = cluster.allreduce.seconds(workers)
        history.append({
            "adjustment": k, "workers": workers, "split": split.copy(), "next": new.copy(),
            "imbalance": imbalance(expected),
            "efficiency": ideal_seconds / cluster.window_seconds(split, k, draws),
            "static_efficiency": ideal_seconds / cluster.window_seconds(even, k, draws),
            "noise_free_efficiency": (cluster.expected_times(ideal, k)[0] + allreduce)
                                     / (expected.max() + allreduce),
            "controller_seconds": seconds})
        split = new
    return history


@dataclass(frozen=True)
class Scenario:
    """One simulated cluster and run: N workers, their spread, noise, drift, events,
    allreduce.

    The global batch is `batch_per_worker` times the starting worker count and stays fixed
    through joins and leaves. `steps` is the number of steps between two adjustments.
    Raises `DynBatchError` for values that cannot describe a run.
    """

    workers: int
    distribution: RateDistribution = RateDistribution.LOGNORMAL
    spread: float = 4.0
    noise: float = 0.05
    steps: int = 5
    adjustments: int = 30
    batch_per_worker: int = 64
    overhead: float = 0.0
    allreduce: RingAllreduce = RESNET50_100GBIT
    events: tuple = ()
    seed: int = 0
    drift: float = 0.0

    def __post_init__(self):
        if self.workers < 1:
            raise DynBatchError(f"the number of workers must be positive, got {self.workers}")
        for name in ("steps", "adjustments", "batch_per_worker"):
            if getattr(self, name) < 1:
                raise DynBatchError(f"{name} must be at least 1, got {getattr(self, name)}")
        if self.noise < 0 or self.overhead < 0 or self.drift < 0:
            raise DynBatchError(f"the noise, the overhead and the drift must not be negative, "
                                f"got {self.noise}, {self.overhead} and {self.drift}")
        if not self.spread >= 1:
            raise DynBatchError(f"the rate spread must be at least 1, got {self.spread}")

    @property
    def global_batch(self) -> int:
        return self.batch_per_worker * self.workers

    def cluster(self) -> ClusterModel:
        """The cluster model, its rates drawn from the seed and its events compiled in."""
        rng = np.random.default_rng(self.seed)
        draw = lambda k: worker_rates(k, self.distribution, self.spread, rng)  # noqa: E731
        rates = current = draw(self.workers)
        changes = {}
        for event in self.events:
            current = changes[event.at] = event.apply(current, draw, rng)
            if current.size > self.global_batch:
                raise DynBatchError(f"after event at {event.at} there are {current.size} "
                                    f"workers for a global batch of {self.global_batch}")
        return ClusterModel(rates, self.overhead, self.noise, self.seed + 1, changes,
                            self.steps, self.allreduce, self.drift)


def settling(history: List[dict], starts: Sequence[int], target: float) -> List[dict]:
    """Per segment (from each start to the next): adjustments until every later window's
    noise-free efficiency is at least `target` (None if never), the median efficiencies from
    then on (or over the whole segment when it never settles), and the static split's median
    efficiency over the segment.

    The noise-free efficiency is the stricter test: under noise the ideal split has
    stragglers too, which hides part of a split's error."""
    bounds = list(starts) + [len(history)]
    out = []
    for start, stop in zip(bounds, bounds[1:]):
        segment = history[start:stop]
        settled = len(segment)
        while settled > 0 and segment[settled - 1]["noise_free_efficiency"] >= target:
            settled -= 1
        tail = segment[settled:] if settled < len(segment) else segment
        out.append({
            "start": start, "workers": segment[0]["workers"],
            "settle": settled if settled < len(segment) else None,
            **{key: float(np.median([h[key] for h in tail]))
               for key in ("efficiency", "noise_free_efficiency")},
            "static_efficiency": float(np.median([h["static_efficiency"] for h in segment]))})
    return out


def simulate(scenario: Scenario, rule: Rule, target: float = SETTLED) -> dict:
    """Run the controller with `rule` through `scenario`.

    Returns the per-window history, the settling figures of each segment (the start and each
    event), and the controller's median and largest seconds per adjustment. `target` is the
    efficiency that counts as settled.
    """
    if not 0 < target <= 1:
        raise DynBatchError(f"the target efficiency must be in (0, 1], got {target}")
    controller = BatchController(ControllerConfig(scenario.global_batch, rule=rule))
    history = run_adjustments(controller, scenario.cluster(), scenario.adjustments)
    starts = sorted({0} | {e.at for e in scenario.events if e.at < scenario.adjustments})
    seconds = [h["controller_seconds"] for h in history]
    return {"history": history, "segments": settling(history, starts, target),
            "controller_seconds": float(np.median(seconds)),
            "controller_seconds_max": float(max(seconds))}
