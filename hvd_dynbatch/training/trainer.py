"""The training loop: glue over a step strategy, evaluation, metrics and the run's state.

`train(TrainConfig(...))` is what `hvd-dynbatch train` runs on each rank. The loop itself is
small: take a step (the strategy's: `sync_steps.SynchronousSteps` for static and dynamic
batching, `abs_windows.ABSWindows` for ABS-SGD), write the steps' records as the exchanges
deliver them, evaluate and commit when due. A user's own script uses the same pieces
directly: `DynamicBatching` and the weighted `DistributedOptimizer`.

Elastic runs wrap the same loop (`elastic.run_elastic`); `Trainer.state_dict()` is what they
commit.
"""
from __future__ import annotations

import contextlib
import math
import os
import sys
import time
import zlib
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Callable, Optional

import numpy as np
import torch
import torch.nn.functional as F

from ..backend.backends import Backend, HorovodBackend
from ..backend.device import parameters_device, resolve_device, to_device
from ..backend.host_memory import keep_freed_memory
from ..backend.weighting import all_finite
from ..backend.comm import Communicator
from ..core.controller import BatchController
from ..core.heterogeneity import Emulator, Slowdown
from ..core.lr import LRSchedule, scaling_rule
from ..data.datasets import load_dataset
from ..errors import DynBatchError
from .checkpoint import CheckpointDir, check_fingerprint, fingerprint, rng_state, set_rng_state
from .config import Batching, OnNan, TrainConfig
from .files import remove_stray_temporaries, replaced_atomically
from .metrics import MetricsWriter, SampleLog, truncate_metrics
from .models import build_model, least_batch
from .stops import stop_notices


def train(config: TrainConfig, backend: Optional[Backend] = None) -> dict:
    """Run `config` on this rank of a job and return the summary record.

    Collective: every rank of the job must call it with the same configuration. The backend
    defaults to the running Horovod job (initialised here). Raises `DynBatchError` for
    configuration that cannot work.
    """
    # Emulated slowdowns run ranks that share cores on purpose; a rank spinning in Horovod's
    # wait would slow the emulated worker it waits for (see `backend.weighting`).
    backend = backend or HorovodBackend(nap=2e-4 if config.slowdown else None)
    torch.set_num_threads(config.threads)
    comm = backend.communicator()
    # Elastic workers start at different times (a joiner while the others train), so only a
    # fixed world agrees on its start; Horovod Elastic handles a worker that fails.
    with contextlib.nullcontext() if config.elastic else _every_rank_starts(comm, backend):
        trainer = Trainer(config, backend)
        committed = trainer.restore() if config.resume else None
        if not config.elastic:
            trainer.join_world(comm, committed)
    with _last_collective_done(backend):
        with stop_notices(trainer.request_stop):
            if config.elastic:
                from .elastic import run_elastic

                run_elastic(trainer, backend, committed)
            else:
                trainer.bind_device()
                backend.broadcast_parameters(trainer.model)
                trainer.loop()
        if trainer.checkpoints is not None and trainer.weights_finite():
            trainer.save_checkpoint()
    return trainer.finish()


@contextlib.contextmanager
def _last_collective_done(backend: Backend):
    """On the way out of a run that ended alike on every rank (finished, or `Stopped`),
    wait at a Horovod barrier before this rank may exit.

    A rank can finish an mpi4py collective before a slower rank has (its sends need not be
    received), exit, and so shut Horovod down on every rank; Horovod then finalises MPI
    under the slower rank's collective, which hung or segfaulted. Seen with mpirun, 3 ranks
    on 2 cores, after the last checksum gather: 2 of 66 runs without the barrier, 0 of 60
    with it (mlp on digits, 12 steps, slowdown 1,2,1); the hung rank's Horovod thread was
    gone and its main thread was in MPI_Allgather. A Horovod barrier completes on no rank
    before every rank has reached it, so no rank is left inside a collective.
    """
    try:
        yield
    except Stopped:
        backend.barrier()
        raise
    backend.barrier()


@contextlib.contextmanager
def _every_rank_starts(comm: Communicator, backend: Backend):
    """Run the start-up (building the trainer: the data, the model, the checks against the
    world) on every rank, then agree: if it failed anywhere, every rank raises, its own
    error or one naming the ranks that failed, after a barrier.

    Collective: one all-gather after the start-up, and a barrier if it failed. Without the
    all-gather a rank that fails fast exits while the others are still starting; Horovod then
    shuts them down under their feet (on MPI, a segfault in the middle of an MPI call) or
    they wait for it in a collective. Without the barrier a rank can leave the all-gather
    first and exit while another is still in it, as `_last_collective_done` describes: seen
    once in 4 fresh-clone test runs (2026-12-05), rank 1 of 2 segfaulting under
    `horovodrun --mpi` before it printed its error."""
    error = None
    try:
        yield
    except Exception as exc:
        error = exc
    failed = np.flatnonzero(comm.allgather([error is not None])[:, 0])
    if failed.size:
        backend.barrier()
    if error is not None:
        raise error
    if failed.size:
        raise DynBatchError(f"rank {', '.join(map(str, failed))} could not start (see its "
                            f"error); this rank stops too")


class Stopped(DynBatchError):
    """The run stopped early on a notice to some rank (a signal, its launcher's end: see
    `stops`), every rank at the same step, after writing a checkpoint if it has a checkpoint
    directory."""


@dataclass
class RunState:
    """What the run carries besides the model, the optimizer, the steps and the learning-rate
    schedule: plain values, saved by elastic commits (and checkpoints)."""

    start_world: int
    generation: int = 0               # how many times the job has (re)joined a world
    last_loss: float = math.nan       # the last exchanged step's loss over all samples
    accuracy: Optional[float] = None  # top-1 test accuracy at the last evaluation
    top5: Optional[float] = None
    last_eval_step: Optional[int] = None
    time_to_target: Optional[float] = None
    skipped_steps: int = 0            # steps not applied: their gradient was not finite
    skipped_in_a_row: int = 0         # of which the last ones, up to the last step applied
    final_update_skipped: bool = False  # ABS-SGD: the update after the last step, likewise
    overflow_steps: int = 0           # steps skipped by the fp16 loss scaler (overflow)
    checkpoint_seconds: float = 0.0   # spent writing checkpoints (rank 0's, which others wait)

    def state_dict(self) -> dict:
        return asdict(self)

    def load_state_dict(self, state: dict) -> None:
        """Set the fields `state` has (a checkpoint older than a field keeps its default)."""
        for f in fields(self):
            if f.name in state:
                setattr(self, f.name, state[f.name])


def _strategy(config: TrainConfig):
    if config.batching is Batching.ABS:
        from .abs_windows import ABSWindows

        return ABSWindows
    from .sync_steps import SynchronousSteps

    return SynchronousSteps


class Trainer:
    """One run on this rank; see the module docstring.

    Building it is local (no collective), so a worker that joins an elastic job can build
    one while the others wait for it in Horovod's state sync. `join_world` binds it to the
    current set of ranks; `loop` trains until the run's end.
    """

    def __init__(self, config: TrainConfig, backend: Backend):
        self.cfg, self.backend = config, backend
        self.comm = backend.communicator()
        self.slowdown = Slowdown.parse(config.slowdown) if config.slowdown else None
        self.data = load_dataset(config.dataset, config.data_dir, config.seed, config.image_size,
                                 config.skip_bad_samples)
        torch.manual_seed(config.seed)
        self.device = resolve_device(config.device, backend.local_rank())
        if self.device.type == "cpu":
            keep_freed_memory()
        self.model = build_model(config.model, self.data.input_shape,
                                 self.data.num_classes).to(self.device)
        if config.cudnn_benchmark and self.device.type == "cuda":
            torch.backends.cudnn.benchmark = True
        self.steps = _strategy(config)(config, self.data, self.model, backend,
                                       least_batch(self.model))
        self.schedule = LRSchedule(config.lr, config.global_batch,
                                   scaling_rule(config.lr_rule, config.smooth_steps),
                                   config.base_schedule())
        self.run = RunState(start_world=self.comm.size)
        if self.comm.rank == 0:
            for option, path in (("--metrics", config.metrics),
                                 ("--save-model", config.save_model)):
                if path:
                    _check_writable(path, option)
            if config.save_model:
                remove_stray_temporaries(config.save_model)
        self.metrics = MetricsWriter(None)
        self.samples_log = SampleLog(config.sample_log)
        self.emulator = Emulator(None, 0, 1)
        self.checksums = np.zeros(1)
        self.skipped_samples = 0      # unreadable samples replaced, over all ranks (at the end)
        self.checkpoints = (CheckpointDir(config.checkpoint_dir, config.checkpoint_keep,
                                          writer=self.comm.rank == 0)
                            if config.checkpoint_dir else None)
        self._resumed_from = None     # the checkpoint restored, until join_world reports it
        self.stop_reason = None       # what asked this rank to stop ("SIGTERM to this rank")
        self._info = {}               # step -> this rank's facts for the step's metrics record
        self._last_sizes = []
        self.through_host = False     # whether the reductions go through host memory

    def bind_device(self) -> None:
        """Tell the backend where this rank computes (collective): ranks that share a GPU,
        or a job mixing CPU and GPU ranks, reduce through host memory (see `backends`)."""
        self.through_host = self.backend.bind_device(self.device)
        if self.through_host and self.comm.rank == 0:
            print("hvd-dynbatch: some ranks share a GPU or train on the CPU beside GPU ranks, "
                  "so the gradients are summed through host memory (NCCL takes one rank per "
                  "GPU)", file=sys.stderr, flush=True)

    @property
    def optimizer(self):
        return self.steps.optimizer

    def request_stop(self, reason: str) -> None:
        """Ask every rank to stop at the end of the step under way, for `reason` (a notice
        this rank had, see `stops`). Safe in a signal handler and from another thread."""
        self.stop_reason = reason
        self.steps.request_stop()

    def join_world(self, comm: Communicator, committed: Optional[dict] = None) -> None:
        """Bind to the ranks of `comm`, from `committed` (a `state_dict()`) if given.

        Local: no collective. Per-rank facts (timings) start afresh, but for the emulated
        slowdown's typical costs, which are this machine's. The split is the committed one
        if the world kept its size, else an even one (the first start may use
        --initial-split); B follows the batch policy; the controller rebalances from there.
        """
        cfg, steps = self.cfg, self.steps
        self.comm = comm
        if committed is not None:
            self.run.load_state_dict(committed["run"])
            self.schedule.load_state_dict(committed["schedule"])
        self.run.generation += 1
        step = steps.step if committed is None else int(committed["steps"]["step"])
        fresh = self.run.generation == 1 and step == 0
        if self.slowdown is not None:
            self.slowdown.check_world(comm.size, elastic=cfg.elastic)
        batch = cfg.global_batch_for(comm.size, self.run.start_world, step)
        if fresh:
            first = cfg.first_split(comm.size, BatchController(
                cfg.controller_config(batch, least_batch(self.model))))
            steps.bind(comm, split=first)
        else:
            steps.bind(comm, global_batch=batch)
            if committed is not None:
                steps.load_state_dict(committed["steps"], global_batch=batch)
        for at_step, scheduled in cfg.batch_schedule:
            if at_step > step:
                steps.schedule_global_batch(at_step, scheduled)
        self.schedule.on_batch_change(step, batch)
        self.emulator = Emulator(self.slowdown, comm.rank, comm.size,
                                 typical=self.emulator.typical)
        self.metrics.set_path(cfg.metrics if comm.rank == 0 else None, append=not fresh)
        if not fresh:
            event = {"type": "reset"} if self._resumed_from is None else \
                {"type": "resume", "checkpoint": str(self._resumed_from)}
            self.metrics.write({**event, "step": step, "world_size": comm.size,
                                "global_batch": batch, "split": list(steps.split),
                                "generation": self.run.generation})
            self._resumed_from = None

    def state_dict(self) -> dict:
        """Everything but the model and optimizer that the run must carry across a reset
        (and a restart). Local for synchronous steps; ABS-SGD's gathers every rank's stream
        position (see `ABSWindows.state_dict`)."""
        return {"run": self.run.state_dict(), "steps": self.steps.state_dict(),
                "schedule": self.schedule.state_dict(), "world_size": self.comm.size}

    # -- checkpoints --------------------------------------------------------------------------

    def save_checkpoint(self) -> None:
        """Write a checkpoint of the run as it is after the last step (rank 0 writes).

        Collective: every rank calls it at the same step; the pending steps are exchanged
        and written to the metrics first, so a resumed run's metrics continue exactly."""
        self._write(self.steps.exchange())
        started = time.perf_counter()
        state = {"fingerprint": fingerprint(self.cfg), "trainer": self.state_dict(),
                 "model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(),
                 "rng": rng_state()}
        if self.comm.rank == 0:
            self.checkpoints.save(state, self.steps.step)
        self.run.checkpoint_seconds += time.perf_counter() - started

    def restore(self) -> Optional[dict]:
        """Load the newest checkpoint into the model, the optimizer and the random number
        generators; return the trainer's state to `join_world` with (None, and a fresh
        start, if there is no checkpoint). Rank 0 cuts the metrics file back to the
        checkpoint's step. Local: every rank reads the file itself."""
        found = self.checkpoints.newest_readable(self._say)
        if found is None:
            self._say(f"no checkpoint in {self.cfg.checkpoint_dir}: starting fresh")
            return None
        path, state = found
        check_fingerprint(state["fingerprint"], self.cfg, path)
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        set_rng_state(state["rng"])
        step = int(state["trainer"]["steps"]["step"])
        if self.comm.rank == 0 and self.cfg.metrics:
            truncate_metrics(self.cfg.metrics, step)
        self._say(f"resuming from {path} at step {step}")
        self._resumed_from = path
        return state["trainer"]

    def _say(self, message: str) -> None:
        if self.comm.rank == 0:
            print(f"hvd-dynbatch: {message}", file=sys.stderr, flush=True)

    # -- the run -----------------------------------------------------------------------------

    def loop(self, commit: Optional[Callable[[], None]] = None) -> None:
        """Train until the run's end; call `commit` every `commit_every` steps.

        Collective: every rank runs the same steps and exchanges.
        """
        cfg, steps = self.cfg, self.steps
        total = cfg.planned_steps(steps.steps_per_epoch())
        progress = self._progress_bar(total)
        changes = dict(cfg.batch_schedule)
        try:
            while steps.step < total and self.run.time_to_target is None:
                step = steps.step
                if step in changes:
                    self.schedule.on_batch_change(step, changes[step])
                epoch_before = steps.epoch
                info = steps.train_step(self.schedule.lr(step), self.emulator,
                                        self.samples_log, self.run.generation)
                self._info[step] = {"step": step, "generation": self.run.generation,
                                    "time": steps.clock, **info}
                try:
                    self._info[step].update(self._check_finite(step, info["lr"]))
                except DynBatchError as error:
                    # Every rank stops here alike (the reduced gradient is the same).
                    self._info[step]["skipped"] = True
                    self._record_stop(str(error))
                    raise
                if self.emulator.calibrated(step):
                    self._info[step]["emulator_calibration"] = True
                last = steps.step == total
                if self._write(steps.exchange() if last else steps.take_records()) and \
                        progress is not None:
                    progress.update(steps.step - progress.n)
                    progress.set_postfix(loss=f"{self.run.last_loss:.3f}",
                                         split=",".join(map(str, self._last_sizes)))
                epoch_end = steps.epoch != epoch_before
                if last:
                    self._drain()
                if (cfg.eval_every and steps.step % cfg.eval_every == 0) or \
                        (not cfg.eval_every and epoch_end):
                    self._evaluate()
                if commit is not None and steps.step % cfg.commit_every == 0:
                    self._write(steps.exchange())
                    commit()
                if steps.stop_requested and steps.step < total:
                    self._stop()
                if self.checkpoints is not None and steps.step % cfg.checkpoint_every == 0 \
                        and steps.step < total:
                    self.save_checkpoint()
            # The run's last update (ABS-SGD's pending one) comes before the last step's
            # evaluation; a run stopped early at its target has the final figures taken again.
            if self._drain() or self.run.last_eval_step != steps.step:
                self._evaluate()
            gathered = self.comm.allgather([self._weights_checksum(), steps.skipped_samples
                                            + self.data.test.take_skipped()])
            self.checksums, self.skipped_samples = gathered[:, 0], int(gathered[:, 1].sum())
        finally:
            if progress is not None:
                progress.close()

    def _stop(self) -> None:
        """Every rank, at the same step: write a checkpoint if there is a directory for one,
        then raise `Stopped`."""
        who = self.stop_reason or "a signal to another rank"
        if self.checkpoints is None:
            stop = Stopped(f"stopped by {who} at step {self.steps.step}; no --checkpoint-dir, "
                           f"so nothing was saved")
        else:
            self.save_checkpoint()
            stop = Stopped(f"stopped by {who} at step {self.steps.step} with a checkpoint in "
                           f"{self.cfg.checkpoint_dir}; the same command with --resume goes on")
        self._record_stop(str(stop))
        raise stop

    def _record_stop(self, reason: str) -> None:
        """Write the steps not yet written and a record of the stop (collective: every rank
        stops at the same step)."""
        self._write(self.steps.exchange())
        self.metrics.write({"type": "stop", "step": self.steps.step, "reason": reason})

    def _drain(self) -> bool:
        """Apply ABS-SGD's pending update, the last window's, and check it; whether there was
        one (never in synchronous training)."""
        steps = self.steps
        lr = self.schedule.lr(steps.step)
        drained = steps.drain(lr)
        if drained:
            self._check_finite(steps.step - 1, lr, drained=True)
        return drained

    def _check_finite(self, step: int, lr: float, drained: bool = False) -> dict:
        """After an update: nothing if its gradient was finite. Else it was not applied, and
        under `--on-nan stop` the run ends here, on every rank alike (the reduced gradient
        is the same everywhere); under `skip` the step is counted and marked. ABS-SGD's
        `drained` update, the last window's, comes after the last step's record is written:
        `final_update_skipped` says it was skipped, so the summary's count of skipped steps
        is the number of records marked."""
        run = self.run
        if self.steps.finite:
            run.skipped_in_a_row = 0
            return {}
        if self.steps.overflowed:
            run.overflow_steps += 1
            return {"skipped": True, "overflow": True}
        if drained:
            run.final_update_skipped = True
        else:
            run.skipped_steps += 1
        run.skipped_in_a_row += 1
        if self.cfg.on_nan is OnNan.STOP:
            raise DynBatchError(
                f"the gradient of step {step} is not finite (the loss is NaN or infinite, "
                f"lr {lr:g}); the update was not applied and the run stops. Lower --lr, or "
                f"pass --on-nan skip to skip such steps")
        if run.skipped_in_a_row >= self.cfg.skip_limit:
            raise DynBatchError(
                f"the gradients of the last {run.skipped_in_a_row} steps, up to step {step}, "
                f"were not finite (lr {lr:g}); past --skip-limit {self.cfg.skip_limit} the "
                f"run stops as under --on-nan stop. Lower --lr")
        return {"skipped": True}

    def _write(self, records: list) -> bool:
        """Write the exchanged steps' metrics (rank 0), note the last loss and split, and show
        them to the emulator."""
        self.emulator.observe(records)
        for record in records:
            info = self._info.pop(record.step, {"step": record.step})
            self.run.last_loss = record.loss
            self._last_sizes = record.batch_sizes
            self.metrics.write({**info, "epoch": record.epoch, "world_size": self.comm.size,
                                "global_batch": record.global_batch,
                                "batch_sizes": record.batch_sizes,
                                "compute_times": record.compute_times,
                                "update_times": record.update_times, "loss": record.loss})
        return bool(records)

    def finish(self) -> dict:
        """Write the summary (and the model, on rank 0); return the summary. Weights that
        are not finite are neither saved nor returned as a success: the same error on every
        rank (they hold the same weights). A run that skipped steps says how many."""
        summary = self._summary()
        self.metrics.write(summary)
        self.metrics.set_path(None)
        if not self.weights_finite():
            raise DynBatchError("the final weights are not finite (NaN or infinite), so "
                                "they were not saved; lower --lr")
        if self.run.skipped_steps:
            self._say(f"warning: {self.run.skipped_steps} of {self.steps.step} steps were "
                      f"not applied (their gradients were not finite; --on-nan skip)")
        if self.comm.rank == 0 and self.cfg.save_model:
            _save_atomically(self.model.state_dict(), self.cfg.save_model)
        return summary

    def weights_finite(self) -> bool:
        """Whether every weight and buffer is finite (the same answer on every rank)."""
        return all_finite(v for v in self.model.state_dict().values() if v.is_floating_point())

    def _progress_bar(self, total: int):
        if self.comm.rank != 0 or not self.cfg.progress:
            return None
        from tqdm import tqdm

        # disable=None: shown on a terminal, silent in logs and pipes.
        return tqdm(total=total, initial=self.steps.step, unit="step", disable=None,
                    dynamic_ncols=True)

    def _weights_checksum(self) -> int:
        return weights_checksum(self.model.state_dict())

    def _evaluate(self) -> dict:
        """Test accuracy and loss over the whole test set, each rank taking a share, and
        each rank's weights checksum (ranks that drifted apart show at the next evaluation).
        Writes and returns the eval record.

        Collective: every rank calls it at the same step.
        """
        self._write(self.steps.exchange())
        figures = evaluate(self.model, self.data.test, self.comm)
        self.run.accuracy, self.run.top5 = figures["accuracy"], figures["top5"]
        self.run.last_eval_step = self.steps.step
        record = {"type": "eval", "step": self.steps.step, "epoch": self.steps.epoch,
                  "time": self.steps.clock, **figures}
        self.metrics.write(record)
        target = self.cfg.target_accuracy
        if target is not None and self.run.time_to_target is None and \
                self.run.accuracy >= target:
            self.run.time_to_target = self.steps.clock
        return record

    def _summary(self) -> dict:
        cfg, steps, run = self.cfg, self.steps, self.run
        return {
            "type": "summary",
            "rank": self.comm.rank,
            "batching": cfg.batching.value,
            "controller": cfg.controller.value if cfg.batching is Batching.DYNAMIC else None,
            "world_size": self.comm.size,
            "device": str(self.device),
            "reduced_through_host": self.through_host,
            "elastic_generations": run.generation if cfg.elastic else None,
            "exchange_backend": self.comm.backend,
            "steps": steps.step,
            "epochs_completed": steps.epoch,
            "samples": steps.samples,
            "train_seconds": steps.clock,
            "samples_per_sec": steps.samples / steps.clock if steps.clock else 0.0,
            "exchange_seconds": steps.exchange_seconds,
            "exchanges": steps.exchanges,
            "final_loss": run.last_loss,
            "final_accuracy": run.accuracy,
            "final_top5": run.top5,
            "target_accuracy": cfg.target_accuracy,
            "time_to_target": run.time_to_target,
            "skipped_steps": run.skipped_steps,
            "final_update_skipped": run.final_update_skipped,
            "overflow_steps": run.overflow_steps,
            "checkpoint_seconds": run.checkpoint_seconds,
            "skipped_samples": self.skipped_samples,
            "final_split": steps.final_split(),
            "weights_checksums": [int(c) for c in self.checksums],
            "weights_identical": bool(np.all(self.checksums == self.checksums[0])),
            "config": cfg.plain(),
        }


def evaluate(model, test, comm: Communicator, chunk: int = 512) -> dict:
    """Top-1 and top-5 accuracy and mean loss of `model` over the split `test`, each rank
    taking every size-th sample, and every rank's weights checksum.

    Collective: every rank calls it.
    """
    mine = np.arange(comm.rank, len(test), comm.size)
    device = parameters_device(model)
    model.eval()
    correct, top5, loss_sum = 0.0, 0.0, 0.0
    with torch.no_grad():
        for start in range(0, len(mine), chunk):
            x, y = to_device(test.fetch(mine[start:start + chunk]), device)
            out = model(x)
            best = out.topk(min(5, out.shape[1]), dim=1).indices
            correct += (best[:, 0] == y).sum().item()
            top5 += (best == y[:, None]).any(dim=1).sum().item()
            loss_sum += F.cross_entropy(out, y, reduction="sum").item()
    gathered = comm.allgather([correct, top5, loss_sum, len(mine),
                               weights_checksum(model.state_dict())])
    totals = gathered[:, :4].sum(axis=0)
    return {"accuracy": float(totals[0] / totals[3]), "top5": float(totals[1] / totals[3]),
            "test_loss": float(totals[2] / totals[3]),
            "weights_checksums": [int(c) for c in gathered[:, 4]]}


def weights_checksum(state_dict: dict) -> int:
    """CRC-32 of a model's parameters and buffers, byte for byte (equal weights, equal sum)."""
    crc = 0
    for value in state_dict.values():
        crc = zlib.crc32(value.detach().cpu().contiguous().numpy().tobytes(), crc)
    return crc


def _check_writable(path: str, option: str) -> None:
    """Fail at the start, not after the training, if the file `path` cannot be written."""
    target = Path(path)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise DynBatchError(f"{option} {path}: cannot create its folder ({exc.strerror})") \
            from None
    if target.is_dir() or not os.access(target.parent, os.W_OK) or \
            (target.exists() and not os.access(target, os.W_OK)):
        raise DynBatchError(f"{option} {path} is not a writable file")


def _save_atomically(state_dict: dict, path: str) -> None:
    """Write the model whole or not at all (see `files.replaced_atomically`)."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    try:
        with replaced_atomically(path) as f:
            torch.save(state_dict, f)
    except OSError as exc:
        raise DynBatchError(f"cannot write --save-model {path}: {exc.strerror}") from None
