"""Learning-rate rules: a base schedule, and a rescale when the global batch changes.

The learning rate at step t is

    lr(t) = lr0 * base(t) * scale(t)

where `base` is the user's schedule (constant, linear warm-up, step decay) and `scale` follows
the global batch B relative to the batch B0 that lr0 was tuned for. A change of B (an elastic
job growing or shrinking under the `scale` policy) asks a `ScalingRule` for the new target
scale and for how many steps the move to it should take:

* `none`:   the scale stays 1.
* `linear`: jump at once to B / B0 (Goyal et al. 2017, "Accurate, Large Minibatch SGD").
* `sqrt`:   jump at once to sqrt(B / B0) (Krizhevsky 2014, "One weird trick").
* `smooth`: move linearly from the current scale to B / B0 over T steps (Lin et al. 2019,
  "Dynamic Mini-batch SGD for Elastic Distributed Training": momentum still carries the old
  batch's gradient noise for a while, so an immediate linear jump destabilises training).
  T = steps_per_ratio * max(r, 1/r) for a batch change by factor r, so a larger change is
  spread over more steps, as the paper suggests; `steps_per_ratio` is settable.

Everything here is pure: the schedule's state is a few numbers, saved with the job.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Sequence

from ..errors import DynBatchError


class ScalingRule:
    """How the learning-rate scale answers a change of the global batch."""

    name = "none"

    def target(self, batch_ratio: float) -> float:
        """The scale for a global batch `batch_ratio` times the base batch B0."""
        return 1.0

    def ramp_steps(self, change_ratio: float) -> int:
        """Steps over which to move to the new target after the batch changed by this factor."""
        return 0


class LinearScaling(ScalingRule):
    name = "linear"

    def target(self, batch_ratio: float) -> float:
        return batch_ratio


class SqrtScaling(ScalingRule):
    name = "sqrt"

    def target(self, batch_ratio: float) -> float:
        return math.sqrt(batch_ratio)


class SmoothScaling(LinearScaling):
    name = "smooth"

    def __init__(self, steps_per_ratio: int = 20):
        if steps_per_ratio < 1:
            raise DynBatchError(f"the smooth rule's steps per ratio must be positive, "
                                f"got {steps_per_ratio}")
        self.steps_per_ratio = steps_per_ratio

    def ramp_steps(self, change_ratio: float) -> int:
        return math.ceil(self.steps_per_ratio * max(change_ratio, 1.0 / change_ratio))


RULES = {"none": ScalingRule, "linear": LinearScaling, "sqrt": SqrtScaling,
         "smooth": SmoothScaling}


def scaling_rule(name: str, smooth_steps: int = 20) -> ScalingRule:
    """The rule called `name`; `smooth_steps` is the smooth rule's steps per batch ratio."""
    if name not in RULES:
        raise DynBatchError(f"unknown learning-rate rule '{name}'; choose one of "
                            f"{', '.join(RULES)}")
    return SmoothScaling(smooth_steps) if name == "smooth" else RULES[name]()


@dataclass(frozen=True)
class BaseSchedule:
    """The user's schedule as a factor on lr0: linear warm-up, then step decay."""

    warmup_steps: int = 0
    decay_steps: Sequence[int] = ()
    decay_factor: float = 0.1

    def __post_init__(self):
        if self.warmup_steps < 0:
            raise DynBatchError(f"--warmup-steps must not be negative, got {self.warmup_steps}")
        if list(self.decay_steps) != sorted(set(self.decay_steps)) or any(
                s < 1 for s in self.decay_steps):
            raise DynBatchError(f"--lr-decay-steps must be increasing positive steps, got "
                                f"{list(self.decay_steps)}")
        if not 0 < self.decay_factor <= 1:
            raise DynBatchError(f"--lr-decay must be in (0, 1], got {self.decay_factor}")

    def factor(self, step: int) -> float:
        warm = min(1.0, (step + 1) / self.warmup_steps) if self.warmup_steps else 1.0
        decays = sum(1 for s in self.decay_steps if step >= s)
        return warm * self.decay_factor ** decays


@dataclass
class ScaleState:
    """Where the batch rescale stands: a ramp from `start_scale` to `end_scale`."""

    base_batch: int
    batch: int
    start_scale: float = 1.0
    end_scale: float = 1.0
    ramp_start: int = 0
    ramp_steps: int = 0


class LRSchedule:
    """lr0 x base schedule x batch rescale, stepped by the training loop.

    Call `lr(step)` for the rate of a step and `on_batch_change(step, batch)` when the global
    batch changes; `state_dict()` holds all there is to save.
    """

    def __init__(self, lr0: float, base_batch: int, rule: ScalingRule,
                 base: BaseSchedule = BaseSchedule()):
        self.lr0, self.rule, self.base = lr0, rule, base
        self.state = ScaleState(base_batch=base_batch, batch=base_batch)

    def scale(self, step: int) -> float:
        s = self.state
        if s.ramp_steps == 0 or step >= s.ramp_start + s.ramp_steps:
            return s.end_scale
        done = max(0, step - s.ramp_start) / s.ramp_steps
        return s.start_scale + (s.end_scale - s.start_scale) * done

    def lr(self, step: int) -> float:
        return self.lr0 * self.base.factor(step) * self.scale(step)

    def on_batch_change(self, step: int, batch: int) -> None:
        """The global batch is `batch` from `step` on: set the rule's target and ramp."""
        if batch < 1:
            raise DynBatchError(f"the global batch must be positive, got {batch}")
        s = self.state
        if batch == s.batch:
            return
        current = self.scale(step)
        self.state = ScaleState(base_batch=s.base_batch, batch=batch, start_scale=current,
                                end_scale=self.rule.target(batch / s.base_batch),
                                ramp_start=step,
                                ramp_steps=self.rule.ramp_steps(batch / s.batch))

    def state_dict(self) -> dict:
        return asdict(self.state)

    def load_state_dict(self, state: dict) -> None:
        self.state = ScaleState(**state)
