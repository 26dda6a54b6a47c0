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


def replay_delayed_sgd(model, optimizer, train, windows) -> None:
    """ABS-SGD in one process: window k's mean gradient, over its samples `windows[k]` of
    the split `train`, taken at the weights of the time, is applied one window later; the
    last window is applied at the end."""
    pending = None
    for indices in windows:
        x, y = train.fetch(indices)
        model.zero_grad()
        (F.cross_entropy(model(x), y, reduction="sum") / len(indices)).backward()
        current = [p.grad.clone() for p in model.parameters()]
        if pending is not None:
            for p, g in zip(model.parameters(), pending):
                p.grad = g
            optimizer.step()
        pending = current
    for p, g in zip(model.parameters(), pending):
        p.grad = g
    optimizer.step()
