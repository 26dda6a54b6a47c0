"""Test helpers, computed in the test's own process to check what a run reports against: a
saved model's test accuracy, and ABS-SGD's delayed updates replayed in plain PyTorch from the
samples a run logged."""
from __future__ import annotations

import json
from pathlib import Path

import torch
import torch.nn.functional as F

from hvd_dynbatch.data.datasets import load_dataset
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
                       dc_strength: float = 0.04, resumed_at: int = None,
                       ended_at: int = None) -> None:
    """ABS-SGD in one process: `windows[k]` holds each rank's samples of window k (of the
    split `train`); the window's mean gradient over all of them is applied one window later,
    and the last window is applied at the end.

    Each rank's gradient is taken at the weights of the time, or, under `staleness`
    "predict", at those weights moved by lr x (momentum x the momentum buffer + that rank's
    mean gradient of the window before) and put back after; under "dc" the applied gradient
    g is g + dc_strength x g x g x (the weights' change in the last update). ("momentum" is
    the optimizer's own momentum.)

    Resumes: window `resumed_at` is the first of a run resumed from a checkpoint taken
    mid-run, and is predicted from the momentum part alone (a rank's share is not in the
    checkpoint); window `ended_at` is the first of a run resumed from one that ended there,
    which applied its pending window at its end."""
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

    for k, ranks in enumerate(windows):
        if k == ended_at:
            apply(pending)
            pending = None
        if k in (resumed_at, ended_at):
            shares = None
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


def logged_windows(directory: Path, ranks: int) -> dict:
    """Each step's samples per rank, from the ranks' `--sample-log` files in `directory`;
    every (step, rank) logged once."""
    windows = {}
    for f in directory.iterdir():
        for line in f.read_text().splitlines():
            rec = json.loads(line)
            window = windows.setdefault(rec["step"], [None] * ranks)
            assert window[rec["rank"]] is None, f"step {rec['step']} logged twice"
            window[rec["rank"]] = rec["indices"]
    assert all(None not in w for w in windows.values()), "a rank's window is missing"
    return windows


def replay_abs_run(windows: list, model_name: str, seed: int, lr: float, momentum: float,
                   staleness: str = "predict", **resume) -> dict:
    """The weights an ABS-SGD run on the digits ends with that computed `windows` (each
    window's samples per rank, in order) from `model_name`'s initialisation at `seed`;
    `resume`: where it was resumed (`replay_delayed_sgd`'s `resumed_at` or `ended_at`)."""
    data = load_dataset("digits")
    torch.manual_seed(seed)
    model = build_model(model_name, data.input_shape, data.num_classes)
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum)
    replay_delayed_sgd(model, optimizer, data.train, windows, staleness, **resume)
    return model.state_dict()
