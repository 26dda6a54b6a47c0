"""Test helpers, computed in the test's own process to check what a run reports against: a
saved model's test accuracy, and ABS-SGD's delayed updates replayed in plain PyTorch."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from hvd_dynbatch.training.models import build_model


def top1_top5(weights: dict, model_name: str, data) -> tuple:
    """Top-1 and top-5 accuracy of `weights` (a `model_name` state_dict) on `data.test`."""
    model = build_model(model_name, data.input_shape, data.num_classes)
    model.load_state_dict(weights)
    model.eval()
    x, y = data.test.fetch(range(len(data.test)))
    with torch.no_grad():
        ranked = model(x).argsort(dim=1, descending=True)
    return ((ranked[:, 0] == y).float().mean().item(),
            (ranked[:, :5] == y[:, None]).any(dim=1).float().mean().item())


def replay_delayed_sgd(model, optimizer, train, windows, staleness: str = "none",
                       dc_strength: float = 0.04) -> None:
    """ABS-SGD in one process: window k's mean gradient, over its samples `windows[k]` of
    the split `train`, is applied one window later; the last window is applied at the end.

    The gradient is taken at the weights of the time, or, under `staleness` "predict", at
    those weights moved by lr x (momentum x the momentum buffer + the last gradient applied)
    and put back after; under "dc" the applied gradient g is g + dc_strength x g x g x (the
    weights' change in the last update). ("momentum" is the optimizer's own momentum.)"""
    params = list(model.parameters())
    pending, last, change = None, None, None
    group = optimizer.param_groups[0]

    def apply(grads):
        nonlocal last, change
        if staleness == "dc" and change is not None:
            grads = [g + dc_strength * g * g * d for g, d in zip(grads, change)]
        before = [p.detach().clone() for p in params]
        for p, g in zip(params, grads):
            p.grad = g.clone()
        optimizer.step()
        last = grads
        change = [p.detach() - b for p, b in zip(params, before)]

    for indices in windows:
        x, y = train.fetch(indices)
        exact = None
        if staleness == "predict" and last is not None:
            exact = [p.detach().clone() for p in params]
            with torch.no_grad():
                for p, g in zip(params, last):
                    buffer = optimizer.state[p]["momentum_buffer"]
                    p.sub_(group["lr"] * (group["momentum"] * buffer + g))
        model.zero_grad()
        (F.cross_entropy(model(x), y, reduction="sum") / len(indices)).backward()
        current = [p.grad.clone() for p in params]
        if exact is not None:
            with torch.no_grad():
                for p, e in zip(params, exact):
                    p.copy_(e)
        if pending is not None:
            apply(pending)
        pending = current
    apply(pending)
