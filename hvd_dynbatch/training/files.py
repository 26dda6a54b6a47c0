"""Files written whole or not at all: the saved model, checkpoints, a rewritten metrics file."""
from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Optional


@contextlib.contextmanager
def replaced_atomically(path, tmp: Optional[Path] = None):
    """A binary file to write `path`'s new content to: a temporary file (`tmp`, default
    `PATH.tmp.PID`, in the same directory) that is flushed to disk and renamed over `path`
    when the block ends, so a reader sees the old file or the whole new one. If the block
    or the rename fails, the temporary file is removed and the error raised."""
    tmp = Path(tmp or f"{path}.tmp.{os.getpid()}")
    try:
        with open(tmp, "wb") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def remove_stray_temporaries(path) -> None:
    """Remove the temporary files `replaced_atomically` left for `path` when a writer was
    killed mid-write (`PATH.tmp.PID` of a process that is gone)."""
    import psutil

    path = Path(path)
    for stray in path.parent.glob(f"{path.name}.tmp.*"):
        pid = stray.name.rsplit(".", 1)[1]
        if pid.isdigit() and not psutil.pid_exists(int(pid)):
            stray.unlink(missing_ok=True)
