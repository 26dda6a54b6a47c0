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
    """ABS-SGD in one process: `windows[k]` holds each rank's samples of window k (of the
    split `train`); the window's mean gradient over all of them is applied one window later,
    and the last window is applied at the end.

    Each rank's gradient is taken at the weights of the time, or, under `staleness`
    "predict", at those weights moved by lr x (momentum x the momentum buffer + that rank's
    mean gradient of the window before) and put back after; under "dc" the applied gradient
    g is g + dc_strength x g x g x (the weights' change in the last update). ("momentum" is
    the optimizer's own momentum.)"""
    params = list(model.parameters())
    pending, shares, change = None, None, None
    group = optimizer.param_groups[0]

    def apply(grads):
        nonlocal change
        if staleness == "dc" and change is not None:
            grads = [g + dc_strength * g * g * d for g, d in zip(grads, change)]
        before = [p.detach().clone() for p in params]
        for p, g in zip(params, grads):
            p.grad = g.clone()
        optimizer.step()
        change = [p.detach() - b for p, b in zip(params, before)]

    for ranks in windows:
        total = [torch.zeros_like(p) for p in params]
        buffers = [optimizer.state[p].get("momentum_buffer") for p in params]
        predict = staleness == "predict" and (
            shares is not None or all(b is not None for b in buffers))
        new_shares = []
        for rank, indices in enumerate(ranks):
            exact = [p.detach().clone() for p in params]
            if predict:
                with torch.no_grad():
                    for i, (p, buffer) in enumerate(zip(params, buffers)):
                        update = torch.zeros_like(p) if buffer is None \
                            else group["momentum"] * buffer
                        if shares is not None:
                            update += shares[rank][i]
                        p.sub_(group["lr"] * update)
            model.zero_grad()
            x, y = train.fetch(indices)
            F.cross_entropy(model(x), y, reduction="sum").backward()
            new_shares.append([p.grad / len(indices) for p in params])
            for t, p in zip(total, params):
                t += p.grad
            with torch.no_grad():
                for p, e in zip(params, exact):
                    p.copy_(e)
        if pending is not None:
            apply(pending)
        pending, shares = [t / sum(map(len, ranks)) for t in total], new_shares
    apply(pending)
