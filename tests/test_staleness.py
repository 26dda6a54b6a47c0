"""The staleness rules of ABS-SGD on a problem where their effect is known exactly: heavy-ball
momentum 0.9 on a quadratic of curvature h, each gradient applied one step late, in the order
`ABSWindows` calls the rule (the runs themselves are replayed in `test_trainer` and
`test_abs_sgd`; their convergence is measured in benchmarks/abs_compare.py)."""
import pytest
import torch

from hvd_dynbatch.training.config import Staleness as Rule
from hvd_dynbatch.training.staleness import RULES


def delayed_heavy_ball(rule: Rule, lr_h: float, steps: int = 300) -> list:
    """Minimise h w^2 / 2 (h = 1) from w = (1, -1) with each window's gradient applied one
    window later; the weights after each update."""
    w = torch.nn.Parameter(torch.tensor([1.0, -1.0]))
    kind = RULES[rule]
    optimizer = torch.optim.SGD([w], lr=lr_h, momentum=kind.momentum(0.9))
    staleness, pending, path = kind(optimizer), None, []
    for _ in range(steps):
        staleness.begin_window(lr_h)
        gradient = w.detach().clone()       # the window's gradient, at the weights it saw
        w.grad = gradient.clone()           # its sum over the window's one sample
        staleness.end_window(1)
        if pending is not None:
            w.grad = staleness.correct([pending])[0].clone()
            optimizer.step()
            staleness.applied()
            path.append(w.detach().clone())
        pending = gradient
    return path


def largest_at_end(rule: Rule, lr_h: float) -> float:
    """The largest |w| after 300 delayed updates (inf or NaN once diverged)."""
    return delayed_heavy_ball(rule, lr_h)[-1].abs().max().item()


@pytest.mark.parametrize("lr_h", [0.05, 0.3, 0.45, 3.0])
def test_weight_prediction_keeps_stable_what_a_stale_gradient_blows_up(lr_h):
    """Synchronous heavy-ball 0.9 is stable for lr h < 3.8; one step stale, for lr h < 0.1
    only (`none`, and `momentum`'s 0.8 for < 0.2); weight prediction from the rank's share,
    here the whole gradient, for lr h < 3.8 as synchronous (it computes at the very weights
    synchronous SGD would; the previous gradient as the estimate held to lr h < 0.5 only)."""
    assert largest_at_end(Rule.PREDICT, lr_h) < 1e-3
    if lr_h > 0.2:
        assert not largest_at_end(Rule.NONE, lr_h) < 1e3
        assert not largest_at_end(Rule.MOMENTUM, lr_h) < 1e3
    else:
        assert largest_at_end(Rule.NONE, lr_h) < 1e-3


def test_weight_prediction_from_the_whole_gradient_is_synchronous_heavy_ball():
    """With one rank (its share is the whole gradient) and no noise, each window is computed
    at the weights that the pending update leads to: the path of synchronous SGD, one update
    later (the first window's gradient is applied after the second)."""
    w = torch.nn.Parameter(torch.tensor([1.0, -1.0]))
    optimizer = torch.optim.SGD([w], lr=0.5, momentum=0.9)
    synchronous = []
    for _ in range(40):
        w.grad = w.detach().clone()
        optimizer.step()
        synchronous.append(w.detach().clone())
    torch.testing.assert_close(torch.stack(delayed_heavy_ball(Rule.PREDICT, 0.5, 41)),
                               torch.stack(synchronous))


def test_weight_prediction_puts_the_exact_weights_back():
    w = torch.nn.Parameter(torch.tensor([0.3, -0.7]))
    optimizer = torch.optim.SGD([w], lr=0.1, momentum=0.9)
    rule = RULES[Rule.PREDICT](optimizer)
    w.grad = torch.tensor([1.0, 2.0])
    optimizer.step()
    rule.end_window(2)                   # the share: the window's gradient sum / 2
    exact = w.detach().clone()
    rule.begin_window(0.1)
    buffer = optimizer.state[w]["momentum_buffer"]
    torch.testing.assert_close(w.detach(), exact - 0.1 * (0.9 * buffer + w.grad / 2))
    rule.end_window(2)
    assert torch.equal(w.detach(), exact)
