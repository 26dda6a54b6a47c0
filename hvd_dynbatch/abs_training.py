"""The ABS-SGD training step (see `abs_sgd` for the method and its window rule).

`ABSTrainer` is the training loop of `training.Trainer` with another step: one step is one
compute window of micro-batches, closed by starting the asynchronous allreduce of its
gradient sum and applying the previous window's reduced gradient.
"""
from __future__ import annotations

import collections
import math
import time

import numpy as np
import torch
import torch.nn.functional as F

from .errors import DynBatchError
from .sampler import ShardStream, StepPlan
from .training import Trainer


class ABSTrainer(Trainer):
    """Delayed synchronous SGD with adaptive batch size on every rank of a Horovod job."""

    def __init__(self, config, comm):
        super().__init__(config, comm)
        if config.micro_batch < self.least_batch:
            raise DynBatchError(f"model {config.model} has batch norm, which cannot train on "
                                f"{config.micro_batch} sample; use --micro-batch 2 or more")
        self.rule = config.window_rule()
        self.stream = ShardStream(len(self.data.train), comm.rank, comm.size, config.seed)
        self.window = math.nan        # seconds; NaN: the first window counts samples instead
        self.updates = 0
        self.handle = None            # the allreduce in flight, and when it started
        self.reduce_seconds = 0.0     # this rank's estimate of what a reduction costs
        self.recent_reductions = collections.deque(maxlen=10)
        self.params = [p for p in self.model.parameters() if p.requires_grad]

    def _distribute(self, optimizer):
        # The reduction is done here, once per window; no per-backward allreduce.
        return optimizer

    def _steps_per_epoch(self) -> int:
        # Each rank passes over its own shard at its own pace; the job's epoch counts target
        # batches, so that it is the same on every rank.
        return math.ceil(len(self.data.train) / self.cfg.global_batch)

    def _epoch(self) -> int:
        return self.step // self._steps_per_epoch()

    def _train_step(self) -> None:
        cfg, started = self.cfg, time.perf_counter()
        lr = self.schedule.lr(self.step)
        first_quota = math.ceil(cfg.global_batch / self.size)
        count, loss_sum, used = 0, 0.0, []
        self.model.train()
        while True:
            indices = self.stream.take(cfg.micro_batch)
            x, y = self.loader.fetch(indices)
            began = time.perf_counter()
            loss = F.cross_entropy(self.model(x), y, reduction="sum")
            forward = time.perf_counter() - began
            self.emulator.after_forward(self.step, forward)
            began = time.perf_counter()
            loss.backward()
            self.emulator.after_backward(forward, time.perf_counter() - began)
            count, loss_sum = count + len(indices), loss_sum + loss.item()
            used.append(indices)
            self._note_reduction_done()
            elapsed = time.perf_counter() - started
            if (count >= first_quota if math.isnan(self.window) else elapsed >= self.window):
                break
        compute = time.perf_counter() - started
        used = np.concatenate(used)
        self.samples_log.write(self.generation, self.step, StepPlan(
            self.stream.epoch, self.stream.position, (count,), used), self.rank)
        flat = torch.cat([p.grad.reshape(-1) for p in self.params] + [torch.tensor(
            [count, loss_sum, compute, self.reduce_seconds], dtype=self.params[0].dtype)])
        if math.isnan(self.window):
            self.window = compute
        self._apply_pending(lr)
        self._start_reduction(flat)
        self.optimizer.zero_grad()
        self._record_step(count, compute, loss_sum / count, time.perf_counter() - started,
                          epoch=self.stream.epoch, lr=lr, window=self.window)

    def _start_reduction(self, flat: torch.Tensor) -> None:
        import horovod.torch as hvd

        handle = hvd.allreduce_async(flat, op=hvd.Sum, name="abs_sgd.window")
        self.handle = (handle, time.perf_counter(), None)

    def _note_reduction_done(self) -> None:
        """Record when the reduction in flight finished, if it has (polled between
        micro-batches, so the time is known to one micro-batch)."""
        import horovod.torch as hvd

        if self.handle is not None and self.handle[2] is None and hvd.poll(self.handle[0]):
            self.handle = (self.handle[0], self.handle[1], time.perf_counter())

    def _apply_pending(self, lr: float) -> None:
        """Wait for the previous window's reduction and apply its mean gradient."""
        import horovod.torch as hvd

        if self.handle is None:
            return
        handle, began, done = self.handle
        reduced = hvd.synchronize(handle)
        # A rank's measured reduction includes waiting for the last rank to submit; the
        # shortest recent one is the nearest to the transfer itself.
        self.recent_reductions.append((done or time.perf_counter()) - began)
        self.reduce_seconds = min(self.recent_reductions)
        self.handle = None
        count, _, compute_sum, reduce_sum = reduced[-4:].tolist()
        mean = reduced[:-4] / count
        offset = 0
        for p in self.params:
            p.grad = mean[offset:offset + p.numel()].view_as(p).clone()
            offset += p.numel()
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        self.optimizer.step()
        # The first window counted samples; its mean length over the ranks seeds the rule,
        # so that from here on every rank computes the same window from reduced values.
        window = compute_sum / self.size if self.updates == 0 else self.window
        self.window = self.rule.next_window(window, count, reduce_sum / self.size)
        self.updates += 1

    def _final_split(self) -> list:
        return self.last_sizes

    def _drain(self) -> None:
        """Flush: apply the last window's gradient, so every window enters one update."""
        self._apply_pending(self.schedule.lr(self.step))
