"""Learning-rate rules and the base schedule, alone."""
import math

import pytest

from hvd_dynbatch.core.lr import BaseSchedule, LRSchedule, scaling_rule
from hvd_dynbatch.errors import DynBatchError


def schedule(rule, **kw):
    return LRSchedule(0.1, 64, scaling_rule(rule, **kw))


@pytest.mark.parametrize("rule, target", [("none", 0.1), ("linear", 0.2),
                                          ("sqrt", 0.1 * math.sqrt(2))])
def test_immediate_rules_jump_to_their_target(rule, target):
    s = schedule(rule)
    assert s.lr(99) == pytest.approx(0.1)
    s.on_batch_change(100, 128)
    assert s.lr(100) == pytest.approx(target)
    assert s.lr(1000) == pytest.approx(target)


def test_smooth_rule_ramps_linearly_over_steps_proportional_to_the_change():
    s = schedule("smooth", smooth_steps=10)
    s.on_batch_change(100, 128)                      # x2: a ramp of 20 steps
    lrs = [s.lr(t) for t in range(100, 121)]
    assert lrs[0] == pytest.approx(0.1) and lrs[-1] == pytest.approx(0.2)
    steps = [b - a for a, b in zip(lrs, lrs[1:])]
    assert all(d == pytest.approx(0.1 / 20) for d in steps)
    s.on_batch_change(200, 32)                       # x1/4 from B=128: 40 steps back down
    assert s.lr(200) == pytest.approx(0.2) and s.lr(240) == pytest.approx(0.05)
    assert s.lr(220) == pytest.approx(0.125)


def test_a_change_during_a_ramp_starts_from_where_the_ramp_is():
    s = schedule("smooth", smooth_steps=10)
    s.on_batch_change(0, 128)
    midway = s.lr(10)
    s.on_batch_change(10, 64)
    assert s.lr(10) == pytest.approx(midway) and s.lr(10 + 20) == pytest.approx(0.1)


def test_base_schedule_composes_with_the_rescale():
    s = LRSchedule(0.1, 64, scaling_rule("linear"), BaseSchedule(warmup_steps=4,
                                                                  decay_steps=(10,)))
    s.on_batch_change(0, 128)
    assert [round(s.lr(t), 4) for t in (0, 3, 9, 10)] == [0.05, 0.2, 0.2, 0.02]


def test_state_round_trips():
    s = schedule("smooth")
    s.on_batch_change(5, 96)
    t = schedule("smooth")
    t.load_state_dict(s.state_dict())
    assert [t.lr(k) for k in range(40)] == [s.lr(k) for k in range(40)]


@pytest.mark.parametrize("make", [
    lambda: scaling_rule("cubic"), lambda: scaling_rule("smooth", smooth_steps=0),
    lambda: BaseSchedule(warmup_steps=-1), lambda: BaseSchedule(decay_steps=(5, 3)),
    lambda: BaseSchedule(decay_factor=0),
])
def test_bad_settings_are_rejected(make):
    with pytest.raises(DynBatchError):
        make()
