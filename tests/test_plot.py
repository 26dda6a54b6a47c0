"""`hvd-dynbatch plot` draws a metrics file to a PNG, and refuses one with nothing to draw.

The figures are checked for what they plot (each line's data against the records), and the
PNGs for what they show (coloured lines in every panel, which a blank figure does not have).
"""
import json

import numpy as np
import pytest

from hvd_dynbatch.tools.plot import comparison_figure, run_figure
from hvd_dynbatch.training.metrics import read_metrics
from launcher import expect_user_error, run_cli


def write_metrics(path, steps):
    """A run of `steps` steps on 2 ranks, a third rank joining at step 20, an evaluation
    every 10 steps."""
    records = [{"step": s, "epoch": 0, "time": 0.01 * s, "world_size": 2 if s < 20 else 3,
                "global_batch": 64, "batch_sizes": [32 + s % 5, 32 - s % 5] + ([10] if s >= 20
                                                                               else []),
                "compute_times": [0.01, 0.012] + ([0.02] if s >= 20 else []),
                "step_time": 0.013, "lr": 0.05 + 0.001 * s, "loss": 2.0 / (1 + s)}
               for s in range(steps)]
    records.insert(20, {"type": "reset", "step": 20, "world_size": 3})
    records += [{"type": "eval", "step": s, "time": 0.01 * s, "accuracy": s / 50}
                for s in range(10, steps + 1, 10)]
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return read_metrics(str(path))


def lines(ax):
    """label -> (x, y) of an axis' data lines (not the vertical markers)."""
    return {line.get_label(): (list(line.get_xdata()), list(line.get_ydata()))
            for line in ax.lines if not line.get_label().startswith("_")}


def test_run_figure_plots_every_rank_the_loss_the_accuracy_and_the_lr(tmp_path):
    records = write_metrics(tmp_path / "m.jsonl", 40)
    fig = run_figure(records, "t")
    batch_ax, compute_ax, loss_ax, lr_ax, acc_ax = fig.axes
    batches = lines(batch_ax)
    assert sorted(batches) == ["rank 0", "rank 1", "rank 2"]
    assert batches["rank 1"] == (list(range(40)), [32 - s % 5 for s in range(40)])
    assert batches["rank 2"] == (list(range(20, 40)), [10] * 20)
    assert lines(compute_ax)["rank 1"][1] == [0.012] * 40
    assert lines(loss_ax)["training loss"] == ([0.01 * s for s in range(40)],
                                               [2.0 / (1 + s) for s in range(40)])
    assert lines(acc_ax)["test accuracy"] == ([0.1, 0.2, 0.3, 0.4], [0.2, 0.4, 0.6, 0.8])
    lr = lr_ax.lines[0]
    assert list(lr.get_xdata()) == list(range(40))
    assert list(lr.get_ydata()) == pytest.approx([0.05 + 0.001 * s for s in range(40)])
    # The reset at step 20 is marked on the per-step panels.
    for ax in (batch_ax, compute_ax, lr_ax):
        assert [list(line.get_xdata()) for line in ax.lines[-1:]] == [[20, 20]]


def test_comparison_figure_has_one_line_per_run(tmp_path):
    runs = {"static": write_metrics(tmp_path / "static.jsonl", 30),
            "dynamic": write_metrics(tmp_path / "dynamic.jsonl", 40)}
    loss_ax, acc_ax, lr_ax = comparison_figure(runs, mark_step=25).axes
    for ax in (loss_ax, lr_ax):
        drawn = lines(ax)
        assert sorted(drawn) == ["dynamic", "static"]
        assert [len(drawn[name][0]) for name in ("static", "dynamic")] == [30, 40]
    assert lines(loss_ax)["dynamic"][1] == [2.0 / (1 + s) for s in range(40)]
    assert lines(acc_ax) == {"static": ([0.1, 0.2, 0.3], [0.2, 0.4, 0.6]),
                             "dynamic": ([0.1, 0.2, 0.3, 0.4], [0.2, 0.4, 0.6, 0.8])}
    assert list(lr_ax.lines[-1].get_xdata()) == [25, 25]


def coloured_pixels(png, rows, cols):
    """How many pixels of a region of the PNG are coloured (not white, grey or black)."""
    import matplotlib.image

    rgb = matplotlib.image.imread(str(png))[..., :3]
    region = rgb[rows, cols]
    return int(np.sum(region.max(axis=-1) - region.min(axis=-1) > 0.25))


def plot(paths, png):
    out = run_cli(["plot", *map(str, paths), "-o", str(png), "--title", "t"])
    assert out.returncode == 0, out.stderr
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.processes
def test_plot_draws_lines_in_every_panel(tmp_path):
    metrics, png = tmp_path / "m.jsonl", tmp_path / "out.png"
    write_metrics(metrics, 40)
    plot([metrics], png)
    top, bottom, left, right = slice(0, 350), slice(350, 700), slice(0, 600), slice(600, 1200)
    for rows, cols in ((top, left), (top, right), (bottom, left), (bottom, right)):
        assert coloured_pixels(png, rows, cols) > 400, (rows, cols)


@pytest.mark.processes
def test_plot_of_several_files_compares_them(tmp_path):
    paths = [tmp_path / "static.jsonl", tmp_path / "dynamic.jsonl"]
    for path, steps in zip(paths, (30, 40)):
        write_metrics(path, steps)
    png = tmp_path / "cmp.png"
    plot(paths, png)
    for cols in (slice(0, 500), slice(500, 1000), slice(1000, 1500)):
        assert coloured_pixels(png, slice(0, 450), cols) > 400, cols


@pytest.mark.parametrize("content, text", [
    (json.dumps({"type": "summary"}) + "\n", "no per-step records"),
    ('{"step": 0, "batch_sizes": [1]\n', "cannot read metrics file"),
])
@pytest.mark.processes
def test_plot_of_a_file_it_cannot_draw_is_a_clear_error(tmp_path, content, text):
    metrics = tmp_path / "m.jsonl"
    metrics.write_text(content)
    expect_user_error(run_cli(["plot", str(metrics), "-o", str(tmp_path / "x.png")]), text)
