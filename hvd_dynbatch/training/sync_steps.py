"""The synchronous step strategy: static or dynamic batching, one weighted allreduce per step.

Each step trains this rank's slice of a planned split of the global batch, fed by the
`DynamicBatching` loader (prefetched by `loader_workers` DataLoader processes), with the
gradient weighted by b_i / B, a sleep after backward if heterogeneity is emulated (for the
compute and the update before it), and the optimizer step where Horovod's allreduce completes.
Under `--amp fp16` the loss is scaled before backward and the optimizer unscales after the
allreduce. `DynamicBatching` owns the rest: timing, the exchange every `adjust_every` steps
(spaced out while the split holds), the controller.

A peer of `abs_windows.ABSWindows`; `trainer.Trainer` drives either through the same calls.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ..backend.backends import Backend
from ..backend.device import (autocast, loss_scaler, parameters_device, to_device,
                              wait_for_compute)
from ..data.loader import SplitDataset, as_is
from .batching import DynamicBatching
from .config import Batching, TrainConfig


class SynchronousSteps:
    """One planned, batch-weighted synchronous step at a time on this rank."""

    def __init__(self, cfg: TrainConfig, data, model, backend: Backend, least_batch: int):
        self.cfg, self.model = cfg, model
        comm = backend.communicator()
        self.device = parameters_device(model)
        on_gpu = self.device.type == "cuda"
        self.batching = DynamicBatching(
            SplitDataset(data.train), cfg.global_batch, comm,
            adaptive=cfg.batching is Batching.DYNAMIC,
            controller=cfg.controller_config(least_batch=least_batch),
            adjust_every=cfg.adjust_every, hold_seconds=cfg.hold_seconds,
            sync_every=cfg.commit_every if cfg.elastic else 0,
            timing_window=cfg.timing_window, seed=cfg.seed,
            least_batch=least_batch, empty_slices=True,
            autotuning=cfg.cudnn_benchmark and on_gpu)
        workers = cfg.loader_workers
        self.loader = self.batching.loader(num_workers=workers, collate_fn=as_is,
                                           persistent_workers=workers > 0, pin_memory=on_gpu)
        self.scaler = loss_scaler(self.device, cfg.amp)
        self.optimizer = backend.weighted_optimizer(
            torch.optim.SGD(model.parameters(), lr=cfg.lr, momentum=cfg.momentum),
            model, self.batching, scaler=self.scaler, fp16_allreduce=cfg.fp16_allreduce)
        self._batches = None
        self.skipped_samples = 0      # unreadable samples replaced in this rank's batches

    # -- what the loop reads ------------------------------------------------------------------

    @property
    def step(self) -> int:
        return self.batching.step

    @property
    def epoch(self) -> int:
        return self.batching.epoch

    @property
    def clock(self) -> float:
        return self.batching.clock

    @property
    def samples(self) -> int:
        return self.batching.samples

    @property
    def exchange_seconds(self) -> float:
        return self.batching.exchange_seconds

    @property
    def exchanges(self) -> int:
        return self.batching.exchanges

    @property
    def global_batch(self) -> int:
        return self.batching.global_batch

    @property
    def split(self) -> tuple:
        return self.batching.split

    @property
    def stop_requested(self) -> bool:
        return self.batching.stop_requested

    def request_stop(self) -> None:
        self.batching.request_stop()

    @property
    def finite(self) -> bool:
        """Whether the last step's reduced gradient was finite (else it was not applied)."""
        return self.optimizer.finite

    @property
    def overflowed(self) -> bool:
        """Whether the last step was skipped because its float16 gradients overflowed."""
        return self.optimizer.overflowed

    def steps_per_epoch(self) -> int:
        return self.batching.steps_per_epoch()

    def final_split(self) -> list:
        """The split of the run's last step that took the whole global batch (an epoch's
        short last step is not a split, and a split decided after the last step never ran)."""
        return self.batching.last_full_split or list(self.batching.split)

    # -- the world ----------------------------------------------------------------------------

    def bind(self, comm, split=None, global_batch=None) -> tuple:
        """Train on the ranks of `comm` from the next step: `split` if given, else an even
        split of `global_batch`. Local. Returns the split."""
        self._batches = None
        return self.batching.rebind(comm, split=split, global_batch=global_batch)

    def schedule_global_batch(self, step: int, batch: int) -> None:
        self.batching.set_global_batch(batch, at_step=step)

    # -- the steps ----------------------------------------------------------------------------

    def train_step(self, lr: float, emulator, sample_log, generation: int) -> dict:
        """Train one step; returns what rank 0's metrics record of it besides the exchange.

        Collective: the allreduce, and at the steps one is due the exchange.
        """
        x, y, skipped = self._next_batch()
        x, y = to_device((x, y), self.device, self.cfg.channels_last)
        self.skipped_samples += skipped
        plan = self.batching.plan
        step = self.batching.step
        sample_log.write(generation, step, plan, self.batching.rank)
        self.model.train()
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        self.optimizer.zero_grad()
        if len(y):
            with autocast(self.device, self.cfg.amp):
                loss = F.cross_entropy(self.model(x), y)
            (loss if self.scaler is None else self.scaler.scale(loss)).backward()
            # The clock must not stop before the GPU has (see `device`); the optimizer's
            # synchronize would wait there anyway, and the loss is read after it for free.
            wait_for_compute(self.device)
            emulator.after_compute(step, len(y), self.batching.seconds_into_step(),
                                   self.batching.last_update_seconds)
            self.batching.record_loss(loss.item())
        # An empty slice (an epoch's short last step) has no backward: Horovod's synchronize
        # sends zeros for the gradients whose hooks did not fire.
        self.optimizer.step()
        return {"step_time": self.batching.last_step_seconds, "lr": lr}

    def _next_batch(self):
        if self._batches is None:
            self._batches = iter(self.loader)
        try:
            return next(self._batches)
        except StopIteration:
            self._batches = iter(self.loader)
            return next(self._batches)

    def take_records(self) -> list:
        """The records of the steps exchanged since the last call (local)."""
        return self.batching.take_records()

    def exchange(self) -> list:
        """Exchange what is pending; the records of all steps exchanged since the last call.
        Collective."""
        self.batching.exchange()
        return self.take_records()

    def drain(self, lr: float) -> bool:
        """Nothing is in flight after a synchronous step: the weights stay as they are."""
        return False

    def forget_uncommitted(self) -> None:
        self.batching.forget_uncommitted()

    def state_dict(self) -> dict:
        """The batching's state, and the loss scaler's under fp16."""
        scaler = None if self.scaler is None else self.scaler.state_dict()
        return {**self.batching.state_dict(), "loss_scaler": scaler}

    def load_state_dict(self, state: dict, global_batch=None) -> None:
        """See `DynamicBatching.load_state_dict`."""
        self._batches = None
        state = dict(state)
        scaler = state.pop("loss_scaler", None)
        if self.scaler is not None and scaler:
            self.scaler.load_state_dict(scaler)
        self.batching.load_state_dict(state, global_batch)
