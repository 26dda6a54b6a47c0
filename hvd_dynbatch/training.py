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

Elastic runs wrap the same loop (`elastic.run_elastic`); ABS-SGD replaces the step
(`abs_training.ABSTrainer`).
"""
from __future__ import annotations

import enum
import math
import os
import time
import zlib
from dataclasses import asdict
from typing import Callable, Optional

import numpy as np
import torch
import torch.nn.functional as F

from .comm import Communicator, for_horovod
from .config import Batching, TrainConfig
from .controller import BatchController, ControllerState
from .data import load_dataset
from .heterogeneity import Emulator, Slowdown
from .lr import LRSchedule, scaling_rule
from .metrics import MetricsWriter, SampleLog
from .loader import BatchLoader
from .models import build_model, least_batch
from .sampler import VariableBatchSampler
from .timing import StepTimer


def train(config: TrainConfig, comm: Optional[Communicator] = None) -> dict:
    """Run `config` on this rank of a Horovod job and return the summary record.

    Collective: every rank of the job must call it with the same configuration. Initialises
    Horovod if needed. Raises `DynBatchError` for configuration that cannot work.
    """
    import horovod.torch as hvd

    hvd.init()
    torch.set_num_threads(config.threads)
    if config.batching is Batching.ABS:
        from .abs_training import ABSTrainer as trainer_class
    else:
        trainer_class = Trainer
    trainer = trainer_class(config, comm or for_horovod())
    if config.elastic:
        from .elastic import run_elastic

        run_elastic(trainer)
    else:
        trainer.broadcast_initial_state()
        trainer.join_world(trainer.comm)
        trainer.loop()
    return trainer.finish()


class Trainer:
    """The state of one run and the steps that move it; see the module docstring.

    Building it is local (no collective), so a worker that joins an elastic job can build
    one while the others wait for it in Horovod's state sync. `join_world` binds it to the
    current set of ranks; `loop` trains until the run's end.
    """

    def __init__(self, config: TrainConfig, comm: Communicator):
        self.cfg, self.comm = config, comm
        self.slowdown = Slowdown.parse(config.slowdown) if config.slowdown else None
        self.start_world = comm.size
        self.data = load_dataset(config.dataset, config.data_dir, config.seed, config.image_size)
        self.loader = BatchLoader(self.data.train, config.loader_workers)
        torch.manual_seed(config.seed)
        self.model = build_model(config.model, self.data.input_shape, self.data.num_classes)
        optimizer = torch.optim.SGD(self.model.parameters(), lr=config.lr,
                                    momentum=config.momentum)
        self.optimizer = self._distribute(optimizer)
        self.schedule = LRSchedule(config.lr, config.global_batch,
                                   scaling_rule(config.lr_rule, config.smooth_steps),
                                   config.base_schedule())
        self.least_batch = least_batch(self.model)
        self.controller = BatchController(config.controller_config(least_batch=self.least_batch))
        self.sampler = VariableBatchSampler(len(self.data.train), 0,
                                            self.controller.initial_split(comm.size),
                                            config.seed, min_share=self.least_batch)
        self.timer = StepTimer(config.timing_window)
        self.metrics = MetricsWriter(None)
        self.samples_log = SampleLog(config.sample_log)
        self._batch_changes = dict(config.batch_schedule)
        self.rank, self.size = comm.rank, comm.size

        self.step = 0
        self.generation = 0           # how many times this job has (re)joined a world
        self.train_seconds = 0.0      # the training clock; evaluation does not count
        self.exchange_seconds = 0.0   # of which: timing exchange and controller
        self.samples = 0              # all ranks' samples, counted at each exchange
        self.pending = []             # this rank's (batch, compute, loss) since the last exchange
        self.pending_info = []        # the same steps' shared facts, for rank 0's metrics
        self.last_loss = math.nan
        self.accuracy = None          # top-1 test accuracy at the last evaluation
        self.top5 = None
        self.last_eval_step = None
        self.time_to_target = None
        self.checksums = np.zeros(1)
        self.last_sizes = []          # every rank's batch in the last exchanged step
        self.last_full_split = None   # the same, in the last step that took a whole B

    def _distribute(self, optimizer):
        """The optimizer as the training steps use it: Horovod's, batch-weighted."""
        from .weighting import DistributedOptimizer

        return DistributedOptimizer(optimizer, named_parameters=self.model.named_parameters())

    def broadcast_initial_state(self) -> None:
        """Give every rank rank 0's initial weights. Collective."""
        import horovod.torch as hvd

        hvd.broadcast_parameters(self.model.state_dict(), root_rank=0)

    def join_world(self, comm: Communicator, committed_split=None) -> None:
        """Bind to the ranks of `comm`: this rank's slice, B, the split, metrics on rank 0.

        Local: no collective. Per-rank facts (timings) start afresh; the split is the
        committed one if the world kept its size, else an even one (the first start may use
        --initial-split), and the controller rebalances from there.
        """
        cfg = self.cfg
        self.comm, self.rank, self.size = comm, comm.rank, comm.size
        self.generation += 1
        if self.slowdown is not None:
            self.slowdown.check_world(self.size, elastic=cfg.elastic)
        fresh = self.generation == 1 and self.step == 0
        batch = cfg.global_batch_for(self.size, self.start_world, self.step)
        split = self._set_global_batch(batch, committed_split,
                                       cfg.first_split if fresh else None)
        self.emulator = Emulator(self.slowdown, self.rank)
        self.metrics.set_path(cfg.metrics if self.rank == 0 else None, append=not fresh)
        if not fresh:
            self.metrics.write({"type": "reset", "step": self.step, "world_size": self.size,
                                "global_batch": batch, "split": split.tolist(),
                                "generation": self.generation})

    def _set_global_batch(self, batch: int, split=None, first_split=None) -> np.ndarray:
        """Make B `batch` from this step on: controller, split, learning-rate rule, timer; the
        final split of the old B no longer applies.

        `split` keeps a committed split (and the controller's state); otherwise the split is
        `first_split(size, controller)` if given, else even. Local: no collective.
        """
        state = self.controller.state if split is not None else ControllerState()
        self.controller = BatchController(self.cfg.controller_config(batch, self.least_batch),
                                          state)
        if split is not None:
            split = np.asarray(split)
        elif first_split is not None:
            split = first_split(self.size, self.controller)
        else:
            split = self.controller.initial_split(self.size)
        self.sampler.rank = self.rank
        self.sampler.batch_sizes = split
        self.last_full_split = None
        self.schedule.on_batch_change(self.step, batch)
        self.timer.reset()
        return split

    # -- the run -----------------------------------------------------------------------------

    def loop(self, commit: Optional[Callable[[], None]] = None) -> None:
        """Train until the run's end; call `commit` every `commit_every` steps.

        Collective: every rank runs the same steps and exchanges.
        """
        cfg = self.cfg
        total = cfg.planned_steps(self._steps_per_epoch())
        progress = self._progress_bar(total)
        try:
            while self.step < total and self.time_to_target is None:
                if self.step in self._batch_changes:
                    self._exchange()
                    self._set_global_batch(self._batch_changes[self.step])
                epoch_before = self._epoch()
                self._train_step()
                if self.step % cfg.adjust_every == 0 or self.step == total:
                    self._exchange()
                    if progress is not None:
                        progress.update(self.step - progress.n)
                        progress.set_postfix(loss=f"{self.last_loss:.3f}",
                                             split=",".join(map(str, self.last_sizes)))
                epoch_end = self._epoch() != epoch_before
                if (cfg.eval_every and self.step % cfg.eval_every == 0) or \
                        (not cfg.eval_every and epoch_end):
                    self._exchange()
                    self._evaluate()
                if commit is not None and self.step % cfg.commit_every == 0:
                    self._exchange()
                    commit()
            self._drain()
            self._exchange()
            if self.last_eval_step != self.step:
                self._evaluate()
            self.checksums = self.comm.allgather([self._weights_checksum()])[:, 0]
        finally:
            if progress is not None:
                progress.close()

    def _epoch(self) -> int:
        """The epoch the job is in, the same on every rank."""
        return self.sampler.epoch

    def _drain(self) -> None:
        """Complete work still in flight at the end of the run (nothing, here)."""

    def _final_split(self) -> list:
        """The split of the run's last step that took the whole global batch (an epoch's
        short last step is not a split, and a split decided after the last step never ran)."""
        return self.last_full_split or list(self.sampler.batch_sizes)

    def finish(self) -> dict:
        """Write the summary (and the model, on rank 0); return the summary."""
        summary = self._summary()
        self.metrics.write(summary)
        self.metrics.set_path(None)
        if self.rank == 0 and self.cfg.save_model:
            _save_atomically(self.model.state_dict(), self.cfg.save_model)
        return summary

    def _steps_per_epoch(self) -> int:
        return self.sampler.steps_per_epoch()


    def _progress_bar(self, total: int):
        if self.rank != 0 or not self.cfg.progress:
            return None
        from tqdm import tqdm

        # disable=None: shown on a terminal, silent in logs and pipes.
        return tqdm(total=total, initial=self.step, unit="step", disable=None,
                    dynamic_ncols=True)

    def _train_step(self) -> None:
        plan = self.sampler.next_step()
        local = len(plan.indices)
        started = time.perf_counter()
        x, y = self.loader.fetch(plan.indices)
        self.samples_log.write(self.generation, self.step, plan, self.rank)
        self.model.train()
        lr = self.schedule.lr(self.step)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
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
        self._record_step(plan.sizes[self.rank], compute, loss_value,
                          time.perf_counter() - started, epoch=plan.epoch, lr=lr)

    def _record_step(self, batch: int, compute: float, loss: float, step_time: float,
                     **info) -> None:
        """Close a step: the clock, this rank's facts for the next exchange, the step count."""
        self.train_seconds += step_time
        self.pending.append((batch, compute, loss))
        self.pending_info.append({"step": self.step, "time": self.train_seconds,
                                  "step_time": step_time, **info})
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
            self.samples += int(sizes.sum())
            if sizes.sum() == self.sampler.global_batch:
                self.last_full_split = sizes.astype(int).tolist()
            self.metrics.write({**info, "world_size": self.size,
                                "global_batch": int(sizes.sum()),
                                "batch_sizes": sizes.astype(int).tolist(),
                                "compute_times": computes.tolist(), "loss": self.last_loss})
        self.last_sizes = per_step[:, -1, 0].astype(int).tolist()
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

    def _weights_checksum(self) -> int:
        return weights_checksum(self.model.state_dict())

    def _evaluate(self) -> None:
        """Test accuracy and loss over the whole test set, each rank taking a share, and
        each rank's weights checksum (ranks that drifted apart show at the next evaluation).

        Collective: every rank calls it at the same step.
        """
        test = self.data.test
        mine = np.arange(self.rank, len(test), self.size)
        self.model.eval()
        correct, top5, loss_sum = 0.0, 0.0, 0.0
        with torch.no_grad():
            for start in range(0, len(mine), 512):
                x, y = test.fetch(mine[start:start + 512])
                out = self.model(x)
                best = out.topk(min(5, out.shape[1]), dim=1).indices
                correct += (best[:, 0] == y).sum().item()
                top5 += (best == y[:, None]).any(dim=1).sum().item()
                loss_sum += F.cross_entropy(out, y, reduction="sum").item()
        gathered = self.comm.allgather([correct, top5, loss_sum, len(mine),
                                        self._weights_checksum()])
        totals, checksums = gathered[:, :4].sum(axis=0), gathered[:, 4]
        self.accuracy = float(totals[0] / totals[3])
        self.top5 = float(totals[1] / totals[3])
        record = {"type": "eval", "step": self.step, "epoch": self.sampler.epoch,
                  "time": self.train_seconds, "accuracy": self.accuracy, "top5": self.top5,
                  "test_loss": float(totals[2] / totals[3]),
                  "weights_checksums": [int(c) for c in checksums]}
        self.last_eval_step = self.step
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
            "elastic_generations": self.generation if self.cfg.elastic else None,
            "exchange_backend": self.comm.backend,
            "steps": self.step,
            "epochs_completed": self._epoch(),
            "samples": self.samples,
            "train_seconds": self.train_seconds,
            "samples_per_sec": self.samples / self.train_seconds if self.train_seconds else 0.0,
            "exchange_seconds": self.exchange_seconds,
            "final_loss": self.last_loss,
            "final_accuracy": self.accuracy,
            "final_top5": self.top5,
            "target_accuracy": cfg.target_accuracy,
            "time_to_target": self.time_to_target,
            "final_split": self._final_split(),
            "weights_checksums": [int(c) for c in self.checksums],
            "weights_identical": bool(np.all(self.checksums == self.checksums[0])),
            "config": {k: (v.value if isinstance(v, enum.Enum) else v)
                       for k, v in asdict(cfg).items()},
        }


def weights_checksum(state_dict: dict) -> int:
    """CRC-32 of a model's parameters and buffers, byte for byte (equal weights, equal sum)."""
    crc = 0
    for value in state_dict.values():
        crc = zlib.crc32(value.detach().cpu().contiguous().numpy().tobytes(), crc)
    return crc


def _save_atomically(state_dict: dict, path: str) -> None:
    """Write to a temporary file beside `path`, then rename: no half-written model."""
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    tmp = f"{path}.tmp.{os.getpid()}"
    torch.save(state_dict, tmp)
    os.replace(tmp, path)
