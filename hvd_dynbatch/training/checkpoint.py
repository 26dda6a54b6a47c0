"""Checkpoints on disk: written atomically by rank 0, read by every rank to resume.

A checkpoint is one `torch.save` file, `DIR/checkpoint-STEP.pt` (STEP zero-padded, so the
names sort by step), holding the model, the optimizer (its momentum), the trainer's
`state_dict()` (the run's state, the steps' position, splits and controller, the
learning-rate schedule with any ramp in progress, the clocks), the random number generators
and a fingerprint of the settings a resumed run must share with the one that wrote it.

It is written to a temporary file in the same directory and renamed over the final name
(`files.replaced_atomically`), so a reader never sees half a checkpoint; a writer killed mid-write leaves only the temporary
file, which the next `CheckpointDir` removes. The newest `keep` checkpoints are kept.
"""
from __future__ import annotations

import os
import random
import re
from pathlib import Path
from typing import Optional

import numpy as np
import torch

from ..data.datasets import IMAGE_SIZES
from ..errors import DynBatchError
from .files import replaced_atomically

# The settings a checkpoint cannot be resumed under a different value of: the weights' shape
# (model, dataset, image size), the sample order (seed, dataset) and the meaning of a step
# (global batch, batching method).
FINGERPRINT = ("model", "dataset", "image_size", "global_batch", "seed", "batching")
_NAME = re.compile(r"checkpoint-(\d+)\.pt")
_TEMPORARY = ".tmp-checkpoint-"


class CheckpointDir:
    """The checkpoints of one run in `directory`, the newest `keep` of them kept.

    `writer` (rank 0) creates the directory and removes the temporary files of a writer that
    was killed; other ranks only read.
    """

    def __init__(self, directory: str, keep: int = 3, writer: bool = True):
        if keep < 1:
            raise DynBatchError(f"keep at least one checkpoint, got {keep}")
        self.directory, self.keep, self.writer = Path(directory), keep, writer
        if writer:
            try:
                self.directory.mkdir(parents=True, exist_ok=True)
                for stray in self.directory.glob(f"{_TEMPORARY}*"):
                    stray.unlink()
            except OSError as exc:
                raise DynBatchError(f"cannot use --checkpoint-dir {directory}: "
                                    f"{exc.strerror}") from None
            if not os.access(self.directory, os.W_OK):
                raise DynBatchError(f"--checkpoint-dir {directory} is not writable")

    def checkpoints(self) -> list:
        """The checkpoint files, oldest first."""
        if not self.directory.is_dir():
            return []
        found = [(int(m.group(1)), p) for p in self.directory.iterdir()
                 if (m := _NAME.fullmatch(p.name))]
        return [p for _, p in sorted(found)]

    def save(self, state: dict, step: int) -> Path:
        """Write `state` as the checkpoint of `step`, atomically; drop all but the newest
        `keep`. Returns its path."""
        path = self.directory / f"checkpoint-{step:09d}.pt"
        tmp = self.directory / f"{_TEMPORARY}{step}-{os.getpid()}"
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            with replaced_atomically(path, tmp) as f:
                torch.save(state, f)
        except OSError as exc:
            raise DynBatchError(f"cannot write checkpoint {path}: {exc.strerror}") from None
        for old in self.checkpoints()[:-self.keep]:
            old.unlink(missing_ok=True)
        return path

    def newest_readable(self, warn) -> Optional[tuple]:
        """(path, state) of the newest checkpoint that can be read, or None if there is
        none. An unreadable newer one (a disk that filled, a copy cut short) is named through
        `warn(message)` and, by the writer, set aside as `NAME.unreadable`; if none can be
        read, the error names the newest and what to do."""
        found = self.checkpoints()
        for path in reversed(found):
            try:
                return path, self.load(path)
            except DynBatchError as exc:
                warn(f"warning: skipping {exc}")
                if self.writer:
                    path.rename(path.with_name(path.name + ".unreadable"))
        if found:
            raise DynBatchError(f"none of the {len(found)} checkpoints in {self.directory} "
                                f"can be read (see the warnings); remove them to start "
                                f"fresh, or give another --checkpoint-dir")
        return None

    @staticmethod
    def load(path: Path) -> dict:
        """Read a checkpoint written by `save`."""
        try:
            return torch.load(path, map_location="cpu", weights_only=False)
        except Exception as exc:  # a truncated or foreign file: say which
            raise DynBatchError(f"cannot read checkpoint {path}: {exc}") from None


def fingerprint(config) -> dict:
    """The settings of `config` that a resumed run must share (see `FINGERPRINT`); the image
    size is the one the dataset uses (64 for the digits, which have none: the default that
    checkpoints written before the size depended on the dataset carry)."""
    found = {name: getattr(getattr(config, name), "value", getattr(config, name))
             for name in FINGERPRINT}
    found["image_size"] = found["image_size"] or IMAGE_SIZES.get(config.dataset, 64)
    return found


def check_fingerprint(saved: dict, config, path: Path) -> None:
    """Raise `DynBatchError` naming every setting in which `config` differs from `saved`."""
    now = fingerprint(config)
    changed = [f"--{name.replace('_', '-')} {saved.get(name)} (now {now[name]})"
               for name in FINGERPRINT if saved.get(name) != now[name]]
    if changed:
        raise DynBatchError(f"checkpoint {path} was written with {', '.join(changed)}; resume "
                            f"with the same settings, or use another --checkpoint-dir")


def rng_state() -> dict:
    """The random number generators' states (torch, numpy, Python)."""
    return {"torch": torch.get_rng_state(), "numpy": np.random.get_state(),
            "python": random.getstate()}


def set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    np.random.set_state(state["numpy"])
    random.setstate(state["python"])
