"""The configuration of a training run: one frozen dataclass, checked on construction.

Light on purpose (numpy, no torch, no Horovod): the CLI and every rank validate it before
anything collective starts, so a bad value fails fast with the same message everywhere.
"""
from __future__ import annotations

import enum
import math
from dataclasses import asdict, dataclass
from typing import Optional, Sequence, Tuple

import numpy as np

from ..backend.device import check_amp, check_device_spec
from ..core.abs_sgd import WindowRule
from ..core.controller import BatchController, ControllerConfig, Rule
from ..core.heterogeneity import Slowdown
from ..core.lr import RULES, BaseSchedule
from ..core.timing import HOLD_SECONDS
from ..errors import DynBatchError


class Batching(str, enum.Enum):
    """How the global batch is split over the ranks."""

    STATIC = "static"    # evenly, never changed
    DYNAMIC = "dynamic"  # by measured speed, through the batch controller
    ABS = "abs"          # no plan: ABS-SGD compute windows of micro-batches


class OnNan(str, enum.Enum):
    """What a step whose reduced gradient is not finite does to the run (it is never applied)."""

    STOP = "stop"  # end the run on every rank with an error
    SKIP = "skip"  # go on with the next step


class BatchPolicy(str, enum.Enum):
    """What happens to the global batch when an elastic job's world size changes."""

    FIXED = "fixed"  # B stays; the split is recomputed for the new workers
    SCALE = "scale"  # B = b0 * N, b0 the per-worker batch of the starting world


class Staleness(str, enum.Enum):
    """ABS-SGD's compensation of its one-window-stale gradient (see `staleness`)."""

    NONE = "none"
    PREDICT = "predict"      # weight prediction
    MOMENTUM = "momentum"    # momentum correction
    DC = "dc"                # delay compensation (DC-ASGD)


@dataclass(frozen=True)
class TrainConfig:
    """Everything one training run needs; checked on construction.

    The run ends after `epochs` epochs, after `max_steps` steps, or when the test accuracy
    reaches `target_accuracy`, whichever comes first; with neither `epochs` nor `max_steps`
    it runs one epoch, and `max_steps` alone sets its length. The test set is evaluated every
    `eval_every` steps (0: at the end of each epoch) and at the end.

    `controller_gain` and `integral_gain` are the "pid" rule's (see `controller`),
    `window_gain` the ABS-SGD window rule's (see `abs_sgd`); their defaults are those
    modules' own.

    A step whose reduced gradient is not finite (a NaN or infinite loss) is not applied;
    `on_nan` says whether the run then stops (on every rank, with an error) or goes on (the
    summary counts such steps), up to `skip_limit` such steps in a row, where it stops as
    under "stop". Under `amp` "fp16" a step whose scaled gradient overflowed is
    skipped and the loss scale lowered, whatever `on_nan` says (the summary counts those
    apart). `fp16_allreduce` sends the gradients as float16 (Horovod's compression);
    `channels_last` lays images out NHWC, and `cudnn_benchmark` lets cuDNN time its
    convolution algorithms for each new input shape, on a GPU (see `device`).

    An image that cannot be decoded stops the run with an error naming it; with
    `skip_bad_samples` the next readable sample takes its place, and the summary counts it.

    With `checkpoint_dir`, rank 0 writes a checkpoint there every `checkpoint_every` steps
    and at the end, keeping the newest `checkpoint_keep`; with `resume`, the run continues
    from the newest one (or starts fresh if there is none), counting its steps and epochs
    from the start of the whole run (see `checkpoint`).

    With `elastic`, the run survives workers joining and leaving (Horovod Elastic), committing
    its state every `commit_every` steps; `batch_policy` and `lr_rule` say what a change of
    world size does to the global batch and the learning rate (`lr_rule` None: `smooth`
    under the `scale` policy, `none` under `fixed`).
    """

    model: str = "mlp"
    dataset: str = "digits"
    data_dir: Optional[str] = None
    image_size: Optional[int] = None
    global_batch: int = 64
    lr: float = 0.05
    momentum: float = 0.9
    seed: int = 0
    epochs: Optional[int] = None
    max_steps: Optional[int] = None
    batching: Batching = Batching.DYNAMIC
    controller: Rule = Rule.MODEL
    controller_gain: float = ControllerConfig.gain
    integral_gain: float = ControllerConfig.integral_gain
    adjust_every: int = 5
    hold_seconds: float = HOLD_SECONDS
    min_batch: int = 1
    max_batch: Optional[int] = None
    initial_split: Optional[Sequence[int]] = None
    slowdown: Optional[str] = None
    timing_window: int = 5
    eval_every: int = 0
    target_accuracy: Optional[float] = None
    metrics: Optional[str] = None
    save_model: Optional[str] = None
    threads: int = 1
    device: str = "auto"
    amp: str = "off"
    fp16_allreduce: bool = False
    channels_last: bool = False
    cudnn_benchmark: bool = False
    loader_workers: int = 0
    progress: bool = True
    warmup_steps: int = 0
    lr_decay_steps: Sequence[int] = ()
    lr_decay: float = 0.1
    elastic: bool = False
    batch_policy: BatchPolicy = BatchPolicy.FIXED
    lr_rule: Optional[str] = None
    smooth_steps: int = 20
    commit_every: int = 10
    sample_log: Optional[str] = None
    batch_schedule: Sequence[Tuple[int, int]] = ()
    micro_batch: int = 8
    window_gain: float = WindowRule.gain
    staleness: Staleness = Staleness.PREDICT
    on_nan: OnNan = OnNan.STOP
    skip_limit: int = 10
    skip_bad_samples: bool = False
    checkpoint_dir: Optional[str] = None
    checkpoint_every: int = 100
    checkpoint_keep: int = 3
    resume: bool = False

    def __post_init__(self):
        object.__setattr__(self, "batching", Batching(self.batching))
        object.__setattr__(self, "controller", Rule(self.controller))
        object.__setattr__(self, "batch_policy", BatchPolicy(self.batch_policy))
        object.__setattr__(self, "on_nan", OnNan(self.on_nan))
        object.__setattr__(self, "staleness", Staleness(self.staleness))
        object.__setattr__(self, "lr_decay_steps", tuple(self.lr_decay_steps or ()))
        object.__setattr__(self, "batch_schedule",
                           tuple((int(s), int(b)) for s, b in self.batch_schedule or ()))
        steps = [s for s, _ in self.batch_schedule]
        if steps != sorted(set(steps)) or any(s < 1 or b < 1 for s, b in self.batch_schedule):
            raise DynBatchError(f"--batch-schedule needs increasing positive steps and positive "
                                f"batches, got {self.batch_schedule}")
        if self.batching is Batching.ABS and (self.elastic or self.batch_schedule):
            raise DynBatchError("--batching abs runs on a fixed set of workers and a fixed "
                                "target batch: drop --elastic and --batch-schedule")
        if self.batching is Batching.ABS and (self.amp == "fp16" or self.fp16_allreduce):
            raise DynBatchError("--batching abs has no loss scaling and reduces its windows "
                                "itself: use --amp bf16 (no scaling needed), and drop "
                                "--fp16-allreduce")
        if self.batch_schedule and self.elastic:
            raise DynBatchError("--batch-schedule is for non-elastic runs; an elastic run's "
                                "batch follows its workers (--batch-policy scale)")
        if self.resume and not self.checkpoint_dir:
            raise DynBatchError("--resume continues from the newest checkpoint in "
                                "--checkpoint-dir: give the directory")
        if self.lr_rule is None:
            object.__setattr__(self, "lr_rule", "smooth" if self.batch_policy is
                               BatchPolicy.SCALE else "none")
        if self.lr_rule not in RULES:
            raise DynBatchError(f"unknown --lr-rule '{self.lr_rule}'; choose one of "
                                f"{', '.join(RULES)}")
        for name in ("global_batch", "adjust_every", "min_batch", "timing_window",
                     "threads", "smooth_steps", "commit_every", "micro_batch",
                     "checkpoint_every", "checkpoint_keep", "skip_limit"):
            if getattr(self, name) < 1:
                raise DynBatchError(f"--{name.replace('_', '-')} must be positive, "
                                    f"got {getattr(self, name)}")
        if self.image_size is not None and self.image_size < 1:
            raise DynBatchError(f"--image-size must be positive, got {self.image_size}")
        if not 0 <= self.hold_seconds < math.inf:
            raise DynBatchError(f"--hold-seconds must be a number of seconds >= 0, got "
                                f"{self.hold_seconds}")
        if self.loader_workers < 0:
            raise DynBatchError(f"--loader-workers must not be negative, got {self.loader_workers}")
        for name in ("epochs", "max_steps", "max_batch"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise DynBatchError(f"--{name.replace('_', '-')} must be positive, got {value}")
        if self.lr <= 0 or not math.isfinite(self.lr):
            raise DynBatchError(f"--lr must be a positive number, got {self.lr}")
        if not 0 <= self.momentum < 1:
            raise DynBatchError(f"--momentum must be in [0, 1), got {self.momentum}")
        if self.eval_every < 0:
            raise DynBatchError(f"--eval-every must not be negative, got {self.eval_every}")
        if self.target_accuracy is not None and not 0 < self.target_accuracy <= 1:
            raise DynBatchError(f"--target-accuracy must be in (0, 1], got {self.target_accuracy}")
        # Checked here, on every rank, so that a bad value fails before any collective.
        self.controller_config()
        self.window_rule()
        self.base_schedule()
        if self.slowdown:
            Slowdown.parse(self.slowdown)
        check_device_spec(self.device)
        check_amp(self.amp)

    def plain(self) -> dict:
        """The settings as plain values (each enum as its value): what a run's summary
        records, and what `benchmarks/replay.py` rebuilds a run's settings from."""
        return {k: (v.value if isinstance(v, enum.Enum) else v) for k, v in asdict(self).items()}

    def controller_config(self, global_batch: Optional[int] = None,
                          least_batch: int = 1) -> ControllerConfig:
        """The controller's settings, for `global_batch` (default: the configured one), with
        the minimum batch raised to `least_batch` (what the model can train on)."""
        return ControllerConfig(global_batch=global_batch or self.global_batch,
                                min_batch=max(self.min_batch, least_batch),
                                max_batch=self.max_batch, rule=self.controller,
                                gain=self.controller_gain, integral_gain=self.integral_gain)

    def window_rule(self) -> WindowRule:
        """ABS-SGD's compute-window rule for the target global batch."""
        return WindowRule(self.global_batch, self.window_gain)

    def planned_steps(self, steps_per_epoch: int) -> int:
        """How many steps the run takes at most, given the steps of one epoch."""
        if self.max_steps is None:
            return (self.epochs or 1) * steps_per_epoch
        if self.epochs is None:
            return self.max_steps
        return min(self.max_steps, self.epochs * steps_per_epoch)

    def base_schedule(self) -> BaseSchedule:
        return BaseSchedule(self.warmup_steps, self.lr_decay_steps, self.lr_decay)

    def global_batch_for(self, world_size: int, start_world_size: int, step: int = 0) -> int:
        """B at `step` for `world_size` workers: the batch schedule's value, scaled under the
        `scale` policy by the workers gained or lost since the start (`start_world_size`)."""
        batch = self.global_batch
        for start, scheduled in self.batch_schedule:
            if step >= start:
                batch = scheduled
        if self.batch_policy is BatchPolicy.FIXED:
            return batch
        return max(1, round(batch * world_size / start_world_size))

    def first_split(self, world_size: int, controller: BatchController) -> np.ndarray:
        """The split of the first step: `initial_split` if given, else an even one."""
        even = controller.initial_split(world_size)
        if self.initial_split is None:
            return even
        split = np.asarray(self.initial_split, dtype=np.int64)
        cfg = controller.config
        if (split.size != world_size or split.sum() != self.global_batch
                or split.min() < cfg.min_batch
                or (cfg.max_batch is not None and split.max() > cfg.max_batch)):
            raise DynBatchError(
                f"--initial-split {','.join(map(str, split))} must have {world_size} sizes "
                f"within [{cfg.min_batch}, {cfg.max_batch or self.global_batch}] summing to "
                f"--global-batch {self.global_batch}")
        return split


