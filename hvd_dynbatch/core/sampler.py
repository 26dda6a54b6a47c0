"""A distributed sampler for batches whose size differs between ranks and changes over time.

Every rank draws the same seeded permutation of the dataset each epoch. A step consumes the
next B indices of it (B = the sum of all ranks' batch sizes), and rank i takes the contiguous
slice that starts at b_0 + ... + b_{i-1}. So every sample is used exactly once per epoch
whatever the split is and however often it changes; the position (epoch, offset) is all the
state there is, and it can be saved and restored.

The last step of an epoch takes what is left (fewer than B samples), split in proportion to
the current batch sizes, so a rank can get an empty slice there; `drop_last=True` skips it.
A model with batch norm cannot train on one sample, so `min_share` makes every non-empty
slice at least that large (a slice too small goes to the rank with the most); fewer than
`min_share` samples left are skipped, as `drop_last` would. With `empty_slices=False` (a
user's DataLoader cannot hand out an empty batch) every rank gets at least `min_share` in the
short step too, and a rest smaller than `min_share` per rank is skipped.
Pure arithmetic: no communication, no Horovod.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator, Sequence

import numpy as np

from ..errors import DynBatchError
from .controller import apportion


@dataclass(frozen=True)
class StepPlan:
    """What one step consumes: its place in the epoch, every rank's share, and this rank's
    indices."""

    epoch: int
    offset: int          # where the step starts in the epoch's permutation
    sizes: tuple         # every rank's batch size for this step
    indices: np.ndarray  # this rank's sample indices

    @property
    def global_size(self) -> int:
        return int(sum(self.sizes))


class VariableBatchSampler:
    """Yields this rank's indices step by step; set `batch_sizes` to change the split.

    It is a PyTorch batch sampler (iterating gives the index lists of the rest of the current
    epoch), and `next_step()` gives the full `StepPlan`, including the step's global size,
    which weighting the gradients needs.
    """

    def __init__(self, dataset_size: int, rank: int, batch_sizes: Sequence[int], seed: int = 0,
                 drop_last: bool = False, min_share: int = 1, empty_slices: bool = True):
        if dataset_size < 1:
            raise DynBatchError(f"the dataset is empty (size {dataset_size})")
        self.dataset_size = int(dataset_size)
        self.min_share = max(int(min_share), 1)
        self.empty_slices = empty_slices
        self.rank = int(rank)
        self.seed = int(seed)
        self.drop_last = drop_last
        self.epoch = 0
        self.offset = 0
        self._perm_epoch, self._perm = None, None
        self.batch_sizes = batch_sizes

    @property
    def batch_sizes(self) -> tuple:
        return self._sizes

    @batch_sizes.setter
    def batch_sizes(self, sizes: Sequence[int]) -> None:
        sizes = tuple(int(s) for s in sizes)
        if not 0 <= self.rank < len(sizes):
            raise DynBatchError(f"rank {self.rank} has no entry in batch sizes {list(sizes)}")
        if min(sizes) < 0 or sum(sizes) < 1:
            raise DynBatchError(f"batch sizes must be non-negative with a positive sum, "
                                f"got {list(sizes)}")
        self._sizes = sizes

    @property
    def global_batch(self) -> int:
        return sum(self._sizes)

    def _least_step(self) -> int:
        """The fewest samples a short last step may have; fewer are skipped."""
        return self.min_share if self.empty_slices else self.min_share * len(self._sizes)

    def steps_per_epoch(self) -> int:
        full, rest = divmod(self.dataset_size, self.global_batch)
        return full + (1 if rest >= self._least_step() and not self.drop_last else 0)

    def permutation(self, epoch: int) -> np.ndarray:
        """The epoch's order of samples, the same on every rank."""
        if self._perm_epoch != epoch:
            rng = np.random.default_rng([self.seed, epoch])
            self._perm, self._perm_epoch = rng.permutation(self.dataset_size), epoch
        return self._perm

    def upcoming_epoch(self) -> int:
        """The epoch the next step falls in (a rest too small for a step is skipped)."""
        left = self.dataset_size - self.offset
        if left < self.global_batch and (self.drop_last or left < self._least_step()):
            return self.epoch + 1
        return self.epoch

    def next_step(self) -> StepPlan:
        """The next step's plan; advances the position (rolling over to the next epoch)."""
        if self.upcoming_epoch() != self.epoch:
            self.epoch, self.offset = self.epoch + 1, 0
        left = self.dataset_size - self.offset
        sizes = self._sizes
        if left < self.global_batch:
            sizes = self._short_step(left)
        start = self.offset + sum(sizes[:self.rank])
        indices = self.permutation(self.epoch)[start:start + sizes[self.rank]]
        plan = StepPlan(self.epoch, self.offset, sizes, indices)
        self.offset += sum(sizes)
        if self.offset >= self.dataset_size:
            self.epoch, self.offset = self.epoch + 1, 0
        return plan

    def _short_step(self, left: int) -> tuple:
        """The split of an epoch's last `left` samples: in proportion to the batch sizes, then
        slices below `min_share` handed to the rank with the most (or, without empty slices,
        at least `min_share` each)."""
        if not self.empty_slices:
            return tuple(int(s) for s in apportion(self._sizes, left, lower=self.min_share))
        sizes = [int(s) for s in apportion(self._sizes, left, lower=0)]
        small = [i for i, s in enumerate(sizes) if 0 < s < self.min_share]
        for i in sorted(small, key=lambda k: (sizes[k], k)):
            largest = max(range(len(sizes)), key=lambda k: (sizes[k], -k))
            sizes[largest], sizes[i] = sizes[largest] + sizes[i], 0
        return tuple(sizes)

    def __iter__(self) -> Iterator[list]:
        epoch = self.epoch
        while self.epoch == epoch:
            yield self.next_step().indices.tolist()

    def __len__(self) -> int:
        return self.steps_per_epoch()

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "offset": self.offset, "seed": self.seed}

    def load_state_dict(self, state: dict) -> None:
        if not 0 <= int(state["offset"]) < self.dataset_size:
            raise DynBatchError(f"sampler offset {state['offset']} is outside a dataset of "
                                f"{self.dataset_size} samples")
        self.epoch, self.offset = int(state["epoch"]), int(state["offset"])
        self.seed = int(state["seed"])
        self._perm_epoch = None


class ShardStream:
    """This rank's own endless stream of samples, for methods without a planned batch (ABS-SGD).

    Every rank uses the same seeded permutation per epoch and reads its shard of it (every
    size-th index, from its rank on); a rank that computes faster passes over its shard more
    often, so each rank counts its own epochs. `take(m)` returns the next m indices, wrapping
    into the rank's next epoch.
    """

    def __init__(self, dataset_size: int, rank: int, size: int, seed: int = 0):
        if dataset_size < size:
            raise DynBatchError(f"a dataset of {dataset_size} samples cannot be sharded over "
                                f"{size} ranks")
        self._sampler = VariableBatchSampler(dataset_size, 0, [1], seed)
        self.rank, self.size = rank, size
        self.epoch, self.position = 0, 0

    def _shard(self) -> np.ndarray:
        return self._sampler.permutation(self.epoch)[self.rank::self.size]

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "position": self.position}

    def load_state_dict(self, state: dict) -> None:
        self.epoch, self.position = int(state["epoch"]), int(state["position"])

    def take(self, count: int) -> np.ndarray:
        taken = []
        while count > 0:
            shard = self._shard()
            piece = shard[self.position:self.position + count]
            taken.append(piece)
            count -= len(piece)
            self.position += len(piece)
            if self.position >= len(shard):
                self.epoch, self.position = self.epoch + 1, 0
        return np.concatenate(taken)
