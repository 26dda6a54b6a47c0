"""The dynamic-batching protocol of one rank, owned by one object: `DynamicBatching`.

A training script keeps its loop; three of its objects come from here:

    batching = DynamicBatching(train_dataset, global_batch=64 * hvd.size())
    train_loader = batching.loader(num_workers=2)      # the user's DataLoader options
    optimizer = DistributedOptimizer(optimizer, named_parameters=..., batching=batching)

    for data, target in train_loader:                 # this rank's slice of each step
        optimizer.zero_grad()
        loss_fn(model(data), target).backward()       # gradients weighted by b_i / B
        optimizer.step()                              # allreduce; timing; every few steps
                                                      # the exchange and the controller

What happens in one step on rank i:

1. The loader's batch sampler plans the step: the next B indices of the epoch's seeded
   permutation (the same on every rank), split as the split in force for that step says, and
   rank i's contiguous slice of them (see `sampler.VariableBatchSampler`).
2. Asking the loader for the batch starts the step's clock. The optimizer's gradient hooks
   weight the gradient by b_i / B (`weight`), so Horovod's sum-allreduce gives the mean over
   all B samples: N ranks take the step one rank would take on the whole global batch.
3. When the optimizer starts to synchronize (backward has ended) the compute time is taken;
   the wait for other ranks is not part of it. When the allreduce has returned, the
   optimizer's update runs (and whatever the script does between `synchronize()` and
   `step()`, such as clipping); `optimizer.step()` then closes the step, and the update's
   time is counted with the next step's compute. What the controller balances is a rank's
   busy time between two allreduces, update plus compute: a worker on slower hardware also
   updates more slowly, and an imbalance of updates, invisible in the compute alone, holds
   every rank at the allreduce just as well (a few percent of a CNN's SGD step, more for
   Adam on a large model). The update is batch-independent, a fixed cost the `model` rule
   fits as such.
4. Every `adjust_every` steps the ranks all-gather each step's (batch, compute time, update
   time, loss) and their smoothed busy times with their errors; the controller computes the
   next split from them, the same on every rank, so no broadcast is needed. While the split
   holds (the controller kept it, or touched up a split whose busy times were within 10% of
   each other: `core.timing.holds`), the next exchange waits for `hold_seconds` of steps,
   up to 4 times `adjust_every` (`core.timing.hold_steps`): on fast steps the exchange and
   the controller cost 1-3% of the training time every 5 steps. The gather starts
   when the exchange step's compute ends, before the optimizer waits for the gradients:
   one more small collective beside the gradients' allreduce, not a round of its own after
   it (at 20 ms steps an all-gather of its own took 2-3% of the training time under Gloo and
   up to 8% in elastic runs, where each collective waits for Horovod's next coordination
   cycle; at 5 ms steps under MPI, mpi4py's blocking Allgather at the exchange took
   1.0-3.8% of it, the non-blocking Iallgather started beside the allreduce 0.6-1.4%).

Prefetch: a DataLoader with w workers and prefetch factor p asks its batch sampler for the
step w * p ahead of the one the loop is on. So a split decided after step k takes effect at
step k + 1 + `lag`, with `lag` = w * p by default (0 without workers): every step's indices
are known before any worker fetches them, and every rank plans the same steps with the same
split, so the result does not depend on how far each loader has run ahead. The lag must be
the same on every rank (checked at the first exchange). While a decision waits to take
effect the controller does not act again, and the timings start afresh when it does.
"""
from __future__ import annotations

import collections
import dataclasses
import math
import time
from typing import List, Optional, Sequence

import numpy as np
from torch.utils.data import DataLoader

from ..backend.comm import Communicator
from ..core.controller import BatchController, ControllerConfig, ControllerState
from ..core.sampler import StepPlan, VariableBatchSampler
from ..core.timing import (HOLD_SECONDS, WARMUP_STEPS, StepTimer, exchange_due, hold_end,
                           hold_steps, holds)
from ..errors import DynBatchError

# Each step's facts in the exchange: batch, compute seconds, update seconds, loss.
_FACTS = 4
# DataLoader's options that choose batches, with their defaults (the only values accepted).
_BATCH_CHOOSING = {"batch_size": 1, "shuffle": False, "sampler": None, "batch_sampler": None,
                   "drop_last": False}


@dataclasses.dataclass(frozen=True)
class StepRecord:
    """One finished step as every rank saw it, from an exchange."""

    step: int
    epoch: int
    batch_sizes: List[int]      # every rank's batch
    compute_times: List[float]  # every rank's compute seconds (fetch, forward, backward)
    loss: float                 # the mean over the step's samples (NaN if not recorded)
    # every rank's seconds in the optimizer's update before the step (the previous step's,
    # which delays this one's arrival at the allreduce); empty or 0 where none was timed
    update_times: Sequence[float] = ()

    @property
    def global_batch(self) -> int:
        return sum(self.batch_sizes)


class StepExchange:
    """This rank's facts of the steps since the last exchange, and the all-gather that
    shares them as `StepRecord`s. Used by every step strategy (planned steps, ABS windows).

    It also carries stop requests: `request_stop()` on any rank (a signal handler's call)
    makes `stop_requested` true on every rank after the next gather or stop poll (a step
    without a gather shares the request alone), so that all of them stop at the same step."""

    def __init__(self):
        self._facts, self._steps = [], []
        self._started = None             # a gather under way: (result, its steps, head size)
        self._poll = None                # a stop poll under way: its result
        self._stop_here = False
        self.stop_requested = False

    def __len__(self) -> int:
        """The steps noted and not yet gathered."""
        return len(self._steps) + (0 if self._started is None else len(self._started[1]))

    @property
    def started(self) -> bool:
        """Whether a gather is under way (`start`)."""
        return self._started is not None

    def add(self, step: int, epoch: int, batch: int, compute: float, loss: float,
            update: float = 0.0) -> None:
        """Note one step of this rank whose compute has ended, with the update before it
        (0 if not timed). Local."""
        self._facts.append((batch, compute, update, loss))
        self._steps.append((step, epoch))

    def clear(self) -> None:
        """Drop the noted steps and any gather or poll under way (a stop request stays)."""
        self._facts, self._steps, self._started, self._poll = [], [], None, None

    def start(self, comm: Communicator, head: Sequence[float] = ()) -> None:
        """Start the gather of `head` and the noted steps; the next `gather` returns it.

        Collective, like `gather`: every rank starts at the same point.
        """
        result = comm.allgather_async([float(self._stop_here), *head, *np.ravel(self._facts)])
        self._started = (result, self._steps, len(head))
        self._facts, self._steps = [], []

    def request_stop(self) -> None:
        """Ask every rank to stop; they learn it at the next gather or poll. Safe in a
        signal handler (it only sets a flag)."""
        self._stop_here = True

    def start_poll(self, comm: Communicator) -> None:
        """Start sharing this rank's stop request alone; `finish_poll` reads it. Collective,
        like `start`. One value beside the step's gradients costs Horovod no extra cycle."""
        self._poll = comm.allgather_async([float(self._stop_here)])

    def finish_poll(self) -> None:
        """Finish the poll `start_poll` began, if any. Collective."""
        if self._poll is not None:
            result, self._poll = self._poll, None
            self.stop_requested = self.stop_requested or bool(result().any())

    def gather(self, comm: Communicator):
        """Finish the gather `start` began, or all-gather the noted steps alone if none is
        under way; returns the gathered heads, shape (size, len(head)), and the steps'
        records. Clears the notes.

        Collective: every rank calls it with the same number of steps noted.
        """
        if self._started is None:
            self.start(comm)
        result, steps, width = self._started
        self._started = None
        gathered = result()
        self.stop_requested = self.stop_requested or bool(gathered[:, 0].any())
        heads, facts = gathered[:, 1:1 + width], gathered[:, 1 + width:]
        facts = facts.reshape(comm.size, -1, _FACTS)
        records = [StepRecord(step, epoch, facts[:, k, 0].astype(int).tolist(),
                              facts[:, k, 1].tolist(),
                              _weighted_mean(facts[:, k, 3], facts[:, k, 0]),
                              facts[:, k, 2].tolist())
                   for k, (step, epoch) in enumerate(steps)]
        return heads, records


class DynamicBatching:
    """The per-step batching protocol of one rank: plan, weight, time, exchange, control.

    `dataset` is anything with a length (the user's map-style `Dataset`); `global_batch` is
    B, the samples of one step over all ranks. `comm` carries the exchange (default: the
    running Horovod job's, see `backend.comm.for_horovod`). With `adaptive=False` the split stays
    even (static batching) and everything else works the same. `controller` holds the
    controller's settings (`ControllerConfig`; its `global_batch` is replaced by B).
    `least_batch` is the smallest slice the model can train on (2 with batch norm).
    `empty_slices=False` (the default) gives every rank at least `least_batch` samples in an
    epoch's short last step, as a user's collate function expects; the training loop of this
    package handles empty slices and allows them. `lag` defaults to the prefetch depth of
    the loader built by `loader()`. With `autotuning` (for `torch.backends.cudnn.benchmark`,
    which times cuDNN's algorithms on the first step at each new input shape, at several times
    a step's cost) the first step at each batch size this rank has not run before is left out
    of its timing. The first `untimed_steps` steps it would time are left out too: a
    process's first steps run slowly (`core.timing.StepTimer`); raise it for a longer warm-up,
    such as `torch.compile`'s. A window with no timed step reports no time, and the split
    stays. While the split holds (`core.timing.holds`), exchanges come every `hold_seconds`
    of steps (at the slowest rank's smoothed busy time) rather than every `adjust_every`
    steps, up to 4 times as far apart (`core.timing.hold_steps`); 0 keeps them every
    `adjust_every` steps. A caller that calls `exchange()` itself every `sync_every` steps
    too (an elastic job's commits) says so, and those exchanges come as the scheduled ones
    do: their gathers start beside the gradients' allreduce, where one of their own waits for
    Horovod's next cycle. During a hold they gather the steps and leave the controller
    alone, and a hold ends at the last of them within it (`core.timing.hold_end`).

    Building it is local; `step_done()` and `exchange()` are collectives: every rank calls
    them at the same steps (which the training loop's shape already ensures).
    """

    def __init__(self, dataset, global_batch: int, comm: Optional[Communicator] = None, *,
                 adaptive: bool = True, controller: Optional[ControllerConfig] = None,
                 adjust_every: int = 5, timing_window: int = 5, seed: int = 0,
                 least_batch: int = 1, empty_slices: bool = False, lag: Optional[int] = None,
                 initial_split: Optional[Sequence[int]] = None, autotuning: bool = False,
                 untimed_steps: int = WARMUP_STEPS, hold_seconds: float = HOLD_SECONDS,
                 sync_every: int = 0):
        if comm is None:
            from ..backend.comm import for_horovod

            comm = for_horovod()
        if adjust_every < 1:
            raise DynBatchError(f"adjust_every must be at least 1 step, got {adjust_every}")
        if lag is not None and lag < 0:
            raise DynBatchError(f"the lag must not be negative, got {lag}")
        if untimed_steps < 0:
            raise DynBatchError(f"untimed_steps must not be negative, got {untimed_steps}")
        if not 0 <= hold_seconds < math.inf:
            raise DynBatchError(f"hold_seconds must be a number of seconds >= 0, got "
                                f"{hold_seconds}")
        if sync_every < 0:
            raise DynBatchError(f"sync_every must not be negative, got {sync_every}")
        self.dataset, self.adaptive, self.adjust_every = dataset, adaptive, adjust_every
        self.hold_seconds, self.sync_every = hold_seconds, sync_every
        self.lag = lag
        self._template = dataclasses.replace(controller or ControllerConfig(global_batch),
                                             global_batch=global_batch)
        self.controller = self._controller_for(global_batch)
        self.timer = StepTimer(timing_window, untimed_steps)
        self.comm = comm
        split = (self.controller.initial_split(comm.size) if initial_split is None
                 else np.asarray(initial_split))
        self._sampler = VariableBatchSampler(len(dataset), comm.rank, split, seed,
                                             min_share=least_batch, empty_slices=empty_slices)
        self.step = 0                    # steps finished
        self.samples = 0                 # all ranks' samples, counted at each exchange
        self.clock = 0.0                 # training seconds: this rank's steps and exchanges
        self.exchange_seconds = 0.0      # of which: exchanges and the controller
        self.exchanges = 0               # exchanges made
        self.last_step_seconds = 0.0
        self.last_update_seconds = 0.0   # this rank's last update, counted with the next step
        self.last_full_split = None      # every rank's batch in the last step that took B
        self._position = self._sampler.state_dict()  # where the next step to train starts
        self._splits = [(0, tuple(int(b) for b in split))]  # (first step, split), in order
        self._tuned = set() if autotuning else None  # batch sizes this rank has run
        self._plans = collections.deque()  # planned by the loader, not yet handed out
        self._planned = 0                # steps planned so far (the next plan's step)
        self._current = None             # the handed-out step: (plan, step, started, after)
        self._compute = None
        self._reduced_at = None          # when the handed-out step's allreduce returned
        self._loss = math.nan
        self._exchange = StepExchange()
        self._quiet_until = 0            # no scheduled exchange before this step (a hold)
        self._records = []
        self._lag_checked = False

    # -- what a training script reads ---------------------------------------------------------

    @property
    def rank(self) -> int:
        return self.comm.rank

    @property
    def size(self) -> int:
        return self.comm.size

    @property
    def stop_requested(self) -> bool:
        """Whether some rank asked to stop (`request_stop`) before the end of the last
        step's compute: true on every rank from the same step on."""
        return self._exchange.stop_requested

    def request_stop(self) -> None:
        """Ask every rank to stop: `stop_requested` turns true everywhere at the end of
        the step under way (of the next one, once this one's compute has ended: the
        request travels beside the gradients). Local; safe in a signal handler."""
        self._exchange.request_stop()

    @property
    def global_batch(self) -> int:
        """B of the next step to train."""
        return sum(self.split_at(self.step))

    @property
    def split(self) -> tuple:
        """Every rank's batch in the split in force for the next step to train."""
        return self.split_at(self.step)

    @property
    def local_batch(self) -> int:
        """This rank's batch in the split in force (an epoch's short last step takes less)."""
        return self.split[self.rank]

    @property
    def epoch(self) -> int:
        """The epoch of the next step to train, the same on every rank."""
        return int(self._position["epoch"])

    @property
    def weight(self) -> float:
        """b_i / B of the step handed out: the factor on this rank's mean gradient."""
        if self._current is None:
            return 1.0 / self.size
        plan = self._current[0]
        return len(plan.indices) / plan.global_size

    @property
    def plan(self) -> Optional[StepPlan]:
        """The step handed out and not yet finished, or None."""
        return None if self._current is None else self._current[0]

    def steps_per_epoch(self) -> int:
        """Steps in an epoch at the current global batch (`len(loader)`)."""
        sampler = self._sampler
        sampler.batch_sizes = self.split
        return sampler.steps_per_epoch()

    def split_at(self, step: int) -> tuple:
        """The split in force at `step` (the last decision taking effect at or before it), for
        a step from the last exchange on: splits no longer in force then are forgotten."""
        for first, split in reversed(self._splits):
            if first <= step:
                return split
        return self._splits[0][1]

    # -- the loader: planning steps and handing them out --------------------------------------

    def loader(self, dataset=None, **kwargs):
        """A `torch.utils.data.DataLoader` over `dataset` (default: the one given at
        construction) whose batches are this rank's slices of successive steps.

        Takes DataLoader's options (`num_workers`, `pin_memory`, `collate_fn`,
        `prefetch_factor`, ...) except those that choose batches. Iterating it gives the rest of
        the current epoch; the next iteration starts the next epoch.
        """
        for name, default in _BATCH_CHOOSING.items():
            if kwargs.pop(name, default) not in (default, None):
                raise DynBatchError(f"DynamicBatching chooses the batches; drop the "
                                    f"DataLoader option '{name}'")
        if kwargs.get("in_order") is False:
            raise DynBatchError("DynamicBatching needs batches in order; drop in_order=False")
        workers = kwargs.get("num_workers", 0)
        depth = workers * (kwargs.get("prefetch_factor") or 2) if workers else 0
        if self.lag is None:
            self.lag = depth
        elif depth > self.lag:
            raise DynBatchError(f"this loader prefetches {depth} steps ahead, more than the "
                                f"lag of {self.lag}; raise lag or lower num_workers x "
                                f"prefetch_factor")
        return _StepLoader(self, self.dataset if dataset is None else dataset,
                           batch_sampler=_BatchSampler(self), **kwargs)

    def _plan_steps(self):
        """The index lists of the rest of the current epoch, planned from the position of
        the next step to train (whatever an earlier iteration planned but never handed out
        is forgotten)."""
        self._plans.clear()
        self._current = None
        sampler = self._sampler
        sampler.load_state_dict(self._position)
        self._planned = self.step
        epoch = sampler.upcoming_epoch()
        while True:
            sampler.batch_sizes = self.split_at(self._planned)
            if sampler.upcoming_epoch() != epoch:
                return
            plan = sampler.next_step()
            self._plans.append((plan, self._planned, sampler.state_dict()))
            self._planned += 1
            yield plan.indices.tolist()

    def _hand_out(self, started: float) -> None:
        """The loader delivered the next planned step: it is the one being trained."""
        if self._current is not None:
            raise DynBatchError("a batch was taken before the previous step ended: call "
                                "optimizer.step() once per batch")
        plan, step, after = self._plans.popleft()
        self._current = (plan, step, started, after)
        self._compute, self._loss, self._reduced_at = None, math.nan, None
        self._starting = 0.0             # of the step: starting an exchange's gather

    # -- the step: timing, closing, exchange --------------------------------------------------

    def compute_done(self) -> None:
        """Mark the end of this step's compute (backward done) and note the step's facts,
        with the update before it; start the exchange's gather on the last step before an
        exchange, the stop poll on the others. The optimizer calls it when it starts to
        synchronize; later calls in the same step are ignored.

        Collective (every rank calls it, through the optimizer or `step_done`). A loss for
        `records` must be recorded before it.
        """
        if self._current is None or self._compute is not None:
            return
        plan, step, started, _ = self._current
        self._compute = time.perf_counter() - started
        split = self.split_at(step)
        if plan.sizes == split:
            self.timer.time_at(split)
            mine = plan.sizes[self.rank]
            if self._tuned is None or mine in self._tuned:
                self.timer.record(self._compute + self.last_update_seconds)
            else:
                self._tuned.add(mine)
        self._exchange.add(step, plan.epoch, plan.sizes[self.rank], self._compute, self._loss,
                           self.last_update_seconds)
        began = time.perf_counter()
        if self._exchange_due(step + 1):
            self._exchange.start(self.comm, self._head())
        else:
            self._exchange.start_poll(self.comm)
        self._starting = time.perf_counter() - began

    def gradients_reduced(self) -> None:
        """Mark that the handed-out step's allreduce has returned: the optimizer's update
        starts, timed until `step_done`. The optimizer calls it after synchronizing; later
        calls in the same step are ignored. Local. Without it the updates count as 0."""
        if self._current is not None and self._reduced_at is None:
            self._reduced_at = time.perf_counter()

    def seconds_into_step(self) -> float:
        """Seconds since the step handed out was asked for (0 if none is)."""
        return 0.0 if self._current is None else time.perf_counter() - self._current[2]

    def record_loss(self, loss: float) -> None:
        """Optional: this rank's mean loss on its slice of the step, for `records`."""
        self._loss = float(loss)

    def step_done(self) -> None:
        """Close the step handed out; at the steps an exchange is due, `exchange()`.

        Collective (through `exchange`): every rank calls it once per step. The optimizer
        returned by `DistributedOptimizer(..., batching=self)` calls it at the end of `step()`.
        """
        if self._current is None:
            raise DynBatchError("optimizer.step() ran without a batch from the DynamicBatching "
                                "loader; iterate batching.loader(...) for the training batches")
        self.compute_done()
        _, step, started, after = self._current
        now = time.perf_counter()
        # Starting the gather is the exchange's cost, not the step's.
        self.last_step_seconds = now - started - self._starting
        self.last_update_seconds = 0.0 if self._reduced_at is None else now - self._reduced_at
        self._exchange.finish_poll()
        polled = time.perf_counter() - now
        self.clock += self.last_step_seconds + self._starting + polled
        self.exchange_seconds += self._starting + polled
        self._current, self._position, self.step = None, after, step + 1
        if self._exchange_due(self.step):
            self.exchange()

    def _exchange_due(self, steps_done: int) -> bool:
        """Whether an exchange follows the step that makes `steps_done` steps
        (`core.timing.exchange_due`)."""
        return exchange_due(steps_done, self.adjust_every, self._quiet_until, self.sync_every)

    def exchange(self) -> List[StepRecord]:
        """Gather the facts of the steps since the last exchange; let the controller act,
        unless the split holds until a later step (`core.timing.hold_end`).

        Collective: every rank calls it at the same steps. Returns the steps' records (also
        kept for `take_records()`). Does nothing when no step is pending.
        """
        if not self._exchange:
            return []
        started = time.perf_counter()
        if not self._exchange.started:
            self._exchange.start(self.comm, self._head())
        heads, records = self._exchange.gather(self.comm)
        if not self._lag_checked:
            self._check_lags(heads[:, 0])
        for record in records:
            batch = sum(self.split_at(record.step))
            self.samples += record.global_batch
            if self.last_full_split is not None and sum(self.last_full_split) != batch:
                self.last_full_split = None
            if record.global_batch == batch:
                self.last_full_split = record.batch_sizes
        self._records.extend(records)
        smoothed = heads[:, 1]
        if self.step >= self._quiet_until:     # not in a hold (in one, exchanges only gather)
            # A hold ends where a split decided before it (`set_global_batch`) starts.
            decided = [first for first, _ in self._splits if first > self.step]
            if self._control(smoothed, heads[:, 2]):
                hold = hold_steps(self.adjust_every, self.hold_seconds, float(smoothed.max()))
                self._quiet_until = min([hold_end(self.step, hold, self.sync_every)] + decided)
            else:
                self._quiet_until = 0
        self._forget_past_splits()
        elapsed = time.perf_counter() - started
        self.exchange_seconds += elapsed
        self.exchanges += 1
        self.clock += elapsed
        return records

    def _head(self) -> list:
        """This rank's values in every exchange besides its steps: the lag, the smoothed
        busy time (update plus compute) and its relative error."""
        return [-1 if self.lag is None else self.lag, self.timer.smoothed, self.timer.error]

    def _check_lags(self, lags: np.ndarray) -> None:
        if np.any(lags != lags[0]):
            raise DynBatchError(f"the ranks prefetch with different lags "
                                f"{[int(x) for x in lags]} (num_workers x prefetch_factor); "
                                f"give every rank the same loader options")
        self._lag_checked = True

    def _control(self, smoothed: np.ndarray, errors: np.ndarray) -> bool:
        """The controller's turn: a new split from the gathered smoothed times and their
        errors, taking effect `lag` steps from now. None while a split decided or scheduled
        earlier is due by then, or before the split in force has been timed. Returns whether
        a hold of the exchanges starts: static batching never moves the split, and the
        controller kept it or touched it up (`core.timing.holds`)."""
        effective = self.step + (self.lag or 0)
        if not self.adaptive:
            return True
        if any(self.step < s <= effective for s, _ in self._splits):
            return False
        current = self.split_at(self.step)
        if current != self.timer.split:
            return False
        if sum(current) != self.controller.config.global_batch:
            self.controller = self._controller_for(sum(current))
        split = tuple(int(b) for b in self.controller.update(current, smoothed, errors))
        if split != current:
            self._decide(effective, split)
        return holds(current, split, smoothed)

    def _decide(self, first_step: int, split: Sequence[int]) -> None:
        """Let `split` be in force from `first_step` until the next change already decided;
        a hold of the exchanges ends there."""
        if first_step < self._planned:
            raise DynBatchError(f"a split for step {first_step} came after the loader planned "
                                f"up to step {self._planned - 1}: the lag ({self.lag}) is "
                                f"shorter than the loader's prefetch")
        self._quiet_until = min(self._quiet_until, first_step)
        self._splits = sorted([(s, sp) for s, sp in self._splits if s != first_step]
                              + [(first_step, tuple(int(b) for b in split))])

    def _forget_past_splits(self) -> None:
        """Keep the split in force at the next step to train and those decided after it:
        no later lookup asks for an earlier step, and a job of days decides hundreds of
        thousands of splits."""
        in_force = max((k for k, (first, _) in enumerate(self._splits) if first <= self.step),
                       default=0)
        del self._splits[:in_force]

    def _controller_for(self, batch: int, state: Optional[ControllerState] = None):
        """A controller with the configured settings for a global batch of `batch`."""
        return BatchController(dataclasses.replace(self._template, global_batch=batch),
                               state or ControllerState())

    def take_records(self) -> List[StepRecord]:
        """The records of the steps exchanged since the last call (local)."""
        records, self._records = self._records, []
        return records

    # -- changes from outside: the global batch, the world ------------------------------------

    def set_global_batch(self, batch: int, at_step: Optional[int] = None,
                         split: Optional[Sequence[int]] = None) -> tuple:
        """Make B `batch` from `at_step` on (default: the next step to train), split evenly
        or as `split`; returns the split. The controller starts afresh for the new B once
        the change is in force.

        Local, but every rank must make the same change. `at_step` must not have been planned
        by the loader yet: schedule a change at least `lag` steps ahead.
        """
        at_step = self.step if at_step is None else at_step
        if split is None:
            split = self._controller_for(batch).initial_split(self.size)
        split = tuple(int(b) for b in split)
        self._decide(at_step, split)
        return split

    def rebind(self, comm: Communicator, split: Optional[Sequence[int]] = None,
               global_batch: Optional[int] = None) -> tuple:
        """Bind to the ranks of `comm` (an elastic job's new world) from the next step on:
        the split `split` if given (a committed one; the controller keeps its state), else
        an even split of `global_batch` (default: the current B) with a fresh controller.
        Returns the split. Local.

        What was planned and not trained is forgotten: the loader's next iteration plans from
        the position of the next step to train. Per-rank timings start afresh.
        """
        batch = global_batch or self.global_batch
        self.comm = comm
        self._sampler.rank = comm.rank
        self._plans.clear()
        self._current, self._planned = None, self.step
        self.forget_uncommitted()
        self.last_full_split = None
        self._quiet_until = 0
        if split is not None:
            self._splits = [(self.step, tuple(int(b) for b in split))]
            return self._splits[0][1]
        self._splits = []
        self.controller = self._controller_for(batch)
        return self.set_global_batch(batch)

    def forget_uncommitted(self) -> None:
        """Drop this rank's facts not yet exchanged and its timings (an elastic reset). Local."""
        self._exchange.clear()
        self.timer.reset()

    # -- state --------------------------------------------------------------------------------

    def state_dict(self) -> dict:
        """Plain values: the step, the position of the next step to train, the splits in
        force and decided, the controller's state, the step a hold of the exchanges ends.
        Local: no communication."""
        later = [[s, list(sp)] for s, sp in self._splits if s > self.step]
        return {"step": self.step, "position": dict(self._position),
                "splits": [[self.step, list(self.split)], *later],
                "controller": self.controller.state.state_dict(),
                "samples": self.samples, "clock": self.clock,
                "exchange_seconds": self.exchange_seconds, "exchanges": self.exchanges,
                "world_size": self.size,
                "quiet_until": self._quiet_until}

    def load_state_dict(self, state: dict, global_batch: Optional[int] = None) -> None:
        """Adopt a state saved by `state_dict`, going on with `global_batch` (default: the
        saved B). Local. On a world of another size, or with another B, the saved splits do
        not apply: B is split evenly, with a fresh controller."""
        self._sampler.load_state_dict(state["position"])
        self._position = self._sampler.state_dict()
        self.step, self.samples = int(state["step"]), int(state["samples"])
        self.clock = float(state["clock"])
        self.exchange_seconds = float(state["exchange_seconds"])
        self.exchanges = int(state.get("exchanges", 0))   # absent in checkpoints before it
        splits = [(int(s), tuple(int(b) for b in sp)) for s, sp in state["splits"]]
        saved_batch = sum(splits[0][1])
        if state["world_size"] != self.size or global_batch not in (None, saved_batch):
            self.rebind(self.comm, global_batch=global_batch or saved_batch)
            return
        self._splits = splits
        self._quiet_until = int(state.get("quiet_until", 0))
        self.controller = self._controller_for(
            saved_batch, ControllerState.from_state_dict(state["controller"]))
        self._plans.clear()
        self._current, self._planned = None, self.step
        self.forget_uncommitted()


def _weighted_mean(values: np.ndarray, weights: np.ndarray) -> float:
    """The mean of `values` weighted by `weights`, over the finite values (NaN if none)."""
    keep = np.isfinite(values) & (weights > 0)
    if not keep.any():
        return math.nan
    return float(np.dot(values[keep], weights[keep]) / weights[keep].sum())


def _unwrapped(error: Exception) -> str:
    """The message of an error raised in a DataLoader worker, which the DataLoader re-raises
    in this process with "Caught ... in DataLoader worker process N" and the worker's
    traceback around it; any other error's message as it is."""
    text = str(error)
    name = f"{type(error).__module__}.{type(error).__qualname__}: "
    if text.startswith("Caught ") and name in text:
        return text.rsplit(name, 1)[1].strip()
    return text


class _BatchSampler:
    """The DataLoader's batch sampler: the steps `DynamicBatching` plans."""

    def __init__(self, batching: DynamicBatching):
        self.batching = batching

    def __iter__(self):
        return self.batching._plan_steps()

    def __len__(self) -> int:
        return self.batching.steps_per_epoch()


class _StepLoader(DataLoader):
    """A DataLoader whose iteration tells `DynamicBatching` when each step starts."""

    def __init__(self, batching: DynamicBatching, dataset, **kwargs):
        super().__init__(dataset, **kwargs)
        self._batching = batching

    def __iter__(self):
        batches = super().__iter__()
        while True:
            started = time.perf_counter()
            try:
                batch = next(batches)
            except StopIteration:
                return
            except DynBatchError as error:
                raise type(error)(_unwrapped(error)) from None
            self._batching._hand_out(started)
            yield batch
