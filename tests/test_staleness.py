"""The staleness rules of ABS-SGD on a problem where their effect is known exactly: heavy-ball
momentum 0.9 on a quadratic of curvature h, each gradient applied one step late, in the order
`ABSWindows` calls the rule (the runs themselves are replayed in `test_trainer` and
`test_abs_sgd`; their convergence is measured in benchmarks/abs_compare.py)."""
import pytest
import torch

from hvd_dynbatch.training.config import Staleness as Rule
from hvd_dynbatch.training.staleness import RULES


def delayed_heavy_ball(rule: Rule, lr_h: float, steps: int = 300) -> float:
    """Minimise h w^2 / 2 (h = 1) from w = (1, -1) with each window's gradient applied one
    window later; the largest |w| at the end."""
    w = torch.nn.Parameter(torch.tensor([1.0, -1.0]))
    kind = RULES[rule]
    optimizer = torch.optim.SGD([w], lr=lr_h, momentum=kind.momentum(0.9))
    staleness, pending = kind(optimizer), None
    for _ in range(steps):
        staleness.begin_window(lr_h)
        gradient = w.detach().clone()       # the window's gradient, at the weights it saw
        staleness.end_window()
        if pending is not None:
            w.grad = staleness.correct([pending])[0].clone()
            optimizer.step()
            staleness.applied()
        pending = gradient
    return w.detach().abs().max().item()


@pytest.mark.parametrize("lr_h", [0.05, 0.3, 0.45])
def test_weight_prediction_keeps_stable_what_a_stale_gradient_blows_up(lr_h):
    """Synchronous heavy-ball 0.9 is stable for lr h < 3.8; one step stale, for lr h < 0.1
    only (`none`, and `momentum`'s 0.8 for < 0.2); weight prediction, for lr h < 0.5."""
    assert delayed_heavy_ball(Rule.PREDICT, lr_h) < 1e-3
    if lr_h > 0.2:
        assert delayed_heavy_ball(Rule.NONE, lr_h) > 1e3
        assert delayed_heavy_ball(Rule.MOMENTUM, lr_h) > 1e3
    else:
        assert delayed_heavy_ball(Rule.NONE, lr_h) < 1e-3


def test_weight_prediction_puts_the_exact_weights_back():
    w = torch.nn.Parameter(torch.tensor([0.3, -0.7]))
    optimizer = torch.optim.SGD([w], lr=0.1, momentum=0.9)
    rule = RULES[Rule.PREDICT](optimizer)
    w.grad = torch.tensor([1.0, 2.0])
    optimizer.step()
    rule.applied()
    exact = w.detach().clone()
    rule.begin_window(0.1)
    assert not torch.equal(w.detach(), exact)
    rule.end_window()
    assert torch.equal(w.detach(), exact)
