"""Metrics as JSON lines: one record per step, then one `"type": "summary"` record.

Only rank 0 writes. Records are flushed as they are written, so a run that dies leaves every
step it reported.
"""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Optional


def _plain(value):
    """JSON has no NaN or infinity: write them as null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


class MetricsWriter:
    """Appends records to a JSON-lines file; a writer without a path writes nothing."""

    def __init__(self, path: Optional[str]):
        self._file = None
        if path:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            self._file = open(path, "w", encoding="utf-8")

    def write(self, record: dict) -> None:
        if self._file is not None:
            self._file.write(json.dumps(_plain(record)) + "\n")
            self._file.flush()

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


def read_metrics(path: str) -> list:
    """All records of a metrics file, in order."""
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]
