"""Elastic training: the run goes on while workers join and leave (Horovod Elastic, Gloo).

Horovod's `TorchState` holds the model and the optimizer, and one more attribute, `progress`:
the rest of what must survive, as plain values that rank 0 broadcasts on every sync: the step,
the sampler's position (epoch, offset), the controller's state and split, the learning-rate
schedule's state, the clocks and counters. It is committed every `commit_every` steps; a
commit is also where Horovod notices that hosts were added or removed.

On a reset (a worker joined, left or died) Horovod re-initialises, calls `on_reset` on every
surviving rank (no collectives allowed there: the new workers are not in yet), syncs the
state from rank 0, and calls the training function again, which binds the trainer to the new
world (`Trainer.join_world`): a new split for the new worker set, fresh timings, and, under
the `scale` policy, a new global batch with the learning-rate rule's move to it. After a
failure the state is first restored to the last commit, so the steps since then are redone;
they are the only samples seen twice within an epoch.
"""
from __future__ import annotations

from .comm import for_horovod
from .controller import ControllerState


def progress_of(trainer) -> dict:
    """What `trainer` must carry across a reset, as plain values (local: no collective)."""
    return {
        "step": trainer.step,
        "generation": trainer.generation,
        "start_world": trainer.start_world,
        "world_size": trainer.size,
        "sampler": trainer.sampler.state_dict(),
        "split": list(trainer.sampler.batch_sizes),
        "controller": trainer.controller.state.state_dict(),
        "schedule": trainer.schedule.state_dict(),
        "train_seconds": trainer.train_seconds,
        "exchange_seconds": trainer.exchange_seconds,
        "samples": trainer.samples,
        "last_loss": trainer.last_loss,
        "accuracy": trainer.accuracy,
        "last_eval_step": trainer.last_eval_step,
        "time_to_target": trainer.time_to_target,
    }


def resume(trainer, progress: dict, comm) -> None:
    """Adopt the synced `progress` and bind `trainer` to the world of `comm` (local).

    The committed split and the controller's state carry over when the world kept its size;
    a world of another size starts from an even split (see `Trainer.join_world`).
    """
    for key in ("step", "generation", "start_world", "train_seconds", "exchange_seconds",
                "samples", "last_loss", "accuracy", "last_eval_step", "time_to_target"):
        setattr(trainer, key, progress[key])
    trainer.sampler.load_state_dict(progress["sampler"])
    trainer.schedule.load_state_dict(progress["schedule"])
    same_world = progress["world_size"] == comm.size and progress["step"] > 0
    trainer.controller.state = ControllerState.from_state_dict(progress["controller"])
    trainer.join_world(comm, committed_split=progress["split"] if same_world else None)


def on_reset(trainer) -> None:
    """Horovod's reset callback: forget this rank's uncommitted per-rank facts.

    Runs before the state sync, so it must not communicate; it only drops local data.
    """
    trainer.pending.clear()
    trainer.pending_info.clear()
    trainer.timer.reset()


def run_elastic(trainer) -> None:
    """Run `trainer.loop` under `hvd.elastic.run` until the run ends.

    Collective in Horovod's elastic sense: every worker of the job, present or joining, calls
    it; Horovod keeps them together across resets.
    """
    import horovod.torch as hvd

    state = hvd.elastic.TorchState(model=trainer.model, optimizer=trainer.optimizer,
                                   progress=progress_of(trainer))
    state.register_reset_callbacks([lambda: on_reset(trainer)])

    def commit() -> None:
        state.progress = progress_of(trainer)
        state.commit()

    @hvd.elastic.run
    def train_elastic(state):
        resume(trainer, state.progress, for_horovod())
        trainer.loop(commit=commit)

    train_elastic(state)
