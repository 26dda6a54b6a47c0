"""Staleness compensation for ABS-SGD: what makes up for a gradient one window old.

ABS-SGD computes window k+1 on the weights w_k while window k's reduced gradient g_k is still
in flight; g_k (computed at w_{k-1}) is applied after window k+1. Uncorrected, this one-step
delay under heavy-ball momentum 0.9 trained the digits CNN to 90% only after 3.2x the samples
of synchronous SGD, and diverged at larger learning rates. Each rule below is a known remedy
(`--staleness`); every rank runs the same rule on the same values, so the weights stay
identical on every rank:

- `predict` (weight prediction, as pipeline-parallel training does for stale weights: Chen
  et al. 2018, "Efficient and Robust Parallel DNN Training through Model Parallelism on
  Multi-GPU Platform"): the update that comes at the end of window k+1 is
  w_{k+1} = w_k - lr (mu v_k + g_k); its momentum part is known when the window starts, and
  g_k, still in flight, is estimated by this rank's own share of it, the mean gradient of
  the samples it computed in window k (our choice: Chen et al. extrapolate with the
  smoothed past gradients instead). So window k+1's gradients are taken at
  w_k - lr (mu v_k + g_k^rank), and the exact weights are put back before the update. Where
  the share equals g_k (one rank, or a gradient without sampling noise) this is synchronous
  SGD exactly. On a quadratic of curvature h, heavy-ball momentum 0.9 is then stable for
  lr h < 3.8 as synchronous SGD is, where one step stale it is stable for lr h < 0.10 only
  (< 0.25 with the momentum part predicted alone, < 0.50 with g_k estimated by g_{k-1}).
  Each rank predicts from its own share, so the ranks compute at slightly different
  weights; they all apply the same reduced gradient, so their weights stay identical.
- `momentum` (Mitliagkas et al. 2016, "Asynchrony begets momentum"): staleness acts as an
  implicit momentum, about 1 - 1/(tau + 1) = 0.5 for a delay of tau = 1 window, so the
  explicit momentum is lowered to keep the total: (1 - mu') (1 - 0.5) = 1 - mu, i.e.
  mu' = 2 mu - 1 (0 if that is negative).
- `dc` (delay compensation, Zheng et al. 2017, DC-ASGD): g_k is corrected to the weights it
  is applied at by a first-order term, g + lambda g * g * (w_k - w_{k-1}), the product
  elementwise, the diagonal of g g^T standing in for the Hessian.
- `none`: the gradient as computed.

The default is the one measured best (RESULTS.md, "ABS-SGD").
"""
from __future__ import annotations

from typing import Dict, Type

import torch

from ..backend.weighting import all_finite
from .config import Staleness as Rule


class Staleness:
    """A rule for ABS-SGD's stale gradient. The base applies it as it is.

    The windows call, in order: `momentum` once, to set up the optimizer; then per window
    `begin_window` before its first micro-batch, `end_window` after its last (the
    parameters' `.grad` then holding the window's gradient sum on this rank), and
    `correct` on the stale reduced gradient just before the optimizer applies it, and
    `applied` after.
    """

    name = Rule.NONE

    def __init__(self, optimizer: torch.optim.SGD):
        self.optimizer = optimizer
        self.params = [p for group in optimizer.param_groups for p in group["params"]]

    @staticmethod
    def momentum(momentum: float) -> float:
        """The explicit momentum to use for the configured one."""
        return momentum

    def begin_window(self, lr: float) -> None:
        """Before a window's first micro-batch; `lr` is the rate of the update pending."""

    def end_window(self, count: int) -> None:
        """After the window's last micro-batch, before the pending update; `count` samples
        make up the gradient sum in the parameters' `.grad`."""

    def correct(self, grads: list) -> list:
        """The gradients to apply (one per parameter) in place of the stale `grads`."""
        return grads

    def applied(self) -> None:
        """After the optimizer applied an update."""

    def state_dict(self) -> dict:
        """What the rule carries from one update to the next (saved with the windows)."""
        return {}

    def load_state_dict(self, state: dict) -> None:
        """Adopt a `state_dict`."""


class WeightPrediction(Staleness):
    """`predict`: compute a window at the weights the pending update is expected to lead
    to, its momentum part known and its gradient estimated by this rank's share of it; the
    exact weights are put back before the update.

    The share is this rank's own, so it is not part of the saved state: the first window
    after a resume is predicted from the momentum part alone."""

    name = Rule.PREDICT

    def __init__(self, optimizer):
        super().__init__(optimizer)
        self._saved = None
        self._share = None   # this rank's mean gradient of the window in flight

    def begin_window(self, lr: float) -> None:
        share, self._share = self._share, None
        momentum = self.optimizer.param_groups[0]["momentum"]
        buffers = [self.optimizer.state.get(p, {}).get("momentum_buffer") for p in self.params]
        if share is None and any(b is None for b in buffers):
            return
        with torch.no_grad():
            self._saved = [p.detach().clone() for p in self.params]
            for i, (p, buffer) in enumerate(zip(self.params, buffers)):
                # torch's first step sets the buffer to the gradient: no momentum part yet.
                update = torch.zeros_like(p) if buffer is None else momentum * buffer
                if share is not None:
                    update += share[i]
                p.sub_(lr * update)

    def end_window(self, count: int) -> None:
        share = [p.grad.detach() / count for p in self.params]
        # A non-finite share would make the next window's gradient non-finite too.
        self._share = share if all_finite(share) else None
        if self._saved is None:
            return
        with torch.no_grad():
            for p, saved in zip(self.params, self._saved):
                p.copy_(saved)
        self._saved = None


class MomentumCorrection(Staleness):
    """`momentum`: lower the explicit momentum by the implicit momentum of a one-window
    delay."""

    name = Rule.MOMENTUM

    @staticmethod
    def momentum(momentum: float) -> float:
        return max(0.0, 2 * momentum - 1)


class DelayCompensation(Staleness):
    """`dc`: DC-ASGD's first-order correction of the stale gradient to the current weights,
    with the weights' change since it was computed (the last update applied)."""

    name = Rule.DC
    strength = 0.04   # lambda, DC-ASGD's constant variant's value

    def __init__(self, optimizer):
        super().__init__(optimizer)
        self._before = None
        self._change = None   # w_k - w_{k-1}: the last update's change of the weights

    def correct(self, grads: list) -> list:
        self._before = [p.detach().clone() for p in self.params]
        if self._change is None:
            return grads
        return [g + self.strength * g * g * d for g, d in zip(grads, self._change)]

    def applied(self) -> None:
        self._change = [p.detach() - before for p, before in zip(self.params, self._before)]

    def state_dict(self) -> dict:
        return {"change": None if self._change is None else [d.clone() for d in self._change]}

    def load_state_dict(self, state: dict) -> None:
        self._change = state["change"]


RULES: Dict[Rule, Type[Staleness]] = {
    rule.name: rule for rule in (Staleness, WeightPrediction, MomentumCorrection,
                                 DelayCompensation)}
