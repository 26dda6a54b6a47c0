"""The variable-batch sampler: exactly-once coverage, contiguous slices, saved position."""
import numpy as np
import pytest

from hvd_dynbatch.core.sampler import ShardStream, VariableBatchSampler
from hvd_dynbatch.errors import DynBatchError


def samplers(n, sizes, seed=0, **kw):
    return [VariableBatchSampler(n, r, sizes, seed, **kw) for r in range(len(sizes))]


def test_every_sample_once_per_epoch_while_the_split_changes():
    ranks = samplers(1000, [10, 20, 34], seed=5)
    rng = np.random.default_rng(0)
    seen = {0: [], 1: []}
    while ranks[0].epoch < 2:
        epoch = ranks[0].epoch
        plans = [s.next_step() for s in ranks]
        assert len({(p.epoch, p.offset, p.sizes) for p in plans}) == 1
        seen[epoch].extend(i for p in plans for i in p.indices)
        if rng.random() < 0.3:
            new = rng.multinomial(61, [0.2, 0.3, 0.5]) + 1
            for s in ranks:
                s.batch_sizes = new
    for epoch in (0, 1):
        assert sorted(seen[epoch]) == list(range(1000))
    assert seen[0] != seen[1], "each epoch has its own order"


def test_every_sample_once_when_the_global_batch_and_the_ranks_change_mid_epoch():
    """What elastic runs and --batch-schedule do: B changes mid-epoch (64 -> 24), then the
    job goes from 3 ranks to 2, whose samplers restore the position from a saved state."""
    ranks = samplers(500, [20, 20, 24], seed=9)
    used = []
    for _ in range(3):
        used.extend(i for s in ranks for i in s.next_step().indices)
    for s in ranks:
        s.batch_sizes = [8, 8, 8]
    for _ in range(4):
        used.extend(i for s in ranks for i in s.next_step().indices)
    state = ranks[0].state_dict()
    ranks = samplers(500, [30, 10], seed=0)
    for s in ranks:
        s.load_state_dict(state)
    while ranks[0].epoch == 0:
        plans = [s.next_step() for s in ranks]
        assert len({(p.epoch, p.offset, p.sizes) for p in plans}) == 1
        used.extend(i for p in plans for i in p.indices)
    assert sorted(used) == list(range(500))


def test_rank_slices_are_contiguous_in_the_shared_permutation():
    ranks = samplers(100, [3, 5, 2], seed=1)
    perm = ranks[0].permutation(0)
    plans = [s.next_step() for s in ranks]
    assert plans[0].indices.tolist() == perm[0:3].tolist()
    assert plans[1].indices.tolist() == perm[3:8].tolist()
    assert plans[2].indices.tolist() == perm[8:10].tolist()
    assert [s.offset for s in ranks] == [10, 10, 10]


def test_last_partial_step_is_split_in_proportion():
    ranks = samplers(25, [2, 8])
    plans = [[s.next_step() for s in ranks] for _ in range(3)]
    last = plans[-1]
    assert last[0].sizes == (1, 4) and last[0].global_size == 5
    assert ranks[0].epoch == 1 and ranks[0].offset == 0


def test_drop_last_skips_the_partial_step():
    s = VariableBatchSampler(25, 0, [2, 8], drop_last=True)
    assert len(s) == 2
    assert [s.next_step().epoch for _ in range(3)] == [0, 0, 1]


def test_position_restores_to_the_same_stream():
    a = VariableBatchSampler(500, 1, [7, 9], seed=3)
    for _ in range(40):
        a.next_step()
    state = a.state_dict()
    b = VariableBatchSampler(500, 1, [7, 9], seed=0)
    b.load_state_dict(state)
    for _ in range(30):
        assert a.next_step().indices.tolist() == b.next_step().indices.tolist()


@pytest.mark.parametrize("offset", [-1, 500, 501])
def test_a_saved_position_outside_the_dataset_is_refused(offset):
    sampler = VariableBatchSampler(500, 0, [7, 9])
    with pytest.raises(DynBatchError, match=f"offset {offset} is outside"):
        sampler.load_state_dict({"epoch": 0, "offset": offset, "seed": 0})


def test_it_is_a_pytorch_batch_sampler():
    import torch

    data = torch.utils.data.TensorDataset(torch.arange(50))
    sampler = VariableBatchSampler(50, 1, [4, 6], seed=2)
    loader = torch.utils.data.DataLoader(data, batch_sampler=sampler)
    batches = [b[0].tolist() for b in loader]
    assert len(batches) == len(sampler) == 5
    assert all(len(b) == 6 for b in batches)
    assert len(set(sum(batches, []))) == 30


@pytest.mark.parametrize("sizes", [[4, -1], [0, 0]])
def test_bad_sizes_are_rejected(sizes):
    with pytest.raises(DynBatchError):
        VariableBatchSampler(10, 0, sizes)


def test_rank_outside_the_split_is_rejected():
    with pytest.raises(DynBatchError, match="rank 2"):
        VariableBatchSampler(10, 2, [4, 4])


def test_min_share_keeps_every_non_empty_slice_trainable():
    """Batch norm cannot train on one sample: the epoch's short last step gives no rank
    fewer than min_share samples, and a remainder below min_share is skipped."""
    for size, split in ((103, (60, 40)), (101, (60, 40)), (205, (60, 30, 11))):
        for rank in range(len(split)):
            sampler = VariableBatchSampler(size, rank, split, seed=1, min_share=2)
            steps = [sampler.next_step() for _ in range(sampler.steps_per_epoch())]
            for plan in steps:
                assert all(s == 0 or s >= 2 for s in plan.sizes), plan.sizes
            used = sum(plan.global_size for plan in steps)
            assert used == size - (size % sum(split) if size % sum(split) < 2 else 0)
            assert sampler.next_step().epoch == 1


class TestShardStream:
    def test_shards_are_disjoint_and_cover_each_epoch(self):
        streams = [ShardStream(103, rank, 3, seed=4) for rank in range(3)]
        firsts = [s.take(len(s._shard())) for s in streams]
        assert sorted(np.concatenate(firsts).tolist()) == list(range(103))
        assert [len(f) for f in firsts] == [35, 34, 34]
        assert all((s.epoch, s.position) == (1, 0) for s in streams)

    def test_taking_past_the_shard_wraps_into_the_next_epoch(self):
        streams = [ShardStream(20, rank, 2, seed=3) for rank in range(2)]
        taken = [np.concatenate([s.take(7) for _ in range(3)]) for s in streams]
        assert all(len(t) == 21 and (s.epoch, s.position) == (2, 1)
                   for s, t in zip(streams, taken))
        for epoch in (slice(0, 10), slice(10, 20)):
            assert sorted(np.concatenate([t[epoch] for t in taken])) == list(range(20))
        assert taken[0][:10].tolist() != taken[0][10:20].tolist(), "each epoch has its order"
        again = ShardStream(20, 1, 2, seed=3)
        assert again.take(21).tolist() == taken[1].tolist(), "the stream is seeded"

    def test_a_dataset_smaller_than_the_world_is_refused(self):
        with pytest.raises(DynBatchError, match="cannot be sharded over 3 ranks"):
            ShardStream(2, 0, 3)
