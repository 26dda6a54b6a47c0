"""The batch controller: from measured per-rank step times to a new split of the global batch.

Pure numpy and deterministic: every rank feeds it the same all-gathered (batch size, time)
pairs and computes the same split, so no broadcast is needed, and the simulator drives this
very code. The measurements behind the choices below are in `benchmarks/RESULTS.md`
("Fixed step costs" and "Settling").

Rule "p" (Tyagi & Sharma 2020, "Taming Resource Heterogeneity In Distributed ML Training With
Dynamic Batching", Sec. 3): worker i processed b_i samples in t_i seconds, so its throughput is
r_i = b_i / t_i, and all workers finish together when b_i is proportional to r_i:

    b_i' = B * r_i / sum_j r_j

Rule "pid" takes that target as the set-point of a controller acting on a continuous
allocation y (floats summing to B; the integer split is y rounded):

* filtered rates: each worker's rate is the running mean of its last `memory` readings, so
  with many workers the split is not set by the readings noise made extreme (1024 workers,
  5% noise: unfiltered, a noise-free max/min of about 1.4); a reading more than
  `change_threshold` off the mean restarts it, as the worker's speed really changed;
* gain scheduling: while the predicted imbalance max(b_i / r_i) / min(b_i / r_i) - 1 is above
  `fast_threshold` y jumps to the target; below it y moves a fraction `gain` of the way, so
  noise is filtered rather than chased;
* integral: below `fast_threshold` each worker's error (target - y, in samples) accumulates
  while it keeps its sign and restarts when the sign flips, y jumps or the split is in the
  dead-band (anti-windup); `integral_gain` times it is added, so an error that persists
  under damping goes while noise does not build up.

Rule "model" (the default) is for steps with fixed costs. Kernel launches, the optimizer
step, the tail of the allreduce and data handling cost time at any batch size, so
t_i(b) = a_i + c_i b. The proportional split still has the equal-time point as its fixed
point but only creeps there (fixed costs of 0.2 s, a spread of 8, 64 workers: "pid" took 20
adjustments to hold 95% of the ideal). "model" fits each worker's line and jumps to where the
lines meet: the T with

    sum_i clip((T - a_i) / c_i, min_batch, max_batch) = B,

solved by water-filling (a worker pinned at a bound takes no further share) and rounded by
largest remainder, B exact. Without fixed costs it does as well as "pid". The fits:

* least squares over the worker's readings (b, t), each weighing 1 / t^2 (a reading's noise
  is a share of its time: unweighted, one reading at 64 samples outweighed eight at 22) and
  the older less, by 1 - 1/`memory` per adjustment. A negative a_i is refitted as 0: the
  line through the origin;
* a fit claiming the fixed share f = a_i / mean(t) counts once its batches spread by a
  standard deviation of at least `identify` / (1 - f) of their mean: the move to the
  equal-time point is 1 / (1 - f) times the proportional one, and so is the noise it
  carries (5% noise: two readings 8% apart claimed f = 0.95 and sent a worker to twice its
  ideal batch). A worker whose batches do not spread enough keeps its last fit's fixed cost,
  its slope from its mean reading; a worker never fitted is proportional (a_i = 0), so the
  rule starts as "p" does;
* fixed costs are weighed against their noise (empirical Bayes). Given each time's relative
  standard error e (`update(..., errors)`), a fit from readings of weights w has
  var(a_i) = e^2 mean(b^2) / (U var(b)), U = sum w / t^2 and the moments weighted by
  w / t^2: least squares' variance of an intercept, larger than the fixed cost itself for
  two readings a few per cent apart. The fitted workers' fixed costs are the prior: centre
  m their median, variance s^2 the square of their robust spread less the median var(a_i).
  Each a_i becomes its posterior mean (a_i s^2 + m var(a_i)) / (s^2 + var(a_i)) and the
  slope is refitted with it held (256 workers, 5% noise: the split after the second reading
  held 94.8% of the ideal, 88.4% from the raw fits). Readings without errors are taken as
  they are;
* readings given with errors make a fit from the third on, exact ones from the second: a
  line fits two readings exactly, so nothing yet tells a drift between their windows, which
  errors taken within a window do not see, from a fixed cost (on 2 CPU ranks such lines sent
  rank 0's batch more than 3 samples past its steady one in 22 of 72 traced jobs, the
  proportional move in none);
* a reading further from its line than `change_threshold`, and than 3 times the readings'
  spread about their lines, is a real change of speed: the worker's readings and fixed cost
  are forgotten. The spread is a running estimate, forgotten like the readings, of the robust
  spread of the misses (log of time over prediction) about their median, over the workers
  with a calibrated line that did not change: a change all workers share is no spread, and
  no worker's own change moves it. It sees what within-window errors miss, a speed that
  drifts from window to window as a shared node's does (lognormal, sigma 0.2 a window, 64
  workers: 85.6% of the ideal kept with the threshold alone, 96.9% with the spread), so the
  fits' noise e^2 is at least its square. A proportional line only bounds the time at
  another batch, so its allowance grows by |log(b / mean b)|;
* misses that keep one sign are a change of speed too (a CUSUM per worker and direction:
  each adjustment adds the miss, less the median miss of the calibrated workers, beyond
  that allowance in standard errors, sqrt(e^2 + spread^2 + 0.02^2), less 1, floored at 0;
  over 5 is a change). A worker 20% slower for good misses by 0.18, under the threshold's
  log 1.25, and was folded into its line, which the forgetting moves only 1/memory a step:
  after a tenth of the workers slowed by 1.2 the split held 90.6-91.5% of the ideal for 10
  adjustments without noise, and now reaches 97% in 1 (`benchmarks/RESULTS.md`, "Moderate
  slowdowns"). Noise of either sign and drift drawn afresh each window do not accumulate.
  A change every worker shares leaves the equal-time split where it was, so the median
  miss is taken out: without that, 8 workers with 3% noise, all 15% slower for good, lost
  every line and their split read an imbalance of up to 1.14, against 1.04 with it. It
  takes three such workers: the median of two is their mean, which takes half of one
  worker's change from each, while the change also enters the misses' spread (on 2 CPU
  ranks, one slowed by 1.2, the sums peaked at 1.3 of the 5). Two workers' misses count as
  they are: in the cluster model (2 ms fixed cost, 5% noise, 20 seeds) the split then
  settles within 3 adjustments of a lasting 20% slowdown in 17-19 of 20 runs, against 0-1
  of 20 with the median, and a slowdown both share forgets both lines (40 changes in 20
  runs) at 0.3 points of efficiency;
* no worker's target is below 0.6 of its batch in "p"'s split of the same readings: with two
  workers the prior is the two fits' own and cannot pull a wild one back (after a swap of
  slowdowns a line through two readings claimed 0.60 s of fixed cost and sent a worker to 1
  sample where about 40 balanced).

"pid" and "model" keep the split while the predicted imbalance is below `deadband`, and one
adjustment moves a worker by at most `max_change * B` samples, so one bad reading cannot wreck
the split. Every worker's batch stays within [min_batch, max_batch] (a memory cap), and B is
conserved exactly. Times that are zero, negative, NaN or infinite keep the last split.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Optional, Sequence

import numpy as np

from ..errors import DynBatchError


class Rule(str, enum.Enum):
    """Which control rule moves the split."""

    P = "p"
    PID = "pid"
    MODEL = "model"


# "model": a reading further from its line than this many times the misses' spread (and
# than change_threshold) is a real change of speed.
_CHANGE_SIGMAS = 3.0

# "model": a worker whose misses keep one sign is a change of speed once their cumulative
# sum, in standard errors, less this allowance per adjustment, passes this limit (CUSUM);
# a miss's standard error is at least the floor (log units).
_PERSIST_ALLOWANCE, _PERSIST_LIMIT, _PERSIST_FLOOR = 1.0, 5.0, 0.02

# "model": no worker's target falls below this share of its batch in the proportional split
# of the window's readings (see the module docstring).
_PROPORTIONAL_FLOOR = 0.6

# The train command's names for the settings it exposes, so that errors name what to change.
_OPTION_NAMES = {"gain": "--controller-gain", "integral_gain": "--integral-gain"}


@dataclass(frozen=True)
class ControllerConfig:
    """Settings of the batch controller; checked on construction.

    global_batch: B, the sum of all workers' batches, conserved exactly.
    min_batch, max_batch: bounds on one worker's batch (max_batch None: only B bounds it).
    rule: "p" (plain proportional), "pid" or "model" (see the module docstring).
    gain: fraction of the way to the target moved per adjustment below fast_threshold ("pid").
    integral_gain: weight of the accumulated same-sign error ("pid").
    deadband: imbalance max(t)/min(t) - 1 below which nothing changes ("pid", "model";
        None: the rule's own default, `DEFAULTS`).
    fast_threshold: imbalance above which the full proportional step is taken ("pid").
    max_change: largest change of one worker's batch per adjustment, as a fraction of B
        ("pid", "model").
    memory: readings averaged into one worker's rate estimate at most ("pid"); in "model",
        a reading's weight falls by 1 - 1/memory per adjustment (None: the rule's own
        default).
    change_threshold: relative distance of a reading from the estimate that restarts the
        average, a real change of the worker's speed ("pid"; "model": from the fitted line,
        and also beyond 3 times the readings' spread about their lines).
    identify: spread of a worker's batches (standard deviation over mean) from which a fit
        with no fixed cost counts; one claiming the fixed share f needs identify / (1 - f)
        ("model").
    """

    global_batch: int
    min_batch: int = 1
    max_batch: Optional[int] = None
    rule: Rule = Rule.MODEL
    gain: float = 0.5
    integral_gain: float = 0.1
    deadband: Optional[float] = None
    fast_threshold: float = 0.5
    max_change: float = 0.5
    memory: Optional[int] = None
    change_threshold: float = 0.25
    identify: float = 0.02

    # Each rule's own defaults. "model" moves to its fitted target at once, so its split
    # carries the noise of its fits; a longer memory and a narrower dead-band held more of
    # the ideal in the cluster model (5% noise, 1024 workers, no fixed cost: 97.6%
    # noise-free, against 96.8% with pid's 8 readings and 5%).
    DEFAULTS = {Rule.P: {"deadband": 0.05, "memory": 8},
                Rule.PID: {"deadband": 0.05, "memory": 8},
                Rule.MODEL: {"deadband": 0.02, "memory": 16}}

    def __post_init__(self):
        object.__setattr__(self, "rule", Rule(self.rule))
        for name, value in self.DEFAULTS[self.rule].items():
            if getattr(self, name) is None:
                object.__setattr__(self, name, value)
        if self.global_batch < 1:
            raise DynBatchError(f"the global batch must be positive, got {self.global_batch}")
        if self.min_batch < 1:
            raise DynBatchError(f"the minimum batch must be at least 1, got {self.min_batch}")
        if self.max_batch is not None and self.max_batch < self.min_batch:
            raise DynBatchError(
                f"the maximum batch ({self.max_batch}) is below the minimum ({self.min_batch})")
        for name in ("gain", "max_change"):
            value = getattr(self, name)
            if not 0 < value <= 1:
                raise DynBatchError(f"{_OPTION_NAMES.get(name, name)} must be in (0, 1], "
                                    f"got {value}")
        if self.memory < 1:
            raise DynBatchError(f"memory must be at least 1 reading, got {self.memory}")
        for name in ("integral_gain", "deadband", "fast_threshold", "change_threshold",
                     "identify"):
            if getattr(self, name) < 0:
                raise DynBatchError(f"{_OPTION_NAMES.get(name, name)} must not be negative, "
                                    f"got {getattr(self, name)}")

    @property
    def forget(self) -> float:
        """"model": the factor a reading's weight falls by per adjustment, 1 - 1/memory."""
        return 1 - 1 / self.memory

    @property
    def bounds(self) -> tuple:
        """(min_batch, max_batch) as floats, max_batch infinite when None."""
        return (float(self.min_batch),
                np.inf if self.max_batch is None else float(self.max_batch))

    def check_world(self, world_size: int) -> None:
        """Raise `DynBatchError` unless `world_size` workers can share the global batch."""
        if world_size < 1:
            raise DynBatchError(f"the world size must be positive, got {world_size}")
        if self.global_batch < world_size * self.min_batch:
            raise DynBatchError(
                f"global batch {self.global_batch} is smaller than world size {world_size} x "
                f"minimum batch {self.min_batch}; raise --global-batch or lower --min-batch")
        if self.max_batch is not None and self.global_batch > world_size * self.max_batch:
            raise DynBatchError(
                f"global batch {self.global_batch} is larger than world size {world_size} x "
                f"maximum batch {self.max_batch}; lower --global-batch or raise --max-batch")


def apportion(weights: Sequence[float], total: int, lower: int = 0,
              upper: Optional[int] = None) -> np.ndarray:
    """Integers proportional to `weights` that sum to `total`, each within [lower, upper].

    Bounds are met by water-filling (workers pinned at a bound take no further share; the rest
    share what remains in proportion), then the integer parts are topped up by largest
    remainder (Hamilton's method), ties going to the lower index so every rank agrees.
    Raises `DynBatchError` when the bounds cannot hold `total`.
    """
    w = np.asarray(weights, dtype=np.float64)
    n = w.size
    hi = np.inf if upper is None else float(upper)
    if n == 0 or total < n * lower or total > n * hi:
        raise DynBatchError(f"cannot split {total} samples over {n} workers within "
                            f"[{lower}, {upper}] per worker")
    if not (np.isfinite(w).all() and w.min() >= 0 and w.sum() > 0):
        w = np.ones(n)
    share = _water_fill(w, float(total), float(lower), hi)
    base = np.floor(share + 1e-9).astype(np.int64)
    base = np.maximum(base, lower) if upper is None else np.clip(base, lower, upper)
    short = int(total - base.sum())
    room = base < hi
    if short > 0:
        remainder = np.where(room, share - base, -np.inf)
        # The `short` largest remainders, ties to the lower index, in linear time: all above
        # the short-th largest value, then the first of those equal to it.
        cut = np.partition(remainder, n - short)[n - short]
        above = np.flatnonzero(remainder > cut)
        base[above] += 1
        base[np.flatnonzero(remainder == cut)[:short - above.size]] += 1
    return base


def _water_fill(w: np.ndarray, total: float, lower, upper,
                offset: Optional[np.ndarray] = None) -> np.ndarray:
    """Real shares x w_i - offset_i (proportional to w without an offset), x the same for
    all, summing to total, each within [lower, upper] (numbers, or one bound per share).

    Each round pins the side that violates its bound more (all shares above `upper`, or all
    below `lower`) and shares what is left over the rest; pinning both sides at once would
    hand out too little or too much.
    """
    offset = np.zeros_like(w) if offset is None else offset
    share = np.empty_like(w)
    pinned = np.zeros(w.size, dtype=bool)
    free = slice(None)  # a view, not a copy, while nothing is pinned: the usual case
    left = total
    while True:
        weight = w[free].sum()
        share[free] = ((left + offset[free].sum()) * w[free] / weight - offset[free]
                       if weight > 0 else left / w[free].size)
        over, under = ~pinned & (share > upper), ~pinned & (share < lower)
        excess, deficit = (share - upper)[over].sum(), (lower - share)[under].sum()
        if excess <= 1e-12 and deficit <= 1e-12:
            break
        pin, bound = (over, upper) if excess >= deficit else (under, lower)
        np.copyto(share, bound, where=pin)
        pinned |= pin
        if pinned.all():
            break
        free = ~pinned
        left = total - share[pinned].sum()
    return share


def _median(values: np.ndarray) -> float:
    """`np.median` of a non-empty array without NaNs, in a fifth of its time on a few workers
    (the exchange of a small job runs the controller every few steps)."""
    half = values.size // 2
    ordered = np.partition(values, half)
    if values.size % 2:
        return float(ordered[half])
    # The lower middle value is the largest below `half`, so one partition at one position
    # serves: at two positions it took twice as long on 4096 workers.
    return float((ordered[:half].max() + ordered[half]) / 2)


def _robust_sigma(values: np.ndarray, centre: float) -> float:
    """1.4826 times the median absolute deviation of `values` from `centre`: the standard
    deviation of normal values, and moved by outliers no more than the median is."""
    return 1.4826 * _median(np.abs(values - centre))


def _shrunk(fixed: np.ndarray, variance: np.ndarray, pool: np.ndarray) -> np.ndarray:
    """Each fixed cost's posterior mean under the prior the `pool`ed ones give (see the
    module docstring), `variance` being each fit's own; the fits as they are when fewer than
    two are pooled or none has a variance."""
    pool = pool & np.isfinite(variance)
    pooled, pooled_variance = fixed[pool], variance[pool]
    if pooled.size < 2 or not pooled_variance.max() > 0:
        return fixed
    centre = _median(pooled)
    spread = _robust_sigma(pooled, centre)
    prior = max(spread * spread - _median(pooled_variance), 0.0)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(variance > 0, (fixed * prior + centre * variance) / (prior + variance),
                        fixed)


@dataclass
class ControllerState:
    """What the controller carries between adjustments (saved and restored with the job)."""

    allocation: Optional[np.ndarray] = None   # y: continuous batch sizes, sum B
    integral: Optional[np.ndarray] = None     # accumulated same-sign error, samples
    rates: Optional[np.ndarray] = None        # filtered rate per worker, samples/s
    readings: Optional[np.ndarray] = None     # readings in each worker's running mean
    moments: Optional[np.ndarray] = None      # "model": per worker (columns), the sums of
                                              # w and w e^2, then of u, u b, u t, u b^2 and
                                              # u b t over its readings (w: the forgetting
                                              # weight, u = w / t^2, e: a time's error)
    fixed: Optional[np.ndarray] = None        # "model": each worker's last fitted fixed cost
    persist: Optional[np.ndarray] = None      # "model": per worker (columns), the CUSUMs of
                                              # its misses upward and downward
    scatter: float = 0.0                      # "model": spread of readings about their lines,
    scatter_weight: float = 0.0               # log units, and the weight of its estimate
    adjustments: int = 0

    _ARRAYS = ("allocation", "integral", "rates", "readings", "moments", "fixed", "persist")

    def state_dict(self) -> dict:
        """Plain Python values, for checkpoints and Horovod's elastic state."""
        out = {name: None if getattr(self, name) is None else getattr(self, name).tolist()
               for name in self._ARRAYS}
        return {**out, "scatter": self.scatter, "scatter_weight": self.scatter_weight,
                "adjustments": self.adjustments}

    @classmethod
    def from_state_dict(cls, d: dict) -> "ControllerState":
        arrays = {name: None if d.get(name) is None
                  else np.asarray(d[name], dtype=np.float64) for name in cls._ARRAYS}
        return cls(**arrays, scatter=float(d.get("scatter", 0.0)),
                   scatter_weight=float(d.get("scatter_weight", 0.0)),
                   adjustments=int(d["adjustments"]))


@dataclass
class BatchController:
    """Splits the global batch over workers by their measured speed.

    Use `initial_split(n)` for the first split and `update(batch_sizes, times)` every
    adjustment with the all-gathered values; both return an integer array summing to B.
    After an update, `changed` marks the workers whose speed it found changed.
    Pure: no communication; the same inputs give the same output on every rank.
    """

    config: ControllerConfig
    state: ControllerState = field(default_factory=ControllerState)
    # "model": the lines fitted from the moments array and adjustment they came from (the
    # next update checks its readings against them before adding its own).
    _fitted: Optional[tuple] = field(default=None, init=False, repr=False, compare=False)
    # The workers the last update took for a real change of speed ("pid", "model"), whose
    # readings it restarted: for logs and replays that ask why a split jumped.
    changed: Optional[np.ndarray] = field(default=None, init=False, repr=False, compare=False)

    def initial_split(self, world_size: int) -> np.ndarray:
        """An even split of B over `world_size` workers (the remainder to the lowest ranks)."""
        self.config.check_world(world_size)
        self.state = ControllerState()
        return self._round(np.full(world_size, self.config.global_batch / world_size))

    def update(self, batch_sizes: Sequence[int], times: Sequence[float],
               errors: Optional[Sequence[float]] = None) -> np.ndarray:
        """The next split, given each worker's batch and its measured compute time per step.

        `errors` (rule "model"): each time's relative standard error, how far the reading
        can be trusted (`StepTimer.error`); None, or a value that is not a finite
        non-negative number, counts as an exact reading. Returns `batch_sizes` unchanged
        when any time is not a positive finite number, or when the imbalance is inside the
        dead-band.
        """
        cfg = self.config
        b = np.asarray(batch_sizes, dtype=np.float64)
        t = np.asarray(times, dtype=np.float64)
        e = np.zeros_like(t) if errors is None else np.asarray(errors, dtype=np.float64)
        if b.shape != t.shape or b.shape != e.shape or b.ndim != 1:
            raise DynBatchError(f"got {b.size} batch sizes, {t.size} times and {e.size} errors")
        cfg.check_world(b.size)
        self.changed = np.zeros(b.size, dtype=bool)
        if not (np.isfinite(t).all() and t.min() > 0 and b.min() > 0):
            return b.astype(np.int64)
        rates = b / t
        proportional = cfg.global_batch * rates / rates.sum()
        if cfg.rule is Rule.P:
            self.state.adjustments += 1
            return self._round(proportional)
        if cfg.rule is Rule.MODEL:
            return self._round(self._model_step(b, t, np.where(np.isfinite(e) & (e > 0), e, 0.0),
                                                proportional))
        return self._round(self._pid_step(b, t, rates))

    def _pid_step(self, b: np.ndarray, t: np.ndarray, rates: np.ndarray) -> np.ndarray:
        cfg, st = self.config, self.state
        n, total = b.size, float(cfg.global_batch)
        if not self._continues(b):
            # First call, a new worker set, or a split set from outside: start from what ran.
            st.allocation, st.integral = b.copy(), np.zeros(n)
            st.rates, st.readings = rates.copy(), np.ones(n)
        else:
            self._filter(rates)
        st.adjustments += 1
        predicted = b / st.rates
        spread = predicted.max() / predicted.min() - 1
        if spread < cfg.deadband:
            st.integral = np.zeros(n)
            return st.allocation
        error = total * st.rates / st.rates.sum() - st.allocation
        if spread > cfg.fast_threshold:
            # A real change: take the whole proportional step and integrate nothing.
            st.integral = np.zeros(n)
            move = error
        else:
            same_sign = np.sign(error) == np.sign(st.integral)
            st.integral = np.where(same_sign, st.integral + error, error)
            move = cfg.gain * error + cfg.integral_gain * st.integral
        st.allocation = self._moved(st.allocation, move)
        return st.allocation

    def _model_step(self, b: np.ndarray, t: np.ndarray, e: np.ndarray,
                    proportional: np.ndarray) -> np.ndarray:
        """One "model" adjustment from readings `b`, `t` with errors `e`; `proportional` is
        "p"'s split of the same readings, which floors the target (see the module)."""
        cfg, st = self.config, self.state
        n, total = b.size, float(cfg.global_batch)
        if st.moments is None or len(st.moments) != 7 or not self._continues(b):
            # First call, a new worker set, a split set from outside, or the state of a
            # version that kept no errors: no readings.
            st.moments, st.fixed = np.zeros((7, n)), np.full(n, np.nan)
            st.persist = np.zeros((2, n))
        else:
            fixed, slope, calibrated, mean_b = self._fit()
            # An uncalibrated line runs through the origin and its readings' mean, so an
            # unknown fixed cost puts its prediction anywhere between the reading's time and
            # that time times b / mean_b: a change must be off the line by more than that.
            leeway = np.where(calibrated, 0.0, np.abs(np.log(b / mean_b)))
            miss = np.log(t / (fixed + slope * b))
            changed = np.abs(miss) > max(np.log1p(cfg.change_threshold),
                                         _CHANGE_SIGMAS * st.scatter) + leeway
            changed |= self._persists(miss, leeway, e, changed, calibrated)
            st.moments[:, changed], st.fixed[changed] = 0.0, np.nan
            st.persist[:, changed] = 0.0
            self.changed = changed
            self._fold_scatter(miss[calibrated & ~changed])
        # In place: a new 7 x n array per adjustment cost more than the rest of the
        # adjustment at 4096 workers (glibc maps arrays that large afresh each time).
        u = 1 / (t * t)
        ub = u * b
        st.moments *= cfg.forget
        for row, reading in zip(st.moments, (1.0, e * e, u, ub, u * t, ub * b, ub * t)):
            row += reading
        st.adjustments += 1
        fixed, slope = self._fit()[:2]
        st.allocation = b.copy()
        predicted = fixed + slope * b
        if predicted.max() / predicted.min() - 1 < cfg.deadband:
            return st.allocation
        lowest, highest = cfg.bounds
        floor = np.minimum(np.maximum(_PROPORTIONAL_FLOOR * proportional, lowest), highest)
        target = _water_fill(1 / slope, total, floor if floor.sum() <= total else lowest,
                             highest, fixed / slope)
        st.allocation = self._moved(b, target - b)
        return st.allocation

    def _persists(self, miss: np.ndarray, leeway: np.ndarray, e: np.ndarray,
                  changed: np.ndarray, calibrated: np.ndarray) -> np.ndarray:
        """Which workers' misses have kept one sign long enough to be a change of speed too
        small for the threshold (see the module docstring): each CUSUM adds the miss less
        the median of the calibrated unchanged workers' (a shared change; with three of them
        or more), beyond the leeway, in standard errors (the reading's, the scatter's and
        `_PERSIST_FLOOR` combined) less `_PERSIST_ALLOWANCE`, floored at 0."""
        st = self.state
        if st.persist is None or st.persist.shape != (2, miss.size):
            st.persist = np.zeros((2, miss.size))
        sigma = np.sqrt(e * e + st.scatter ** 2 + _PERSIST_FLOOR ** 2)
        shared = miss[calibrated & ~changed & np.isfinite(miss)]
        if shared.size >= 3:
            miss = miss - _median(shared)
        beyond = np.sign(miss) * np.maximum(np.abs(miss) - leeway, 0.0)
        z = np.where(changed | ~np.isfinite(beyond), 0.0, beyond / sigma)
        st.persist[0] = np.maximum(st.persist[0] + z - _PERSIST_ALLOWANCE, 0.0)
        st.persist[1] = np.maximum(st.persist[1] - z - _PERSIST_ALLOWANCE, 0.0)
        return st.persist.max(axis=0) > _PERSIST_LIMIT

    def _fold_scatter(self, misses: np.ndarray) -> None:
        """Fold the misses' spread into the state's running estimate: their robust spread
        about their median (a change every worker shares, such as a slower network, is not
        scatter), forgotten like the readings. `misses` are those of the calibrated workers
        not taken for changes of speed. An uncalibrated line's miss says only whether the
        reading fits some fixed cost, and a change's miss is the change: on 2 ranks whose
        slowdown swapped (ResNet-18, 1,8 to 8,1) misses of +-2.1 set the scatter to 1.3 in
        log units, every fit then counted as noise, the change test went blind, and the
        split held an imbalance of 1.3. Left out, changes cut the misses at 3 times the
        estimate, which costs it little: a normal spread cut at 1.5 times itself reads 0.85
        of itself, at 2.5 times 0.99, so the estimate climbs to the spread within a few
        adjustments."""
        st, forget = self.state, self.config.forget
        misses = misses[np.isfinite(misses)]
        if misses.size < 2:
            return
        spread = _robust_sigma(misses, _median(misses))
        weight = forget * st.scatter_weight
        st.scatter_weight = weight + 1
        st.scatter = float(np.sqrt((weight * st.scatter ** 2 + spread ** 2) / st.scatter_weight))

    def _continues(self, b: np.ndarray) -> bool:
        """Whether `b` is the split this controller chose last (else: the first call, a new
        worker set, or a split set from outside)."""
        allocation = self.state.allocation
        return (allocation is not None and allocation.size == b.size
                and abs(allocation.sum() - self.config.global_batch)
                <= 1e-8 + 1e-5 * self.config.global_batch
                and not np.any(np.abs(allocation - b) >= 1))

    def _moved(self, start: np.ndarray, move: np.ndarray) -> np.ndarray:
        """`start` moved by `move`, each worker by at most `max_change` x B, then shared out
        to sum to B within the bounds."""
        cfg = self.config
        limit = max(cfg.max_change * cfg.global_batch, 1.0)
        proposal = start + np.minimum(np.maximum(move, -limit), limit)
        return _water_fill(np.maximum(proposal, 1e-9), float(cfg.global_batch), *cfg.bounds)

    def _fit(self) -> tuple:
        """`_lines()` of the current moments, computed once per adjustment."""
        st, fitted = self.state, self._fitted
        if fitted is None or fitted[0] is not st.moments or fitted[1] != st.adjustments:
            self._fitted = fitted = (st.moments, st.adjustments, self._lines())
        return fitted[2]

    def _lines(self) -> tuple:
        """Each worker's time model t = fixed + slope * b from its weighted readings (see
        the module docstring), whether it is calibrated (fitted now, or holding an earlier
        fit's fixed cost), and the mean batch of its readings. Records the fixed costs
        fitted now."""
        st, cfg = self.state, self.config
        weight, sum_ee, precision, sum_b, sum_t, sum_bb, sum_bt = st.moments
        with np.errstate(invalid="ignore", divide="ignore"):
            mean_b, mean_t = sum_b / precision, sum_t / precision
            var_b = np.maximum(sum_bb / precision - mean_b * mean_b, 0.0)
            slope = (sum_bt / precision - mean_b * mean_t) / var_b
            fixed = mean_t - slope * mean_b
            # Two exact readings or more, three given with errors (see the module), whose
            # batches spread enough for the fixed share f = fixed / mean_t the fit claims: a
            # move to the equal-time point is 1 / (1 - f) times the proportional one, and so
            # is the noise it carries, so a fit needs its batches spread by identify / (1 - f).
            # k readings weigh (1 - forget^k) memory; the bar is half way from k - 1 to k.
            older = np.where(sum_ee > 0, cfg.forget ** 2, cfg.forget)
            fitted = (weight > (1 - older) * cfg.memory + older / 2) & (slope > 0)
            # A negative fixed cost is refitted as 0: the line through the origin.
            noise = np.maximum(sum_ee / weight, st.scatter ** 2)
            shrunk = _shrunk(fixed, noise * sum_bb / (precision ** 2 * var_b), fitted)
            fixed = np.where(fitted, np.maximum(shrunk, 0.0), fixed)
            slope = np.where(fitted, (sum_bt - fixed * sum_b) / sum_bb, slope)
            fitted &= np.sqrt(var_b) * (mean_t - fixed) >= cfg.identify * mean_b * mean_t
            st.fixed = np.where(fitted, fixed, st.fixed)
            known = ~fitted & (st.fixed < mean_t)
            fixed = np.where(fitted, fixed, np.where(known, st.fixed, 0.0))
            slope = np.where(fitted, slope, (mean_t - fixed) / mean_b)
        return fixed, slope, fitted | known, mean_b

    def _filter(self, rates: np.ndarray) -> None:
        """Fold one reading per worker into its running mean, restarting it on a real change."""
        st = self.state
        self.changed = changed = np.abs(rates / st.rates - 1) > self.config.change_threshold
        st.readings = np.where(changed, 1.0, np.minimum(st.readings + 1, self.config.memory))
        st.rates = np.where(changed, rates, st.rates + (rates - st.rates) / st.readings)

    def _round(self, allocation: np.ndarray) -> np.ndarray:
        cfg = self.config
        return apportion(allocation, cfg.global_batch, cfg.min_batch, cfg.max_batch)
