"""The training loop: static or dynamic batching of one model on every rank of a Horovod job.

`train(TrainConfig(...))` is what `hvd-dynbatch train` runs on each rank; a user's own script
can call it too, or use the pieces it is made of (the sampler, the weighted optimizer, the
timer, the controller, the communicator) the same way.

One step on rank i: take the next step's slice from the sampler, forward and backward on it
with the gradient weighted by b_i / B (with a sleep between the two if heterogeneity is
emulated), then the optimizer step (where Horovod's allreduce completes). The compute time
(data to the end of backward, emulated slowdown included) goes to the timer; the wait for
other ranks does not.

Every `adjust_every` steps the ranks exchange, in one all-gather, each step's (batch size,
compute time, loss) and their smoothed compute time; with dynamic batching the controller then
computes the next split, the same on every rank.
"""
from __future__ import annotations

import enum
import math
import os
import time
from dataclasses import asdict, dataclass
from typing import Optional, Sequence

import numpy as np
import torch
import torch.nn.functional as F

from .comm import Communicator
from .controller import BatchController, ControllerConfig, Rule
from .data import load_dataset
from .errors import DynBatchError
from .heterogeneity import Emulator, Slowdown
from .metrics import MetricsWriter
from .models import build_model
from .sampler import VariableBatchSampler
from .timing import StepTimer


class Batching(str, enum.Enum):
    """How the global batch is split over the ranks."""

    STATIC = "static"    # evenly, never changed
    DYNAMIC = "dynamic"  # by measured speed, through the batch controller


@dataclass(frozen=True)
class TrainConfig:
    """Everything one training run needs; checked on construction.

    The run ends after `epochs` epochs, after `max_steps` steps, or when the test accuracy
    reaches `target_accuracy`, whichever comes first. The test set is evaluated every
    `eval_every` steps (0: at the end of each epoch) and at the end.
    """

    model: str = "mlp"
    dataset: str = "digits"
    data_dir: Optional[str] = None
    image_size: int = 64
    global_batch: int = 64
    lr: float = 0.05
    momentum: float = 0.9
    seed: int = 0
    epochs: int = 1
    max_steps: Optional[int] = None
    batching: Batching = Batching.DYNAMIC
    controller: Rule = Rule.PID
    adjust_every: int = 5
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
    progress: bool = True

    def __post_init__(self):
        object.__setattr__(self, "batching", Batching(self.batching))
        object.__setattr__(self, "controller", Rule(self.controller))
        for name in ("global_batch", "epochs", "adjust_every", "min_batch", "timing_window",
                     "threads", "image_size"):
            if getattr(self, name) < 1:
                raise DynBatchError(f"--{name.replace('_', '-')} must be positive, "
                                    f"got {getattr(self, name)}")
        for name in ("max_steps", "max_batch"):
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
        if self.slowdown:
            Slowdown.parse(self.slowdown)

    def controller_config(self) -> ControllerConfig:
        return ControllerConfig(global_batch=self.global_batch, min_batch=self.min_batch,
                                max_batch=self.max_batch, rule=self.controller)

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


def train(config: TrainConfig, comm: Optional[Communicator] = None) -> dict:
    """Run `config` on this rank of a Horovod job and return the summary record.

    Collective: every rank of the job must call it with the same configuration. Initialises
    Horovod if needed. Raises `DynBatchError` for configuration that cannot work.
    """
    import horovod.torch as hvd

    from .comm import for_horovod

    hvd.init()
    torch.set_num_threads(config.threads)
    return Trainer(config, comm or for_horovod()).run()


class Trainer:
    """The state of one run and the steps that move it; see the module docstring."""

    def __init__(self, config: TrainConfig, comm: Communicator):
        import horovod.torch as hvd

        from .weighting import DistributedOptimizer

        self.cfg, self.comm = config, comm
        self.rank, self.size = comm.rank, comm.size
        slowdown = Slowdown.parse(config.slowdown) if config.slowdown else None
        if slowdown is not None:
            slowdown.check_world(self.size)
        self.emulator = Emulator(slowdown, self.rank)
        self.controller = BatchController(config.controller_config())
        split = config.first_split(self.size, self.controller)
        self.data = load_dataset(config.dataset, config.data_dir, config.seed, config.image_size)

        torch.manual_seed(config.seed)
        self.model = build_model(config.model, self.data.input_shape, self.data.num_classes)
        hvd.broadcast_parameters(self.model.state_dict(), root_rank=0)
        optimizer = torch.optim.SGD(self.model.parameters(), lr=config.lr,
                                    momentum=config.momentum)
        self.optimizer = DistributedOptimizer(optimizer,
                                              named_parameters=self.model.named_parameters())
        self.sampler = VariableBatchSampler(len(self.data.train), self.rank, split, config.seed)
        self.timer = StepTimer(config.timing_window)
        self.metrics = MetricsWriter(config.metrics if self.rank == 0 else None)

        self.step = 0
        self.train_seconds = 0.0      # the training clock; evaluation does not count
        self.exchange_seconds = 0.0   # of which: timing exchange and controller
        self.samples = 0
        self.pending = []             # this rank's (batch, compute, loss) since the last exchange
        self.pending_info = []        # rank 0's own per-step facts for the same steps
        self.last_loss = math.nan
        self.accuracy = None
        self.time_to_target = None
        self.evaluations = []

    # -- the run -----------------------------------------------------------------------------

    def run(self) -> dict:
        cfg = self.cfg
        total = self._planned_steps()
        progress = self._progress_bar(total)
        try:
            while self.step < total and self.time_to_target is None:
                epoch_before = self.sampler.epoch
                self._train_step()
                if self.step % cfg.adjust_every == 0 or self.step == total:
                    self._exchange()
                    if progress is not None:
                        progress.update(self.step - progress.n)
                        progress.set_postfix(loss=f"{self.last_loss:.3f}",
                                             split=",".join(map(str, self.sampler.batch_sizes)))
                epoch_end = self.sampler.epoch != epoch_before
                if (cfg.eval_every and self.step % cfg.eval_every == 0) or \
                        (not cfg.eval_every and epoch_end):
                    self._exchange()
                    self._evaluate()
            self._exchange()
            if not self.evaluations or self.evaluations[-1]["step"] != self.step:
                self._evaluate()
        finally:
            if progress is not None:
                progress.close()
        summary = self._summary()
        self.metrics.write(summary)
        self.metrics.close()
        if self.rank == 0 and cfg.save_model:
            _save_atomically(self.model.state_dict(), cfg.save_model)
        return summary

    def _planned_steps(self) -> int:
        steps = self.cfg.epochs * self.sampler.steps_per_epoch()
        return steps if self.cfg.max_steps is None else min(steps, self.cfg.max_steps)

    def _progress_bar(self, total: int):
        if self.rank != 0 or not self.cfg.progress:
            return None
        from tqdm import tqdm

        # disable=None: shown on a terminal, silent in logs and pipes.
        return tqdm(total=total, unit="step", disable=None, dynamic_ncols=True)

    def _train_step(self) -> None:
        plan = self.sampler.next_step()
        local = len(plan.indices)
        started = time.perf_counter()
        x, y = self.data.train.fetch(plan.indices)
        self.model.train()
        self.optimizer.zero_grad()
        self.optimizer.set_batch_size(local, plan.global_size)
        if local:
            loss = F.cross_entropy(self.model(x), y)
            loss_value = loss.item()
        else:
            # An empty slice (the end of an epoch) still joins the allreduce, with zeros.
            loss = sum((p * 0).sum() for p in self.model.parameters())
            loss_value = 0.0
        forward = time.perf_counter() - started
        self.emulator.after_forward(self.step, forward)
        backward_started = time.perf_counter()
        loss.backward()
        self.emulator.after_backward(forward, time.perf_counter() - backward_started)
        compute = time.perf_counter() - started
        if plan.sizes == self.sampler.batch_sizes:
            self.timer.record(compute)
        self.optimizer.step()
        step_time = time.perf_counter() - started
        self.train_seconds += step_time
        self.samples += plan.global_size
        self.pending.append((plan.sizes[self.rank], compute, loss_value))
        self.pending_info.append({"step": self.step, "epoch": plan.epoch,
                                  "time": self.train_seconds, "step_time": step_time,
                                  "global_batch": plan.global_size,
                                  "lr": self.optimizer.param_groups[0]["lr"]})
        self.step += 1

    def _exchange(self) -> None:
        """Gather the pending steps' facts, write their metrics, and let the controller act.

        Collective: every rank calls it at the same steps (the same number pending).
        """
        if not self.pending:
            return
        started = time.perf_counter()
        row = [self.timer.smoothed, *np.ravel(self.pending)]
        gathered = self.comm.allgather(row)
        smoothed, per_step = gathered[:, 0], gathered[:, 1:].reshape(self.size, -1, 3)
        for k, info in enumerate(self.pending_info):
            sizes, computes, losses = per_step[:, k, 0], per_step[:, k, 1], per_step[:, k, 2]
            self.last_loss = float(np.dot(sizes, losses) / sizes.sum())
            self.metrics.write({**info, "world_size": self.size,
                                "batch_sizes": sizes.astype(int).tolist(),
                                "compute_times": computes.tolist(), "loss": self.last_loss})
        self.pending, self.pending_info = [], []
        if self.cfg.batching is Batching.DYNAMIC:
            current = self.sampler.batch_sizes
            split = tuple(int(b) for b in self.controller.update(current, smoothed))
            if split != current:
                self.sampler.batch_sizes = split
                self.timer.reset()
        # The exchange and the controller are overhead of the training clock too.
        elapsed = time.perf_counter() - started
        self.train_seconds += elapsed
        self.exchange_seconds += elapsed

    def _evaluate(self) -> None:
        """Test accuracy and loss over the whole test set, each rank taking a share.

        Collective: every rank calls it at the same step.
        """
        test = self.data.test
        mine = np.arange(self.rank, len(test), self.size)
        self.model.eval()
        correct, loss_sum = 0.0, 0.0
        with torch.no_grad():
            for start in range(0, len(mine), 512):
                x, y = test.fetch(mine[start:start + 512])
                out = self.model(x)
                correct += (out.argmax(1) == y).sum().item()
                loss_sum += F.cross_entropy(out, y, reduction="sum").item()
        totals = self.comm.allgather([correct, loss_sum, len(mine)]).sum(axis=0)
        self.accuracy = float(totals[0] / totals[2])
        record = {"type": "eval", "step": self.step, "epoch": self.sampler.epoch,
                  "time": self.train_seconds, "accuracy": self.accuracy,
                  "test_loss": float(totals[1] / totals[2])}
        self.evaluations.append(record)
        self.metrics.write(record)
        target = self.cfg.target_accuracy
        if target is not None and self.time_to_target is None and self.accuracy >= target:
            self.time_to_target = self.train_seconds

    def _summary(self) -> dict:
        cfg = self.cfg
        return {
            "type": "summary",
            "batching": cfg.batching.value,
            "controller": cfg.controller.value if cfg.batching is Batching.DYNAMIC else None,
            "world_size": self.size,
            "exchange_backend": self.comm.backend,
            "steps": self.step,
            "epochs_completed": self.sampler.epoch,
            "samples": self.samples,
            "train_seconds": self.train_seconds,
            "samples_per_sec": self.samples / self.train_seconds if self.train_seconds else 0.0,
            "exchange_seconds": self.exchange_seconds,
            "final_loss": self.last_loss,
            "final_accuracy": self.accuracy,
            "target_accuracy": cfg.target_accuracy,
            "time_to_target": self.time_to_target,
            "final_split": list(self.sampler.batch_sizes),
            "config": {k: (v.value if isinstance(v, enum.Enum) else v)
                       for k, v in asdict(cfg).items()},
        }


def _save_atomically(state_dict: dict, path: str) -> None:
    """Write to a temporary file beside `path`, then rename: no half-written model."""
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    tmp = f"{path}.tmp.{os.getpid()}"
    torch.save(state_dict, tmp)
    os.replace(tmp, path)
