"""Elastic training: the run goes on while workers join and leave (Horovod Elastic, Gloo).

Horovod's `TorchState` holds the model and the optimizer, and one more attribute, `progress`:
the trainer's `state_dict()` (the run's state, the steps' position, splits and controller,
the learning-rate schedule), plain values that rank 0 broadcasts on every sync. It is
committed every `commit_every` steps; a commit is also where Horovod notices that hosts were
added or removed.

On a reset (a worker joined, left or died) Horovod re-initialises, calls `on_reset` on every
surviving rank (no collectives allowed there: the new workers are not in yet), syncs the
state from rank 0, and calls the training function again, which binds the trainer to the new
world (`Trainer.join_world`): the committed split if the world kept its size, else a new
split for the new worker set, fresh timings, and, under the `scale` policy, a new global
batch with the learning-rate rule's move to it. After a failure the state is first restored
to the last commit, so the steps since then are redone; they are the only samples seen twice
within an epoch.
"""
from __future__ import annotations


def on_reset(trainer) -> None:
    """Horovod's reset callback: forget this rank's uncommitted per-rank facts.

    Runs before the state sync, so it must not communicate; it only drops local data.
    """
    trainer.steps.forget_uncommitted()


def run_elastic(trainer, backend, committed=None) -> None:
    """Run `trainer.loop` under Horovod Elastic until the run ends, from `committed` (a
    trainer `state_dict()` restored from a checkpoint) if given.

    Collective in Horovod's elastic sense: every worker of the job, present or joining, calls
    it; Horovod keeps them together across resets.
    """
    def train_elastic(state):
        def commit() -> None:
            state.progress = trainer.state_dict()
            state.commit()

        trainer.join_world(backend.communicator(), committed=state.progress)
        trainer.loop(commit=commit)

    backend.run_elastic(trainer.model, trainer.optimizer, committed or trainer.state_dict(),
                        lambda: on_reset(trainer), train_elastic)
