"""Plots of a run's metrics file: what the split, the timings, the loss and the lr did.

`plot_run(records, path)` draws four panels, one line per rank where there is one: batch size
per step, compute time per step, training loss (and test accuracy, where evaluated) against
training time, and the learning rate per step. Elastic resets are marked.
`plot_comparison(runs, path)` puts several runs side by side, one line per run: training loss
and test accuracy against training time, and the learning rate per step.
`run_figure` and `comparison_figure` build the same figures without saving them.
"""
from __future__ import annotations

from typing import Dict, Optional, Sequence

from ..errors import DynBatchError
from ..training.metrics import step_records


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _step_records(records: Sequence[dict]) -> list:
    steps = step_records(records)
    if not steps:
        raise DynBatchError("the metrics hold no per-step records to plot")
    return steps


def _save(fig, path: str) -> None:
    fig.savefig(path, dpi=100)
    _pyplot().close(fig)


def plot_run(records: Sequence[dict], path: str, title: str = "") -> None:
    """Write a PNG of the run's per-step records to `path`."""
    _save(run_figure(records, title), path)


def plot_comparison(runs: Dict[str, Sequence[dict]], path: str, title: str = "",
                    mark_step: Optional[int] = None) -> None:
    """Write a PNG comparing runs (name -> metrics records) to `path`; `mark_step` draws a
    vertical line on the learning-rate panel (a change of the global batch, say)."""
    _save(comparison_figure(runs, title, mark_step), path)


def run_figure(records: Sequence[dict], title: str = ""):
    """The figure of one run: a 2 x 2 grid of batch sizes, compute times, loss (and
    accuracy), learning rate."""
    plt = _pyplot()
    steps = _step_records(records)
    evals = [r for r in records if r.get("type") == "eval"]
    resets = [r["step"] for r in records if r.get("type") == "reset"]
    x = [r["step"] for r in steps]
    ranks = max(len(r["batch_sizes"]) for r in steps)

    fig, axes = plt.subplots(2, 2, figsize=(12, 7), constrained_layout=True)
    for key, ax, label in (("batch_sizes", axes[0, 0], "batch size"),
                           ("compute_times", axes[0, 1], "compute time (s)")):
        for rank in range(ranks):
            ys = [(s, r[key][rank]) for s, r in zip(x, steps) if rank < len(r[key])]
            ax.plot(*zip(*ys), label=f"rank {rank}", linewidth=1)
        ax.set_xlabel("step")
        ax.set_ylabel(label)
        if ranks <= 8:
            ax.legend(fontsize="small")
    loss_ax = axes[1, 0]
    loss_ax.plot([r["time"] for r in steps], [r["loss"] for r in steps], color="C0",
                 linewidth=1, label="training loss")
    loss_ax.set_xlabel("training time (s)")
    loss_ax.set_ylabel("loss")
    if evals:
        acc_ax = loss_ax.twinx()
        acc_ax.plot([e["time"] for e in evals], [e["accuracy"] for e in evals], "o-",
                    color="C3", markersize=3, label="test accuracy")
        acc_ax.set_ylabel("test accuracy")
    lr_ax = axes[1, 1]
    lr_ax.plot(x, [r["lr"] for r in steps], linewidth=1)
    lr_ax.set_xlabel("step")
    lr_ax.set_ylabel("learning rate")
    for ax in (axes[0, 0], axes[0, 1], lr_ax):
        for step in resets:
            ax.axvline(step, color="grey", linestyle=":", linewidth=1)
    if title:
        fig.suptitle(title)
    return fig


def comparison_figure(runs: Dict[str, Sequence[dict]], title: str = "",
                      mark_step: Optional[int] = None):
    """The figure comparing runs: loss, accuracy and learning rate, one line per run."""
    plt = _pyplot()
    fig, (loss_ax, acc_ax, lr_ax) = plt.subplots(1, 3, figsize=(15, 4.5), constrained_layout=True)
    for name, records in runs.items():
        steps = _step_records(records)
        evals = [r for r in records if r.get("type") == "eval"]
        loss_ax.plot([r["time"] for r in steps], [r["loss"] for r in steps], linewidth=1,
                     label=name)
        acc_ax.plot([e["time"] for e in evals], [e["accuracy"] for e in evals], "o-",
                    markersize=2, linewidth=1, label=name)
        lr_ax.plot([r["step"] for r in steps], [r["lr"] for r in steps], linewidth=1,
                   label=name)
    loss_ax.set(xlabel="training time (s)", ylabel="training loss", yscale="log")
    acc_ax.set(xlabel="training time (s)", ylabel="test accuracy")
    lr_ax.set(xlabel="step", ylabel="learning rate")
    if mark_step is not None:
        lr_ax.axvline(mark_step, color="grey", linestyle=":", linewidth=1)
    for ax in (loss_ax, acc_ax, lr_ax):
        ax.legend(fontsize="small")
    if title:
        fig.suptitle(title)
    return fig
