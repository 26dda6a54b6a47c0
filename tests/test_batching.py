"""DynamicBatching in one process: when a decided split takes effect under prefetch, what
is refused, and where a saved state resumes."""
import time

import numpy as np
import pytest
import torch
from torch.utils.data import TensorDataset

from hvd_dynbatch.backend.comm import Communicator, LocalCommunicator
from hvd_dynbatch.backend.weighting import LocalOptimizer
from hvd_dynbatch.core.controller import ControllerConfig, Rule
from hvd_dynbatch.core.timing import (HOLD_FACTOR, WARMUP_STEPS, exchange_due, hold_end,
                                      hold_steps, holds)
from hvd_dynbatch.errors import DynBatchError
from hvd_dynbatch.training.batching import DynamicBatching

DATA = TensorDataset(torch.arange(1000), torch.arange(1000))


class ScriptedPeer(Communicator):
    """Rank 0 of 2, whose peer reports the same facts in an exchange (`peer_row` scripts a
    change), and `peer_stops` in a step's stop poll (a gather of the stop flag alone)."""

    rank, size, backend = 0, 2, "scripted"
    peer_stops = 0.0

    def allgather(self, values):
        mine = np.asarray(values, dtype=np.float64)
        if len(mine) == 1:
            return np.array([mine, [self.peer_stops]])
        return np.vstack([mine, self.peer_row(mine.copy())])

    def peer_row(self, row: np.ndarray) -> np.ndarray:
        return row


class SlowPeer(ScriptedPeer):
    """The peer reports `factor` (4) times this rank's compute time."""

    def __init__(self, factor: float = 4.0):
        self.factor = factor

    def peer_row(self, row):
        row[2] *= self.factor  # the smoothed compute time, after the stop flag and the lag
        return row


def take(loader, batching, count):
    """The sample indices of `count` steps (across epochs), each closed as the optimizer
    would close it."""
    taken = []
    while len(taken) < count:
        for _, index in loader:
            taken.append(index.tolist())
            batching.step_done()
            if len(taken) == count:
                break
    return taken


def test_a_split_decided_after_step_k_takes_effect_at_k_plus_1_plus_the_prefetch_depth():
    batching = DynamicBatching(DATA, 64, SlowPeer(), adjust_every=3,
                               controller=ControllerConfig(64, rule=Rule.P))
    loader = batching.loader(num_workers=2)
    assert batching.lag == 4  # 2 workers x prefetch factor 2
    steps = take(loader, batching, 12)
    # The exchange after step 2 (3 steps done) decides (51, 13); steps 3..6 were already
    # planned by the loader and keep (32, 32).
    assert [len(s) for s in steps] == [32] * 7 + [51] * 5
    assert batching.split == (51, 13)
    records = batching.take_records()
    assert [r.step for r in records] == list(range(12))
    assert [r.batch_sizes[0] for r in records] == [32] * 7 + [51] * 5


def test_without_loader_workers_a_split_takes_effect_at_the_next_step():
    batching = DynamicBatching(DATA, 64, SlowPeer(), adjust_every=3,
                               controller=ControllerConfig(64, rule=Rule.P))
    steps = take(batching.loader(), batching, 5)
    assert batching.lag == 0 and [len(s) for s in steps] == [32, 32, 32, 51, 51]


class SwingingPeer(SlowPeer):
    """Like SlowPeer, but at every second exchange the peer is 4x faster instead: every
    exchange decides a new split."""

    def __init__(self):
        super().__init__()
        self.gathers = 0

    def peer_row(self, row):
        row = super().peer_row(row)
        self.gathers += 1
        if self.gathers % 2 == 0:
            row[2] /= 16
        return row


def test_splits_no_longer_in_force_are_forgotten():
    peer = SwingingPeer()
    batching = DynamicBatching(DATA, 64, peer, adjust_every=1, untimed_steps=0,
                               controller=ControllerConfig(64, rule=Rule.P))
    steps = take(batching.loader(), batching, 40)
    # 15 full steps of 64 in an epoch of 1000 samples.
    assert [len(s) for s in steps[:15]] == [32] + [51, 32] * 7 and peer.gathers == 40
    # A split was decided at every step; only the one in force is kept (a job of days would
    # otherwise scan and sort hundreds of thousands of them at every exchange).
    assert len(batching._splits) == 1


def test_the_controller_is_given_each_ranks_time_and_its_error():
    batching = DynamicBatching(DATA, 64, SlowPeer(), adjust_every=3, untimed_steps=0,
                               controller=ControllerConfig(64, rule=Rule.MODEL))
    seen, update = [], batching.controller.update

    def spy(sizes, times, errors):
        seen.append((list(times), list(errors), batching.timer.error))
        return update(sizes, times, errors)

    batching.controller.update = spy
    take(batching.loader(), batching, 3)
    (times, errors, own), = seen
    assert times[1] == pytest.approx(4 * times[0])
    assert np.isfinite(own) and errors == [own, own]  # the peer's is the same, relative


@pytest.mark.parametrize("warm_up, first_steps_timed", [({}, False),
                                                        ({"untimed_steps": 0}, True)])
def test_a_process_first_steps_are_not_timed(warm_up, first_steps_timed):
    """The first WARMUP_STEPS steps run slowly (a process warming up), as many after them
    quickly: by default the timing is the quick ones', without a warm-up the median of all."""
    batching = DynamicBatching(DATA, 64, LocalCommunicator(), adjust_every=100, **warm_up)
    steps = iter(batching.loader())
    for step in range(2 * WARMUP_STEPS):
        next(steps)
        time.sleep(0.3 if step < WARMUP_STEPS else 0.0)
        batching.step_done()
    assert (batching.timer.smoothed > 0.1) == first_steps_timed


def test_a_negative_warm_up_is_refused():
    with pytest.raises(DynBatchError, match="untimed_steps"):
        DynamicBatching(DATA, 64, LocalCommunicator(), untimed_steps=-1)


class BusyPeer(SlowPeer):
    """Rank 0 of 2, whose peer is busy 10 ms a step."""

    def peer_row(self, row):
        row[2] = 0.01
        return row


class SlowUpdateSGD(torch.optim.SGD):
    """SGD whose update takes 30 ms longer: a worker that is slow at the optimizer's step."""

    def step(self, closure=None):
        time.sleep(0.03)
        return super().step(closure)


def test_a_slow_update_counts_in_the_time_the_controller_balances():
    """Rank 0 computes its 32 samples in a few milliseconds at most but takes 30 ms to update;
    its peer is busy 10 ms a step. With the update counted rank 0 is the slow one and its
    batch shrinks, where its compute alone would have grown it."""
    batching = DynamicBatching(DATA, 64, BusyPeer(), adjust_every=3,
                               controller=ControllerConfig(64, rule=Rule.P))
    model = torch.nn.Linear(1, 1)
    optimizer = LocalOptimizer(SlowUpdateSGD(model.parameters(), lr=0.0), batching)
    for _, (x, _) in zip(range(4), batching.loader()):
        optimizer.zero_grad()
        model(x.float().unsqueeze(1)).sum().backward()
        optimizer.step()
    records = batching.take_records()
    assert [r.step for r in records] == [0, 1, 2]
    # Each step carries the update before it: none before the first.
    assert records[0].update_times[0] == 0.0
    assert all(0.03 <= r.update_times[0] < 0.1 for r in records[1:])
    assert np.median([r.compute_times[0] for r in records]) < 0.01   # the peer's 10 ms
    assert batching.last_update_seconds >= 0.03
    assert batching.split[0] < 32


def test_a_change_inside_the_prefetched_steps_is_refused():
    batching = DynamicBatching(DATA, 64, LocalCommunicator(), adjust_every=100)
    loader = batching.loader(num_workers=2)
    take(loader, batching, 2)
    with pytest.raises(DynBatchError, match="lag"):
        batching.set_global_batch(32, at_step=batching.step + 1)
    batching.set_global_batch(32, at_step=batching.step + 5)
    steps = take(loader, batching, 8)
    assert [len(s) for s in steps] == [64] * 5 + [32] * 3


def test_a_saved_state_resumes_at_the_next_step_to_train_not_the_prefetched_one():
    def fresh():
        return DynamicBatching(DATA, 64, LocalCommunicator(), adjust_every=100, seed=3)

    whole = fresh()
    expected = take(whole.loader(num_workers=2), whole, 20)
    first = fresh()
    take(first.loader(num_workers=2), first, 7)
    state = first.state_dict()
    assert state["step"] == 7 and state["position"]["offset"] == 7 * 64
    second = fresh()
    second.load_state_dict(state)
    # 16 steps per epoch (15 of 64, one of 40): the rest of epoch 0, then epoch 1.
    loader = second.loader(num_workers=2)
    rest = take(loader, second, 9) + take(loader, second, 4)
    assert second.epoch == 1
    assert rest == expected[7:]
    assert sorted(sum(expected[:16], [])) == list(range(1000))


@pytest.mark.parametrize("options, text", [
    ({"batch_size": 32}, "batch_size"),
    ({"shuffle": True}, "shuffle"),
    ({"sampler": [0, 1]}, "sampler"),
    ({"in_order": False}, "in order"),
])
def test_the_loader_refuses_options_that_choose_batches(options, text):
    batching = DynamicBatching(DATA, 64, LocalCommunicator())
    with pytest.raises(DynBatchError, match=text):
        batching.loader(**options)


def test_a_step_without_a_batch_says_what_to_do():
    batching = DynamicBatching(DATA, 64, LocalCommunicator())
    with pytest.raises(DynBatchError, match="batching.loader"):
        batching.step_done()


class StoppingPeer(SlowPeer):
    """Rank 0 of 2, whose peer asks to stop (a SIGTERM there)."""

    peer_stops = 1.0


def test_a_stop_asked_by_another_rank_is_known_here_at_the_end_of_the_step():
    batching = DynamicBatching(DATA, 64, StoppingPeer(), adjust_every=3)
    loader = batching.loader()
    assert not batching.stop_requested
    take(loader, batching, 1)
    assert batching.stop_requested and batching.step == 1


class EvenPeer(ScriptedPeer):
    """Rank 0 of 2, whose peer reports the same facts: the even split holds."""


def gather_steps(peer, batching) -> list:
    """The list to which each of `peer`'s exchanges (not the stop polls) adds the steps
    `batching` has done."""
    steps, gather = [], peer.allgather
    peer.allgather = lambda values: (len(values) > 1 and steps.append(batching.step)) or \
        gather(values)
    return steps


def test_while_the_split_holds_the_exchanges_are_spaced_out_and_nothing_is_lost():
    """Steps of microseconds here, so a hold lasts HOLD_FACTOR x adjust_every steps. A stop
    asked in a hold is heard at the end of the next step all the same (its poll); a change
    of B decided from outside ends the hold; the saved state carries it; every step's record
    arrives."""
    peer = EvenPeer()
    batching = DynamicBatching(DATA, 64, peer, adjust_every=2, untimed_steps=0,
                               controller=ControllerConfig(64, rule=Rule.P))
    gathers = gather_steps(peer, batching)
    hold = HOLD_FACTOR * 2
    loader = batching.loader()
    take(loader, batching, 2 + hold + 1)
    assert gathers == [2, 2 + hold]   # steps done at each gather
    assert batching.state_dict()["quiet_until"] == 2 + 2 * hold
    batching.request_stop()
    take(loader, batching, 1)
    assert batching.stop_requested and gathers == [2, 2 + hold]
    take(loader, batching, hold - 2)
    assert batching.step == 2 + 2 * hold
    batching.set_global_batch(32, at_step=batching.step + 3)
    take(loader, batching, 4)
    assert gathers[-2:] == [2 + 2 * hold, 2 + 2 * hold + 4]
    assert batching.global_batch == 32
    assert [r.step for r in batching.take_records()] == list(range(batching.step))

    resumed = DynamicBatching(DATA, 64, EvenPeer(), adjust_every=2)
    resumed.load_state_dict(batching.state_dict())
    assert resumed.state_dict()["quiet_until"] == batching.state_dict()["quiet_until"]
    assert resumed.exchanges == batching.exchanges == len(gathers)


@pytest.mark.parametrize("factor, touch_up", [(1.08, True), (1.3, False)])
def test_a_move_from_nearly_equal_times_holds_the_exchanges_too(factor, touch_up):
    """A peer 8% slower than this rank: each exchange moves the split by a sample, a
    touch-up after which the exchanges are spaced out as after a kept split. 30% slower:
    each is a real correction, and the next exchange comes `adjust_every` steps later."""
    peer = SlowPeer(factor)
    batching = DynamicBatching(DATA, 64, peer, adjust_every=2, untimed_steps=0,
                               controller=ControllerConfig(64, rule=Rule.P))
    gathers = gather_steps(peer, batching)
    take(batching.loader(), batching, 2 + 2 * HOLD_FACTOR * 2)
    every = HOLD_FACTOR * 2 if touch_up else 2
    assert gathers == list(range(2, 2 + 2 * HOLD_FACTOR * 2 + 1, every))
    assert batching.exchanges == len(gathers)
    assert batching.split[0] > 33   # moved at every exchange, holding or not
    assert holds((32, 32), (33, 31), [1.0, factor]) == touch_up


def test_holds_after_a_kept_split_whatever_the_times_and_never_without_times():
    assert holds((40, 24), (40, 24), [1.0, 3.0])
    assert not holds((32, 32), (33, 31), [1.0, float("nan")])


class SlowStartPeer(EvenPeer):
    """Takes 50 ms to start a gather."""

    def allgather_async(self, values):
        time.sleep(0.05)
        return super().allgather_async(values)


def test_starting_the_gather_inside_a_step_counts_as_the_exchange_not_the_step():
    batching = DynamicBatching(DATA, 64, SlowStartPeer(), adjust_every=2, untimed_steps=0)
    take(batching.loader(), batching, 2)
    assert batching.exchanges == 1 and batching.exchange_seconds >= 0.05
    assert batching.last_step_seconds < 0.05 and batching.timer.smoothed < 0.05
    assert batching.clock >= batching.exchange_seconds + batching.last_step_seconds


def test_without_a_hold_the_exchanges_come_every_adjust_every_steps():
    peer = EvenPeer()
    batching = DynamicBatching(DATA, 64, peer, adjust_every=2, untimed_steps=0,
                               hold_seconds=0.0, controller=ControllerConfig(64, rule=Rule.P))
    gathers = gather_steps(peer, batching)
    take(batching.loader(), batching, 12)
    assert gathers == [2, 4, 6, 8, 10, 12]


def test_a_hold_keeps_the_exchanges_the_caller_makes_every_sync_every_steps():
    """An elastic job commits every `sync_every` steps, after an exchange of its own. In a
    hold those exchanges only gather; the hold ends at the last of them within it, where the
    controller acts again."""
    peer = EvenPeer()
    batching = DynamicBatching(DATA, 64, peer, adjust_every=2, untimed_steps=0, sync_every=3,
                               controller=ControllerConfig(64, rule=Rule.P))
    gathers = gather_steps(peer, batching)
    adjusted, update = [], batching.controller.update
    batching.controller.update = lambda *a: adjusted.append(batching.step) or update(*a)
    take(batching.loader(), batching, 12)
    # The first holds 8 steps, to the sync exchange at 9 (not 10); that one to 15.
    assert gathers == [2, 3, 6, 9, 12]
    assert adjusted == [2, 9]
    assert batching.state_dict()["quiet_until"] == 15
    assert [r.step for r in batching.take_records()] == list(range(12))
    with pytest.raises(DynBatchError, match="sync_every"):
        DynamicBatching(DATA, 64, peer, sync_every=-1)


@pytest.mark.parametrize("step_seconds, steps", [
    (0.011, 20),         # 23 steps make 0.25 s: capped at 4 x 5
    (0.03, 9),           # 9 steps make 0.25 s
    (0.06, 5),           # 5 steps take longer than 0.25 s: the usual cadence
    (float("nan"), 5),   # no step timed
    (0.0, 5),
])
def test_a_hold_lasts_hold_seconds_of_steps_within_its_bounds(step_seconds, steps):
    assert hold_steps(5, 0.25, step_seconds) == steps
    assert hold_steps(5, 0.0, step_seconds) == 5


@pytest.mark.parametrize("step, hold, sync_every, end", [
    (10, 20, 10, 30),    # the hold ends at a sync exchange anyway
    (25, 20, 10, 40),    # at the last sync exchange before 45
    (10, 8, 10, 18),     # none within it
    (10, 20, 0, 30),     # no sync exchanges
    (7, 4, 3, 9),
])
def test_a_hold_ends_at_the_last_sync_exchange_within_it(step, hold, sync_every, end):
    assert hold_end(step, hold, sync_every) == end


def test_an_exchange_is_due_every_adjust_every_steps_after_a_hold_and_at_each_sync():
    due = [n for n in range(1, 31) if exchange_due(n, 5, quiet_until=17, sync_every=8)]
    assert due == [8, 16, 20, 24, 25, 30]
    assert [n for n in range(1, 13) if exchange_due(n, 4)] == [4, 8, 12]


def test_a_bad_hold_is_refused():
    with pytest.raises(DynBatchError, match="hold_seconds"):
        DynamicBatching(DATA, 64, LocalCommunicator(), hold_seconds=-1.0)
