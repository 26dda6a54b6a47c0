"""Test helper: a saved model's test accuracy, computed in the test's own process, to check the
figures a run reports against."""
from __future__ import annotations

import torch

from hvd_dynbatch.models import build_model


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
