"""Runs that go wrong end clearly on every rank: errors found at start-up (against the
world, in the data) and a non-finite loss."""
import pytest
import torch

from hvd_dynbatch.data.datasets import write_image_folder
from hvd_dynbatch.tools.launch import Launcher
from hvd_dynbatch.training.metrics import read_metrics, step_records
from launcher import CLI, expect_user_error, run_cli, run_ranks, train_one_process

pytestmark = pytest.mark.processes

# --lr 1e6 makes the mlp's loss NaN within two steps.
DIVERGING = ["train", "--model", "mlp", "--lr", "1e6", "--global-batch", "64", "--max-steps",
             "20", "--no-progress"]


def errors_of(job) -> list:
    return [line.split("hvd-dynbatch: error: ", 1)[1]
            for line in job.job.stderr.splitlines() if "hvd-dynbatch: error: " in line]


def test_a_nonfinite_loss_stops_every_rank_at_its_step_and_the_metrics_say_so(tmp_path):
    model, metrics = tmp_path / "model.pt", tmp_path / "m.jsonl"
    job = run_ranks(Launcher.GLOO, 2, [*CLI, *DIVERGING, "--save-model", str(model),
                                       "--metrics", str(metrics)])
    assert job.returncode != 0, job.explain()
    errors = errors_of(job)
    assert len(errors) == 2 and errors[0] == errors[1], job.explain()
    assert "is not finite" in errors[0] and "lr 1e+06" in errors[0]
    # No rank prints a traceback (horovodrun itself still prints its own on a failed job).
    assert "<stderr>:Traceback" not in job.job.stderr and not model.exists()
    # Every step up to the stop is written, the last one marked, and then the stop.
    records = read_metrics(str(metrics))
    steps, stop = step_records(records), records[-1]
    assert [r["step"] for r in steps] == list(range(len(steps))) and steps[-1]["skipped"]
    assert stop == {"type": "stop", "step": len(steps), "reason": errors[0]}


def test_on_nan_skip_stops_past_its_limit_of_steps_in_a_row_and_saves_nothing(tmp_path):
    model, metrics = tmp_path / "model.pt", tmp_path / "m.jsonl"
    job = run_ranks(Launcher.GLOO, 2, [*CLI, *DIVERGING, "--on-nan", "skip", "--skip-limit",
                                       "4", "--save-model", str(model), "--metrics",
                                       str(metrics)])
    assert job.returncode != 0, job.explain()
    errors = errors_of(job)
    assert len(errors) == 2 and errors[0] == errors[1], job.explain()
    assert "the gradients of the last 4 steps" in errors[0] and "--skip-limit 4" in errors[0]
    assert not model.exists()
    steps = step_records(read_metrics(str(metrics)))
    assert [r.get("skipped", False) for r in steps[-4:]] == [True] * 4 and len(steps) < 20


@pytest.mark.parametrize("batching", [[], ["--batching", "abs", "--staleness", "predict"]])
def test_on_nan_skip_goes_on_without_applying_such_steps(tmp_path, batching):
    weights, records = train_one_process([*DIVERGING[1:], "--on-nan", "skip", "--skip-limit",
                                          "100", *batching], tmp_path)
    summary = records[-1]
    skipped = [r["step"] for r in step_records(records) if r.get("skipped")]
    assert summary["steps"] == 20 and len(skipped) > 0
    assert summary["skipped_steps"] == len(skipped)
    # ABS-SGD applies the last window's gradient after the last step's record is written,
    # and the summary tells that update apart. At lr 1e6 the weights soon reach a point where
    # every gradient is non-finite and stay there, so it is skipped too; a synchronous run
    # has no such update.
    assert summary["final_update_skipped"] is bool(batching)
    assert all(torch.isfinite(v).all() for v in weights.values())


# Errors found after Horovod starts: against the world size, and in the data. Before every
# rank agreed on start-up, a rank that failed first exited while the other was still in an
# MPI call, which Horovod's shutdown then crashed (6 of 6 runs under horovodrun --mpi).
START_UP_ERRORS = [
    (["--global-batch", "1"], "global batch 1 is smaller than world size 2"),
    (["--global-batch", "64", "--min-batch", "40"], "smaller than world size 2 x minimum"),
    (["--dataset", "imagefolder", "--data-dir", "/nonexistent"], "has no 'train' folder"),
]


@pytest.mark.parametrize("launcher, repeats", [(Launcher.MPI, 3), (Launcher.MPIRUN, 1),
                                               (Launcher.GLOO, 1)])
def test_a_start_up_error_ends_every_rank_with_its_line_and_no_crash(launcher, repeats):
    for args, text in START_UP_ERRORS * repeats:
        job = run_ranks(launcher, 2, [*CLI, "train", *args, "--no-progress"], timeout=90)
        assert not job.job.timed_out and job.returncode != 0, job.explain()
        output = job.job.stdout + job.job.stderr
        errors = [line for line in output.splitlines() if "hvd-dynbatch: error:" in line]
        assert len(errors) == 2 and all(text in line for line in errors), job.explain()
        for crash in ("Segmentation fault", "MPI_FINALIZE", "<stderr>:Traceback"):
            assert crash not in output, job.explain()


def test_a_bad_image_is_named_or_skipped_and_counted(tmp_path):
    """A truncated JPEG and an empty file among the training images: the run stops with an
    error naming one of them, or with --skip-bad-samples replaces and counts them."""
    folder = tmp_path / "images"
    write_image_folder(str(folder), classes=2, train_per_class=10, val_per_class=2)
    truncated, empty = sorted((folder / "train" / "class00").iterdir())[3:5]
    truncated.write_bytes(truncated.read_bytes()[:200])
    empty.write_bytes(b"")
    args = ["--dataset", "imagefolder", "--data-dir", str(folder), "--image-size", "16",
            "--model", "cnn", "--global-batch", "20", "--epochs", "2"]
    out = run_cli(["train", *args, "--no-progress"])
    expect_user_error(out, "cannot read image")
    assert any(str(f) in out.stderr for f in (truncated, empty)), out.stderr
    # Read in loader workers, the same one line (not the worker's traceback inside it).
    workers = run_cli(["train", *args, "--no-progress", "--loader-workers", "2"])
    expect_user_error(workers, "cannot read image")
    assert len(workers.stderr.strip().splitlines()) == 1, workers.stderr
    _, records = train_one_process([*args, "--skip-bad-samples", "--loader-workers", "1"],
                                   tmp_path)
    # Both files are in each of the two epochs' 20 samples, replaced each time.
    assert records[-1]["skipped_samples"] == 4
    log = run_cli(["train", *args, "--skip-bad-samples", "--no-progress"]).stderr
    assert log.count("warning: skipping a bad sample") == 2, log
