"""The ABS-SGD step strategy (see `abs_sgd` for the method and its window rule).

One step is one compute window of micro-batches, closed by starting the asynchronous
allreduce of its gradient sum and applying the previous window's reduced gradient. A peer of
`sync_steps.SynchronousSteps`; `trainer.Trainer` drives either through the same calls.
"""
from __future__ import annotations

import collections
import math
import time

import numpy as np
import torch
import torch.nn.functional as F

from ..backend.backends import Backend
from ..backend.device import autocast, parameters_device, to_device, wait_for_compute
from ..backend.weighting import all_finite
from ..core.abs_sgd import Window, next_micro_batch
from ..core.sampler import ShardStream, StepPlan
from ..data.loader import BatchLoader
from ..errors import DynBatchError
from .batching import StepExchange
from .config import TrainConfig
from .staleness import RULES as STALENESS

# The reduced vector after the gradient sum: the loss sum and a stop request, then per rank
# (each in its own slots, zero elsewhere) its count, compute seconds and reduction estimate.
_TAIL, _PER_RANK = 2, 3


class ABSWindows:
    """Delayed synchronous SGD with adaptive batch size on this rank of a job."""

    # Windows between all-gathers of the windows' records (metrics, progress). Each is a
    # barrier where a rank ahead by part of a window waits, which the windows otherwise
    # absorb; with no controller to feed they are rare, and stop requests ride in the
    # reductions instead.
    records_every = 25

    def __init__(self, cfg: TrainConfig, data, model, backend: Backend, least_batch: int):
        if cfg.micro_batch < least_batch:
            raise DynBatchError(f"model {cfg.model} has batch norm, which cannot train on "
                                f"{cfg.micro_batch} sample; use --micro-batch 2 or more")
        self.cfg, self.model, self.backend = cfg, model, backend
        self.least = least_batch
        self.comm = backend.communicator()
        self.rule = cfg.window_rule()
        self.dataset_size = len(data.train)
        self.loader = BatchLoader(data.train, cfg.loader_workers)
        self.stream = ShardStream(self.dataset_size, self.comm.rank, self.comm.size, cfg.seed)
        # The reduction is done here, once per window; no per-backward allreduce.
        rule = STALENESS[cfg.staleness]
        self.optimizer = torch.optim.SGD(model.parameters(), lr=cfg.lr,
                                         momentum=rule.momentum(cfg.momentum))
        self.staleness = rule(self.optimizer)
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.device = parameters_device(model)
        self.step = 0
        self.clock = 0.0              # training seconds: this rank's windows and exchanges
        self.exchange_seconds = 0.0
        self.exchanges = 0
        self.samples = 0
        self.last_sizes = []          # every rank's samples in the last exchanged window
        self.plan = self.rule.first_window(self.comm.size)   # the next window's
        self.per_sample = 0.0         # this rank's seconds per sample in its last window
        self.handle = None            # the allreduce in flight, and when it started
        self.reduced = None           # its result, until the next update applies it
        self.finite = True            # whether the last update's gradient was finite
        self.overflowed = False       # no loss scaling here (fp16 is refused), never set
                                      # (else it was not applied)
        self.reduce_seconds = 0.0     # this rank's estimate of what a reduction costs
        self.recent_reductions = collections.deque(maxlen=10)
        self._exchange = StepExchange()
        self._stop_here = self._stop_known = False
        self._records = []

    @property
    def skipped_samples(self) -> int:
        """Unreadable samples replaced in this rank's micro-batches."""
        return self.loader.skipped

    @property
    def epoch(self) -> int:
        """The job's epoch, counted in target batches so that it is the same on every rank
        (each rank passes over its own shard at its own pace)."""
        return self.step // self.steps_per_epoch()

    def steps_per_epoch(self) -> int:
        return math.ceil(self.dataset_size / self.cfg.global_batch)

    @property
    def global_batch(self) -> int:
        """The target global batch (a window's actual one varies)."""
        return self.cfg.global_batch

    @property
    def split(self) -> tuple:
        """The next window's quotas (empty until every rank's rate is known)."""
        return () if math.isnan(self.plan.seconds) else self.plan.quotas

    def final_split(self) -> list:
        return self.last_sizes

    @property
    def stop_requested(self) -> bool:
        """Whether some rank asked to stop: known everywhere at the same window, from the
        reduction that carries the request (one to two windows after it)."""
        return self._stop_known

    def request_stop(self) -> None:
        """Ask every rank to stop (safe in a signal handler: it only sets a flag)."""
        self._stop_here = True

    def bind(self, comm, split=None, global_batch=None) -> tuple:
        """ABS-SGD runs on a fixed world (the configuration refuses elastic runs)."""
        self.comm = comm
        return ()

    def train_step(self, lr: float, emulator, sample_log, generation: int) -> dict:
        """Compute one window, start its reduction, apply the previous one's.

        Collective: the allreduce, and every `records_every` windows the exchange.
        """
        started = time.perf_counter()
        self.staleness.begin_window(lr)
        count, loss_sum, used = self._compute_window(emulator, started)
        self.staleness.end_window(count)
        compute = time.perf_counter() - started
        sample_log.write(generation, self.step, StepPlan(
            self.stream.epoch, self.stream.position, (count,), used), self.comm.rank)
        # Appended to the gradient sum (see _TAIL), so every rank learns every rank's rate.
        size = self.comm.size
        tail = torch.zeros(_TAIL + _PER_RANK * size, dtype=self.params[0].dtype)
        tail[0], tail[1] = loss_sum, float(self._stop_here)
        tail[_TAIL + self.comm.rank::size] = torch.tensor([count, compute,
                                                            self.reduce_seconds])
        flat = torch.cat([p.grad.reshape(-1) for p in self.params] + [tail.to(self.device)])
        planned = self.plan.seconds
        self._apply_pending(lr)
        self.handle = (self.backend.allreduce_sum_async(flat, "abs_sgd.window"),
                       time.perf_counter(), None)
        self.optimizer.zero_grad()
        step_seconds = time.perf_counter() - started
        self.clock += step_seconds
        self._exchange.add(self.step, self.stream.epoch, count, compute, loss_sum / count)
        self.step += 1
        if self.step % self.records_every == 0:
            self._gather()
        return {"step_time": step_seconds, "lr": lr,
                "window": None if math.isnan(planned) else planned}

    def _compute_window(self, emulator, started: float) -> tuple:
        """Micro-batches as `next_micro_batch` sizes them in the window's plan (from
        `started`): up to this rank's quota, within the cap, on to the floor.
        Gradient sums accumulate in the parameters' `.grad`. Returns the sample count, the
        loss sum and the samples' indices."""
        count, loss_sum, used = 0, 0.0, []
        self.model.train()
        while True:
            size = next_micro_batch(self.plan, self.comm.rank, count,
                                    time.perf_counter() - started, self.per_sample,
                                    self.cfg.micro_batch, self.least)
            if size == 0:
                return count, loss_sum, np.concatenate(used)
            # The emulator's clock covers the fetch, as a planned step's does, so that its
            # own compute and the window times it is sized from measure the same work.
            began = time.perf_counter()
            indices = self.stream.take(size)
            x, y = to_device(self.loader.fetch(indices), self.device, self.cfg.channels_last)
            with autocast(self.device, self.cfg.amp):
                loss = F.cross_entropy(self.model(x), y, reduction="sum")
            loss.backward()
            wait_for_compute(self.device)   # the window's clock runs on the GPU's work
            emulator.after_compute(self.step, len(indices), time.perf_counter() - began)
            count, loss_sum = count + len(indices), loss_sum + loss.item()
            used.append(indices)
            self._note_reduction_done()
            self.per_sample = (time.perf_counter() - started) / count

    def _note_reduction_done(self) -> None:
        """Record when the reduction in flight finished, if it has (polled between
        micro-batches, so the time is known to one micro-batch)."""
        if self.handle is not None and self.handle[2] is None and \
                self.backend.done(self.handle[0]):
            self.handle = (self.handle[0], self.handle[1], time.perf_counter())

    def _finish_reduction(self) -> None:
        """Wait for the reduction in flight, if any, and keep its result for the update."""
        if self.handle is None:
            return
        handle, began, done = self.handle
        self.reduced = self.backend.wait(handle)
        # A rank's measured reduction includes waiting for the last rank to submit; the
        # shortest recent one is the nearest to the transfer itself.
        self.recent_reductions.append((done or time.perf_counter()) - began)
        self.reduce_seconds = min(self.recent_reductions)
        self.handle = None

    def _apply_pending(self, lr: float) -> bool:
        """Apply the previous window's mean gradient (waiting for its reduction); whether
        there was one."""
        self._finish_reduction()
        if self.reduced is None:
            return False
        reduced, self.reduced = self.reduced, None
        size = self.comm.size
        tail = reduced[-(_TAIL + _PER_RANK * size):].tolist()
        counts, seconds, reductions = (tail[_TAIL + k * size:_TAIL + (k + 1) * size]
                                       for k in range(_PER_RANK))
        self._stop_known = self._stop_known or tail[1] > 0
        mean = reduced[:-(_TAIL + _PER_RANK * size)] / sum(counts)
        # The reduced sum is the same on every rank: a non-finite one is skipped everywhere.
        self.finite = all_finite([mean])
        if self.finite:
            grads, offset = [], 0
            for p in self.params:
                grads.append(mean[offset:offset + p.numel()].view_as(p))
                offset += p.numel()
            for p, g in zip(self.params, self.staleness.correct(grads)):
                p.grad = g.clone()
            for group in self.optimizer.param_groups:
                group["lr"] = lr
            self.optimizer.step()
            self.staleness.applied()
        # A rank's reduction time includes waiting for the last rank to submit; the last
        # one's is the transfer alone.
        self.plan = self.rule.next_window(counts, seconds, min(reductions))
        return True

    def _gather(self) -> list:
        if not len(self._exchange):
            return []
        started = time.perf_counter()
        _, records = self._exchange.gather(self.comm)
        self.samples += sum(r.global_batch for r in records)
        self.last_sizes = records[-1].batch_sizes
        elapsed = time.perf_counter() - started
        self.clock += elapsed
        self.exchange_seconds += elapsed
        self.exchanges += 1
        self._records.extend(records)
        return records

    def take_records(self) -> list:
        """The records of the windows exchanged since the last call (local)."""
        records, self._records = self._records, []
        return records

    def exchange(self) -> list:
        """Exchange what is pending; the records of all windows exchanged since the last
        call. Collective."""
        self._gather()
        return self.take_records()

    def drain(self, lr: float) -> bool:
        """Flush: apply the last window's gradient, so every window enters one update.
        Returns whether that changed the weights."""
        return self._apply_pending(lr)

    def forget_uncommitted(self) -> None:
        self._exchange.clear()

    # -- state --------------------------------------------------------------------------------

    _SCALARS = ("step", "clock", "exchange_seconds", "samples", "per_sample",
                "reduce_seconds")

    def state_dict(self) -> dict:
        """The windows' position and clocks, every rank's stream position, the window rule's
        state and the reduced gradient not yet applied (a tensor; the reduction in flight is
        waited for, so the resumed run applies it where this one would have).

        Collective: the ranks' stream positions are gathered (each rank reads its own shard
        at its own pace). Windows not yet exchanged are not part of it: take it right after
        `exchange()`, as the trainer's checkpoints do."""
        self._finish_reduction()
        streams = self.comm.allgather([self.stream.epoch, self.stream.position])
        return {**{name: getattr(self, name) for name in self._SCALARS},
                "exchanges": self.exchanges,
                "last_sizes": list(self.last_sizes),
                "recent_reductions": list(self.recent_reductions),
                "streams": [{"epoch": int(e), "position": int(p)} for e, p in streams],
                "world_size": self.comm.size, "rule": self.rule.state_dict(),
                "plan": self.plan._asdict(),
                "staleness": self.staleness.state_dict(),
                "reduced": None if self.reduced is None else self.reduced.clone()}

    def load_state_dict(self, state: dict, global_batch=None) -> None:
        """Adopt a state saved by `state_dict` on a world of the same size and target batch
        (ABS-SGD runs on a fixed world). Local. Raises `DynBatchError` otherwise."""
        if global_batch not in (None, self.global_batch):
            raise DynBatchError(f"ABS-SGD keeps its target global batch "
                                f"{self.global_batch}; it cannot go on with {global_batch}")
        if state["world_size"] != self.comm.size:
            raise DynBatchError(f"this ABS-SGD state was saved by {state['world_size']} ranks "
                                f"and cannot resume on {self.comm.size}: each rank's stream "
                                f"and window are its own")
        for name in self._SCALARS:
            setattr(self, name, type(getattr(self, name))(state[name]))
        self.exchanges = int(state.get("exchanges", 0))   # absent in checkpoints before it
        self.last_sizes = list(state["last_sizes"])
        self.recent_reductions.clear()
        self.recent_reductions.extend(state["recent_reductions"])
        self.stream.load_state_dict(state["streams"][self.comm.rank])
        self.rule.load_state_dict(state["rule"])
        self.plan = Window(**state["plan"])
        self.staleness.load_state_dict(state["staleness"])
        self.handle, self.reduced = None, state["reduced"]
        self.forget_uncommitted()
