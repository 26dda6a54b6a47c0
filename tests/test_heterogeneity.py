"""Slowdown specs, the step timer, and the gradient weight."""
import math
import time

import pytest

from hvd_dynbatch.backend.weighting import batch_weight
from hvd_dynbatch.core.heterogeneity import Emulator, Slowdown, preset_factors
from hvd_dynbatch.core.timing import StepTimer
from hvd_dynbatch.errors import DynBatchError


def test_plain_factors_apply_from_step_zero():
    s = Slowdown.parse("1,1,2,4")
    assert s.world_size == 4
    assert [s.factor(1000, r) for r in range(4)] == [1, 1, 2, 4]


def test_schedule_changes_factors_at_its_steps():
    s = Slowdown.parse("0:1,4; 50:4,1 ;80:1,1")
    assert (s.factor(49, 1), s.factor(50, 1), s.factor(79, 0), s.factor(80, 0)) == (4, 1, 4, 1)


@pytest.mark.parametrize("spec", ["", "1,x", "0.5,1", "10:1,2", "0:1,2;0:1,3", "0:1,2;5:1",
                                  "1,nan", "1,inf"])
def test_bad_specs_are_rejected_with_the_spec_named(spec):
    with pytest.raises(DynBatchError):
        Slowdown.parse(spec)


def test_world_size_mismatch_is_named():
    with pytest.raises(DynBatchError, match="lists 2 factors but the job has 3 ranks"):
        Slowdown.parse("1,2").check_world(3)


def _emulator(spec, rank):
    slept = []
    return Emulator(Slowdown.parse(spec), rank, memory=3, sleep=slept.append), slept


def test_emulation_sleeps_until_the_step_costs_the_factor_times_its_compute():
    slow, slept = _emulator("1,3", 1)
    slow.after_forward(0, 10, 0.01)          # nothing recorded: backward taken as 2x forward
    assert slept == [pytest.approx(2 * 0.03)]
    slow.after_backward(10, 0.05)            # 10 samples took 0.05 s: 5 ms each
    slow.after_forward(1, 20, 0.5)           # a stalled forward pass does not count
    assert slept[-1] == pytest.approx(2 * 20 * 0.005)


def test_emulation_sleeps_from_the_median_of_recent_steps():
    slow, slept = _emulator("1,2", 1)
    for batch, seconds in [(10, 0.01), (10, 0.5), (10, 0.02), (10, 0.03), (10, 0.04)]:
        slow.after_backward(batch, seconds)  # a stall among the first, then only 3 kept
    slow.after_forward(0, 10, 0.0)
    assert slept == [pytest.approx(0.03)]


def test_a_rank_at_factor_one_never_sleeps():
    fast, slept = _emulator("1,3", 0)
    fast.after_backward(10, 0.05)
    fast.after_forward(0, 10, 0.05)
    assert slept == []


def test_emulation_sleeps_for_real():
    slow = Emulator(Slowdown.parse("1,3"), 1)
    slow.after_backward(4, 0.02)
    start = time.perf_counter()
    slow.after_forward(0, 4, 0.0)
    assert time.perf_counter() - start >= 0.039


def test_timer_takes_the_median_of_its_window():
    t = StepTimer(window=3)
    assert math.isnan(t.smoothed)
    for v in (1.0, 100.0, 2.0, 3.0):
        t.record(v)
    assert t.smoothed == 3.0
    t.reset()
    assert math.isnan(t.smoothed)


def test_batch_weight_is_the_share_of_the_step():
    assert batch_weight(8, 32) == 0.25
    assert batch_weight(0, 5) == 0.0
    with pytest.raises(DynBatchError):
        batch_weight(33, 32)


@pytest.mark.parametrize("preset, ranks, factors", [
    ("HL1", 4, (1, 1, 1, 1)), ("HL4", 2, (1, 4)), ("HL8", 4, (1, 2, 4, 8)),
    ("cores:12/12/12/12", 2, (1, 1, 1, 1)), ("cores:6/6/4/32", 2, (5.333, 5.333, 8, 1))])
def test_presets(preset, ranks, factors):
    assert preset_factors(preset, ranks) == pytest.approx(factors)


@pytest.mark.parametrize("preset", ["HL0.5", "HLx", "cores:4/0", "cores:", "fast"])
def test_unknown_presets_are_refused(preset):
    with pytest.raises(DynBatchError, match="unknown heterogeneity preset"):
        preset_factors(preset)
