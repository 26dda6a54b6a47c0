"""Slowdown specs and their emulation, the step timer, the gradient weight and its finite
screen, and the napping wait."""
import math
import time

import numpy as np
import pytest
import torch

from hvd_dynbatch.backend.weighting import all_finite, batch_weight
from hvd_dynbatch.core.heterogeneity import (NEAR_BATCH, STALL_RATIO, Emulator, Slowdown,
                                             preset_factors)
from hvd_dynbatch.training.batching import StepRecord
from hvd_dynbatch.core.timing import WARMUP_STEPS, StepTimer, median_error
from hvd_dynbatch.errors import DynBatchError


def test_plain_factors_apply_from_step_zero():
    s = Slowdown.parse("1,1,2,4")
    assert s.world_size == 4
    assert [s.factor(1000, r) for r in range(4)] == [1, 1, 2, 4]


def test_schedule_changes_factors_at_its_steps():
    s = Slowdown.parse("0:1,4; 50:4,1 ;80:1,1")
    assert (s.factor(49, 1), s.factor(50, 1), s.factor(79, 0), s.factor(80, 0)) == (4, 1, 4, 1)


@pytest.mark.parametrize("spec, why", [
    ("", "must start at step 0"), ("1,x", "expected factors like '1,4'"),
    ("0.5,1", "must be numbers >= 1"), ("10:1,2", "must start at step 0"),
    ("0:1,2;0:1,3", "have increasing steps"), ("0:1,2;5:1", "the same number of ranks"),
    ("1,nan", "must be numbers >= 1"), ("1,inf", "must be numbers >= 1")])
def test_bad_specs_are_rejected_with_the_spec_named(spec, why):
    with pytest.raises(DynBatchError) as refused:
        Slowdown.parse(spec)
    assert f"'{spec}'" in str(refused.value) and why in str(refused.value)


def test_world_size_mismatch_is_named():
    with pytest.raises(DynBatchError, match="lists 2 factors but the job has 3 ranks"):
        Slowdown.parse("1,2").check_world(3)


# Three steps after the job's first, whose computes the emulation does not take as typical.
AFTER_WARMUP = range(WARMUP_STEPS, WARMUP_STEPS + 3)


def _emulator(spec, rank):
    slept, slowdown = [], Slowdown.parse(spec)
    return Emulator(slowdown, rank, slowdown.world_size, memory=3, sleep=slept.append), slept


def test_emulation_sleeps_until_the_compute_costs_the_factor_times_the_typical_one():
    slow, slept = _emulator("0:1,3;5:1,1.5", 1)
    slow.after_compute(0, 10, 0.05)          # 5 ms a sample: sleeps 2 x 50 ms
    slow.after_compute(1, 20, 0.1)           # the same per sample at another batch
    slow.after_compute(5, 10, 0.05)          # the schedule's next entry
    assert slept == [pytest.approx(0.1), pytest.approx(0.2), pytest.approx(0.025)]


def test_a_stall_lengthens_its_step_once_not_factor_times():
    """Before any exchange the sleep is 3 times this rank's fastest recent compute: the
    stall's step is 0.45 s longer, the next one back to 4 times 50 ms and its own excess."""
    slow, slept = _emulator("1,4", 1)
    computes = (0.05, 0.05, 0.5, 0.06)       # a stall among them
    for seconds in computes:
        slow.after_compute(0, 10, seconds)
    assert [c + s for c, s in zip(computes, slept)] == [
        pytest.approx(t) for t in (0.2, 0.2, 0.65, 0.21)]


def test_before_any_exchange_a_slowed_rank_follows_its_warm_up_down():
    """Its computes fall from 70 to 47 ms as the process warms up: each step sleeps 3 times
    the fastest so far, not 3 times a median that still holds the first, slow ones (which
    made these steps 0.28, 0.25, 0.22 and 0.19 s)."""
    slow, slept = _emulator("1,4", 1)
    computes = (0.07, 0.059, 0.047, 0.048)
    for step, seconds in enumerate(computes):
        slow.after_compute(step, 10, seconds)
    assert [c + s for c, s in zip(computes, slept)] == [
        pytest.approx(t) for t in (0.28, 0.236, 0.188, 0.189)]


def test_the_typical_compute_comes_from_the_ranks_at_factor_one_once_exchanged():
    """A slowed rank computes more slowly than the others (5 against 4 ms a sample here): its
    step is still 4 times the rank at factor 1's, not 4 times its own."""
    slow, slept = _emulator("0:1,4;10:4,1", 1)
    slow.after_compute(0, 10, 0.05)          # no exchange yet: 3 times its own 50 ms
    slow.observe([StepRecord(step, 0, [10, 10], [0.04, 0.2], 1.0) for step in AFTER_WARMUP])
    slow.after_compute(7, 10, 0.05)
    slow.after_compute(8, 20, 0.1)           # the same per sample at another batch
    assert slept == [pytest.approx(0.15), pytest.approx(0.11), pytest.approx(0.22)]
    assert [0.05 + slept[1], 0.1 + slept[2]] == [pytest.approx(4 * 0.04), pytest.approx(4 * 0.08)]


def test_the_sleep_covers_the_update_too_at_its_cost_whatever_the_batch():
    """The rank at factor 1 computes 4 ms a sample and updates in 10 ms; the slowed rank
    (5 ms a sample, 12 ms updates of its own) is busy 4 times as long, compute and update,
    at either batch: the update's share does not scale with the batch."""
    slow, slept = _emulator("1,4", 1)
    slow.observe([StepRecord(step, 0, [10, 10], [0.04, 0.2], 1.0, [0.01, 0.04])
                  for step in AFTER_WARMUP])
    slow.after_compute(7, 10, 0.05, 0.012)
    slow.after_compute(8, 20, 0.1, 0.012)
    assert [0.05 + 0.012 + slept[0], 0.1 + 0.012 + slept[1]] == [
        pytest.approx(4 * (0.04 + 0.01)), pytest.approx(4 * (0.08 + 0.01))]


def test_the_first_steps_of_a_job_are_not_typical():
    """The unslowed rank computed its first steps at 6 ms a sample, warming up, and 4 ms
    from the WARMUP_STEPS-th on: the slowed rank takes 4, and its own 5 ms until then."""
    slow, slept = _emulator("1,4", 1)
    slow.observe([StepRecord(step, 0, [10, 10], [0.06, 0.2], 1.0)
                  for step in range(WARMUP_STEPS)])
    slow.after_compute(WARMUP_STEPS + 1, 10, 0.05)
    slow.observe([StepRecord(step, 0, [10, 10], [0.04, 0.2], 1.0)
                  for step in range(WARMUP_STEPS, WARMUP_STEPS + 2)])
    slow.after_compute(WARMUP_STEPS + 2, 10, 0.05)
    assert slept == [pytest.approx(3 * 0.05), pytest.approx(4 * 0.04 - 0.05)]


def test_steps_over_the_stall_ratio_times_the_fastest_are_not_typical():
    """Of the unslowed rank's steps at 3, 3.6, 4.4 (within 1.5 times 3), 5 and 8 ms a sample
    (fresh memory faulted in), the slowed rank takes the median of the first three: 3.6."""
    assert STALL_RATIO == 1.5
    slept = []
    slow = Emulator(Slowdown.parse("1,4"), 1, 2, memory=9, sleep=slept.append)
    slow.observe([StepRecord(WARMUP_STEPS + k, 0, [10, 10], [seconds, 0.2], 1.0)
                  for k, seconds in enumerate([0.08, 0.03, 0.05, 0.036, 0.08, 0.044])])
    slow.after_compute(WARMUP_STEPS + 6, 5, 0.02)
    assert 0.02 + slept[0] == pytest.approx(4 * 5 * 0.0036)


def test_the_typical_compute_weighs_each_step_by_its_samples():
    """After the slowdown moved, the unslowed rank ran a window at 5 samples, 58 ms a
    sample, against 37 at 57 samples before: the steps at 57 outweigh the more numerous ones
    at 5, so the slowed rank stays 8 times the 37 ms."""
    slowdown, slept = Slowdown.parse("0:1,8;10:8,1"), []
    slow = Emulator(slowdown, 0, 2, memory=9, sleep=slept.append)
    slow.observe([StepRecord(step, 0, [57, 7], [57 * 0.037, 2.0], 1.0) for step in range(6, 10)]
                 + [StepRecord(step, 0, [59, 5], [3.0, 5 * 0.058], 1.0)
                    for step in range(10, 15)])
    slow.after_compute(15, 27, 27 * 0.04)
    assert 27 * 0.04 + slept[0] == pytest.approx(8 * 27 * 0.037)


def test_the_own_compute_is_taken_at_about_the_current_batch_after_the_warm_up():
    """The slowed rank computed 5 ms a sample at 100 samples (10 and 6 in its first two
    steps) and 6 at 40 and 45, where its fixed costs show: each step at 40 or 45 costs 4 times
    the unslowed rank's 4 ms a sample, not that and the 1 ms a sample more that a median of
    all its steps (5.5 ms) leaves out."""
    assert NEAR_BATCH == 1.25
    slept = []
    slow = Emulator(Slowdown.parse("1,4"), 1, 2, memory=9, sleep=slept.append)
    for step, per_sample in enumerate((0.01, 0.006, 0.005, 0.005, 0.005)):
        slow.after_compute(step, 100, 100 * per_sample)
    slow.observe([StepRecord(step, 0, [100, 100], [0.4, 2.0], 1.0) for step in range(5)])
    for step, batch in ((5, 40), (6, 40), (7, 45)):
        slow.after_compute(step, batch, batch * 0.006)
    assert [batch * 0.006 + seconds for batch, seconds in zip((40, 40, 45), slept[5:])] == [
        pytest.approx(4 * batch * 0.004) for batch in (40, 40, 45)]


def test_an_update_not_timed_is_left_out_of_the_typical_and_the_own_update():
    """A step's update of 0 was not timed (a run's first step): the medians skip it."""
    slow, slept = _emulator("1,4", 1)
    slow.observe([StepRecord(WARMUP_STEPS, 0, [10, 10], [0.04, 0.2], 1.0, [0.0, 0.0]),
                  StepRecord(WARMUP_STEPS + 1, 0, [10, 10], [0.04, 0.2], 1.0, [0.01, 0.04])])
    slow.after_compute(6, 10, 0.05, 0.0)
    slow.after_compute(7, 10, 0.05, 0.012)
    assert slept == [pytest.approx(4 * 0.05 - 0.05), pytest.approx(4 * 0.05 - 0.062)]


def test_steps_with_every_rank_slowed_or_no_samples_leave_the_typical_compute_alone():
    slow, slept = _emulator("0:2,4;10:1,1", 1)
    slow.observe([StepRecord(WARMUP_STEPS, 0, [10, 10], [0.08, 0.2], 1.0),  # rank 0 at 2
                  StepRecord(10, 0, [0, 0], [0.0, 0.0], 1.0)])     # empty slices
    slow.after_compute(1, 10, 0.05)
    assert slept == [pytest.approx(0.15)]
    slow.observe([StepRecord(11, 0, [10, 0], [0.03, 0.0], 1.0)])
    slow.after_compute(2, 10, 0.05)
    assert slept[1] == pytest.approx((4 * 0.003 - 0.005) * 10)


def test_a_rank_alone_takes_its_typical_compute_from_its_first_steps_at_full_speed():
    """Alone, a sleeping rank computes more slowly than at full speed (5 against 4 ms a
    sample here): its step is 4 times the last of its first steps', not 4 times its own."""
    slept = []
    slow = Emulator(Slowdown.parse("4"), 0, 1, memory=3, calibration=5, sleep=slept.append)
    for step, seconds in enumerate((0.1, 0.09, 0.04, 0.05, 0.04)):  # warming up, then typical
        slow.after_compute(step, 10, seconds, 0.01 if step else 0.0)
    assert slept == []
    slow.after_compute(5, 10, 0.05, 0.011)
    slow.after_compute(6, 20, 0.1, 0.011)
    assert [0.061 + slept[0], 0.111 + slept[1]] == [pytest.approx(4 * (0.04 + 0.01)),
                                                    pytest.approx(4 * (0.08 + 0.01))]
    assert [slow.calibrated(step) for step in (0, 4, 5)] == [True, True, False]


def test_a_rank_that_becomes_slowed_sizes_its_sleep_from_its_slowed_computes_only():
    """Its computes at factor 1, with no sleep between them, ran at the typical 4 ms a
    sample; its first slowed step's 5 ms is its own, so that step costs 4 times 4 ms."""
    slow, slept = _emulator("0:1,1;7:1,4", 1)
    slow.observe([StepRecord(step, 0, [10, 10], [0.04, 0.04], 1.0) for step in AFTER_WARMUP])
    for step in AFTER_WARMUP:
        slow.after_compute(step, 10, 0.04)
    slow.after_compute(7, 10, 0.05)
    assert slept == [pytest.approx(4 * 0.04 - 0.05)]


def test_a_rank_left_alone_keeps_the_typical_compute_of_its_last_world():
    """An elastic job shrank to this rank: it goes on at its factor, 4 times the 4 ms a sample
    the rank at factor 1 computed, from its first step in the new world."""
    slowdown, slept = Slowdown.parse("4,1"), []
    before = Emulator(slowdown, 0, 2, memory=3)
    before.observe([StepRecord(step, 0, [10, 10], [0.2, 0.04], 1.0, [0.04, 0.01])
                    for step in AFTER_WARMUP])
    alone = Emulator(slowdown, 0, 1, memory=3, sleep=slept.append, typical=before.typical)
    alone.after_compute(7, 20, 0.1)
    assert slept == [pytest.approx(4 * (0.08 + 0.01) - 0.1)] and not alone.calibrated(7)


def test_ranks_of_a_job_follow_the_unslowed_ranks_without_calibrating():
    slow, slept = _emulator("1,4", 1)
    slow.after_compute(0, 10, 0.05)
    assert slept == [pytest.approx(0.15)] and not slow.calibrated(0)


def test_a_rank_at_factor_one_or_without_compute_never_sleeps():
    fast, slept = _emulator("1,3", 0)
    fast.after_compute(0, 10, 0.05)
    slow, slept_slow = _emulator("1,3", 1)
    slow.after_compute(0, 0, 0.01)           # an empty slice
    slow.after_compute(0, 10, 0.0)
    assert slept == [] and slept_slow == []


def test_emulation_sleeps_for_real():
    slow = Emulator(Slowdown.parse("1,3"), 1, 2)
    start = time.perf_counter()
    slow.after_compute(0, 4, 0.02)
    assert time.perf_counter() - start >= 0.039


def test_timer_takes_the_median_of_its_window():
    t = StepTimer(window=3)
    assert math.isnan(t.smoothed)
    for v in (1.0, 100.0, 2.0, 3.0):
        t.record(v)
    assert t.smoothed == 3.0
    t.reset()
    assert math.isnan(t.smoothed)


def test_timer_restarts_its_window_when_the_split_it_times_changes():
    t = StepTimer(window=3)
    t.time_at((2, 6))
    t.record(1.0)
    t.time_at((2, 6))
    t.record(3.0)
    assert t.smoothed == 2.0 and t.split == (2, 6)
    t.time_at((3, 5))
    assert math.isnan(t.smoothed) and t.split == (3, 5)
    t.record(5.0)
    assert t.smoothed == 5.0
    t.reset()
    assert t.split is None


def test_timer_leaves_out_its_warm_up_once_and_not_again_after_a_reset():
    t = StepTimer(window=3, warmup=2)
    for v in (9.0, 8.0, 1.0):
        t.record(v)
    assert t.smoothed == 1.0
    t.reset()
    t.record(2.0)
    assert t.smoothed == 2.0
    with pytest.raises(ValueError, match="warm-up"):
        StepTimer(warmup=-1)


def test_timer_error_is_the_relative_standard_error_of_its_median():
    t = StepTimer(window=5)
    t.record(1.0)
    assert math.isnan(t.error)
    for v in (1.1, 0.9, 1.05, 0.95):
        t.record(v)
    # median 1.0, median absolute deviation 0.05: 1.2533 x 1.4826 x 0.05 / sqrt(5)
    assert t.error == pytest.approx(0.04155, abs=1e-5)
    # A stall counts as one more slow step, however long it was.
    assert median_error([1.1, 0.9, 1.05, 0.95, 10.0]) == median_error([1.1, 0.9, 1.05, 0.95, 1.2])
    window = np.array([[1.0, 2.0], [1.1, 2.2], [0.9, 1.8]])
    assert median_error(window) == pytest.approx([median_error(window[:, 0])] * 2)
    # The timer's own (plain Python) reading is median_error's, at odd and even windows.
    for steps in ([0.007, 0.0081, 0.0069], [0.007, 0.0081, 0.0069, 0.0302]):
        timer = StepTimer(window=5)
        for seconds in steps:
            timer.record(seconds)
        assert timer.error == pytest.approx(median_error(steps), rel=1e-12)


def test_batch_weight_is_the_share_of_the_step():
    assert batch_weight(8, 32) == 0.25
    assert batch_weight(0, 5) == 0.0
    with pytest.raises(DynBatchError):
        batch_weight(33, 32)


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
@pytest.mark.parametrize("where", range(4))
def test_all_finite_finds_one_bad_value_in_any_tensor_and_changes_none(bad, where):
    def sparse(values):
        return torch.sparse_coo_tensor([[0, 2, 2]], values, (6,), check_invariants=True)

    torch.manual_seed(0)
    tensors = [torch.randn(5, 3), torch.randn(7, dtype=torch.float64),
               torch.randn(4, dtype=torch.bfloat16), sparse([1.0, 2.0, 3.0])]
    before = [t.clone() for t in tensors]
    assert all_finite(tensors)
    assert all(torch.equal(a.to_dense(), b.to_dense()) for a, b in zip(tensors, before))
    if where == 3:
        tensors[3] = sparse([1.0, bad, 3.0])
    else:
        tensors[where].view(-1)[1] = bad
    assert not all_finite(tensors)
    assert all_finite([])


@pytest.mark.parametrize("preset, ranks, factors", [
    ("HL1", 4, (1, 1, 1, 1)), ("HL4", 2, (1, 4)), ("HL8", 4, (1, 2, 4, 8)),
    ("cores:12/12/12/12", 2, (1, 1, 1, 1)), ("cores:6/6/4/32", 2, (5.333, 5.333, 8, 1))])
def test_presets(preset, ranks, factors):
    assert preset_factors(preset, ranks) == pytest.approx(factors)


@pytest.mark.parametrize("preset", ["HL0.5", "HLx", "cores:4/0", "cores:", "fast"])
def test_unknown_presets_are_refused(preset):
    with pytest.raises(DynBatchError, match="unknown heterogeneity preset"):
        preset_factors(preset)


def test_a_napping_wait_polls_first_then_naps_until_every_handle_is_done(monkeypatch):
    import hvd_dynbatch.backend.weighting as weighting

    polls, naps = {"a": 0, "b": 0}, []
    done_after = {"a": 3, "b": 80}   # "a" finishes while polled, "b" only after some naps

    def poll(handle):
        polls[handle] += 1
        return polls[handle] > done_after[handle]

    monkeypatch.setattr(weighting.time, "sleep", naps.append)
    weighting.wait_napping(["a", "b"], poll, nap=1e-3, polls=50)
    assert polls == {"a": 4, "b": 81}
    assert naps == [1e-3] * 30       # b's polls 51 to 80 came each after a nap
