"""Splits as DataLoader datasets, and the on-demand loader of ABS-SGD's micro-batches.

`SplitDataset` lets a `torch.utils.data.DataLoader` (the one `DynamicBatching.loader` builds
for the synchronous loop) fetch a whole step's samples with one `fetch` call in a worker.

`BatchLoader` serves ABS-SGD, whose windows ask for one micro-batch at a time with no plan
ahead: with `workers` > 0, a persistent DataLoader decodes each request in that many worker
processes, each taking a contiguous chunk (JPEG decoding and resizing is where an
ImageNet-style run spends its data time); with 0 the split is read in this process.
"""
from __future__ import annotations

from typing import Sequence, Tuple

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset


class _StepChunks:
    """The loader's batch sampler: the index chunks of the step being fetched."""

    def __init__(self):
        self.chunks = []

    def __iter__(self):
        return iter(self.chunks)

    def __len__(self) -> int:
        return len(self.chunks)


class SplitDataset(Dataset):
    """A split (anything with `fetch(indices)`, `take_skipped()` and `len`) as a map-style
    dataset that hands whole batches to the DataLoader's workers (with `collate_fn=as_is`):
    (inputs, labels, the number of unreadable samples replaced in them). The count travels
    with the batch because a worker's split is its own copy."""

    def __init__(self, split):
        self.split = split

    def __len__(self) -> int:
        return len(self.split)

    def __getitems__(self, indices):
        x, y = self.split.fetch(indices)
        return x, y, self.split.take_skipped()


def as_is(batch):
    """The collate function of `SplitDataset`: its batches are already tensors."""
    return batch


class BatchLoader:
    """Fetches batches by sample index from `split`, in `workers` DataLoader processes."""

    def __init__(self, split, workers: int = 0):
        if workers < 0:
            raise ValueError(f"the number of loader workers must not be negative, got {workers}")
        self.split, self.workers = split, workers
        self.skipped = 0              # unreadable samples replaced in the batches fetched
        self._chunks = _StepChunks()
        self._loader = None
        if workers:
            self._loader = DataLoader(SplitDataset(split), batch_sampler=self._chunks,
                                      num_workers=workers, collate_fn=as_is,
                                      persistent_workers=True)

    def fetch(self, indices: Sequence[int]) -> Tuple[torch.Tensor, torch.Tensor]:
        """The inputs and labels of samples `indices`, in that order."""
        if self._loader is None or len(indices) < 2:
            parts = [SplitDataset(self.split).__getitems__(indices)]
        else:
            chunks = np.array_split(np.asarray(indices), min(self.workers, len(indices)))
            self._chunks.chunks = [c.tolist() for c in chunks]
            parts = list(self._loader)
        self.skipped += sum(skipped for _, _, skipped in parts)
        return torch.cat([x for x, _, _ in parts]), torch.cat([y for _, y, _ in parts])
