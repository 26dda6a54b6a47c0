"""Training under real launchers: N ranks end with the weights of 1 rank, metrics, bad input."""
import subprocess

import pytest
import torch

from hvd_dynbatch.launch import Launcher, local_env
from hvd_dynbatch.metrics import read_metrics
from launcher import CLI, run_ranks

# No batch-norm, no dropout: the update of a split step equals the one-rank step exactly.
COMMON = ["train", "--model", "mlp", "--dataset", "digits", "--global-batch", "64",
          "--lr", "0.05", "--seed", "3", "--epochs", "5", "--max-steps", "30", "--adjust-every", "2",
          "--eval-every", "10", "--no-progress"]


def single_process(args, tmp_path, name):
    model, metrics = tmp_path / f"{name}.pt", tmp_path / f"{name}.jsonl"
    out = subprocess.run([*CLI, *args, "--save-model", str(model), "--metrics", str(metrics)],
                         env=local_env(), capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    return torch.load(model), read_metrics(str(metrics))


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The same training on one process: the weights every split must reproduce."""
    return single_process(COMMON, tmp_path_factory.mktemp("one"), "one")


@pytest.mark.parametrize("launcher, np, extra", [
    (Launcher.GLOO, 2, ["--slowdown", "1,4", "--initial-split", "50,14"]),
    (Launcher.MPIRUN, 3, ["--slowdown", "0:1,1,3;14:3,1,1", "--controller", "p"]),
])
def test_n_ranks_end_with_the_weights_of_one(reference, tmp_path, launcher, np, extra):
    ref_weights, ref_metrics = reference
    model, metrics = tmp_path / "n.pt", tmp_path / "n.jsonl"
    job = run_ranks(launcher, np, [*CLI, *COMMON, *extra, "--save-model", str(model),
                                   "--metrics", str(metrics)], timeout=240)
    assert job.returncode == 0, job.explain()
    records = read_metrics(str(metrics))
    steps = [r for r in records if "batch_sizes" in r]
    assert len(steps) == 30
    splits = {tuple(r["batch_sizes"]) for r in steps if r["global_batch"] == 64}
    assert len(splits) >= 2, f"the controller should have moved the split: {splits}"
    assert all(sum(r["batch_sizes"]) == r["global_batch"] for r in steps)

    # The timing exchange used mpi4py where Horovod runs on MPI, Horovod itself under Gloo.
    backend = records[-1]["exchange_backend"]
    assert backend == ("horovod" if launcher is Launcher.GLOO else "mpi4py")

    weights = torch.load(model)
    assert weights.keys() == ref_weights.keys()
    for name, value in weights.items():
        torch.testing.assert_close(value, ref_weights[name], rtol=1e-5, atol=1e-6, msg=name)
    # The losses the ranks report, weighted by batch, are the one-rank losses too.
    ref_losses = [r["loss"] for r in ref_metrics if "batch_sizes" in r]
    assert [r["loss"] for r in steps] == pytest.approx(ref_losses, rel=1e-4)


def test_metrics_records_and_summary(reference):
    _, records = reference
    step = next(r for r in records if "batch_sizes" in r)
    for key in ("step", "epoch", "time", "world_size", "global_batch", "batch_sizes",
                "compute_times", "step_time", "lr", "loss"):
        assert key in step, key
    summary = records[-1]
    assert summary["type"] == "summary"
    assert summary["steps"] == 30 and summary["samples"] == 30 * 64 - (64 - 1437 % 64)
    assert summary["samples_per_sec"] > 0 and 0 < summary["final_accuracy"] <= 1
    evals = [r for r in records if r.get("type") == "eval"]
    assert [e["step"] for e in evals] == [10, 20, 30]


def test_batch_schedule_changes_the_batch_and_ramps_the_learning_rate(tmp_path):
    _, records = single_process(["train", "--model", "linear", "--global-batch", "32",
                                 "--lr", "0.1", "--max-steps", "40", "--epochs", "10",
                                 "--batch-schedule", "20:64", "--lr-rule", "smooth",
                                 "--smooth-steps", "5", "--no-progress"], tmp_path, "sched")
    steps = {r["step"]: r for r in records if "batch_sizes" in r}
    assert steps[19]["global_batch"] == 32 and steps[20]["global_batch"] == 64
    assert [round(steps[s]["lr"], 4) for s in (19, 20, 25, 30, 35)] == [0.1, 0.1, 0.15, 0.2, 0.2]


def test_target_accuracy_stops_the_run_and_records_its_time(tmp_path):
    _, records = single_process(["train", "--max-steps", "400", "--epochs", "20",
                                 "--eval-every", "5", "--target-accuracy", "0.8",
                                 "--no-progress"], tmp_path, "target")
    summary = records[-1]
    assert summary["time_to_target"] is not None and summary["final_accuracy"] >= 0.8
    assert summary["steps"] < 400


def expect_user_error(out, text):
    assert out.returncode == 2, out.stderr
    errors = [line for line in out.stderr.splitlines() if "hvd-dynbatch: error:" in line]
    assert errors and all(text in line for line in errors), out.stderr
    assert "Traceback" not in out.stderr


@pytest.mark.parametrize("args, text", [
    (["--min-batch", "8", "--max-batch", "4"], "maximum batch (4) is below the minimum (8)"),
    (["--global-batch", "0"], "--global-batch must be positive"),
    (["--lr", "-1"], "--lr must be a positive number"),
    (["--model", "vgg"], "unknown model 'vgg'"),
    (["--dataset", "imagefolder", "--data-dir", "/nonexistent"], "has no 'train' folder"),
    (["--slowdown", "1,x"], "cannot read slowdown"),
    (["--slowdown", "1,2"], "lists 2 factors but the job has 1 ranks"),
    (["--elastic", "--batch-schedule", "10:32"], "--batch-schedule is for non-elastic runs"),
    (["--batch-schedule", "10:32,5:16"], "--batch-schedule needs increasing positive steps"),
    (["--lr-decay-steps", "5,3"], "--lr-decay-steps must be increasing"),
])
def test_bad_input_is_one_clear_line(args, text):
    out = subprocess.run([*CLI, "train", "--max-steps", "2", "--no-progress", *args],
                         env=local_env(), capture_output=True, text=True, timeout=120)
    expect_user_error(out, text)


def test_bad_input_under_a_launcher_fails_on_every_rank_without_hanging():
    job = run_ranks(Launcher.GLOO, 2, [*CLI, "train", "--global-batch", "3", "--min-batch",
                                       "2", "--no-progress"], timeout=90)
    assert not job.job.timed_out and job.returncode != 0, job.explain()
    assert job.job.stderr.count("global batch 3 is smaller than world size 2 x minimum "
                                "batch 2") == 2, job.explain()
    # No rank prints a traceback (horovodrun itself still prints its own on a failed job).
    assert "<stderr>:Traceback" not in job.job.stderr
