"""Checkpoints and resume: the files, in one process, and a killed job resumed on another
launcher and number of ranks."""
import os
import signal
import time

import psutil
import pytest
import torch

from hvd_dynbatch.backend.backends import LocalBackend
from hvd_dynbatch.errors import DynBatchError
from hvd_dynbatch.tools.launch import Launcher, kill_tree, start_local, wait_local
from hvd_dynbatch.training.checkpoint import CheckpointDir, check_fingerprint, fingerprint
from hvd_dynbatch.training.config import TrainConfig
from hvd_dynbatch.training.metrics import read_metrics, step_records, truncate_metrics
from hvd_dynbatch.training.trainer import train
from evaluation import logged_windows, replay_abs_run
from launcher import (CLI, DISCOVER, assert_same_weights, expect_user_error, run_cli,
                      run_ranks, train_one_process)


class TestCheckpointDir:
    def test_keeps_the_newest_and_leaves_no_temporary_file(self, tmp_path):
        saved = CheckpointDir(str(tmp_path), keep=2)
        for step in (5, 10, 15):
            saved.save({"step": step}, step)
        assert [p.name for p in saved.checkpoints()] == ["checkpoint-000000010.pt",
                                                         "checkpoint-000000015.pt"]
        assert CheckpointDir.load(saved.checkpoints()[-1]) == {"step": 15}
        assert sorted(p.name for p in tmp_path.iterdir()) == [
            "checkpoint-000000010.pt", "checkpoint-000000015.pt"]

    def test_a_killed_writers_temporary_file_is_removed_and_never_read(self, tmp_path):
        (tmp_path / ".tmp-checkpoint-20-1234").write_bytes(b"half a checkpoint")
        assert CheckpointDir(str(tmp_path), writer=False).checkpoints() == []
        CheckpointDir(str(tmp_path))
        assert list(tmp_path.iterdir()) == []

    def test_an_unreadable_checkpoint_is_named(self, tmp_path):
        (tmp_path / "checkpoint-000000007.pt").write_bytes(b"not torch")
        with pytest.raises(DynBatchError, match="cannot read checkpoint .*checkpoint-000000007"):
            CheckpointDir.load(CheckpointDir(str(tmp_path)).checkpoints()[-1])

    def test_an_unreadable_newest_one_is_set_aside_for_the_one_before(self, tmp_path):
        saved = CheckpointDir(str(tmp_path))
        for step in (4, 8):
            saved.save({"step": step}, step)
        (tmp_path / "checkpoint-000000012.pt").write_bytes(b"cut short")
        said = []
        path, state = saved.newest_readable(said.append)
        assert (path.name, state) == ("checkpoint-000000008.pt", {"step": 8})
        assert len(said) == 1 and said[0].startswith("warning: skipping cannot read "
                                                     "checkpoint") and "000000012" in said[0]
        assert (tmp_path / "checkpoint-000000012.pt.unreadable").exists()
        assert saved.checkpoints()[-1].name == "checkpoint-000000008.pt"

    def test_when_none_can_be_read_the_error_says_what_to_do(self, tmp_path):
        (tmp_path / "checkpoint-000000004.pt").write_bytes(b"")
        reader = CheckpointDir(str(tmp_path), writer=False)
        with pytest.raises(DynBatchError, match="none of the 1 checkpoints .* remove them"):
            reader.newest_readable(lambda message: None)
        assert (tmp_path / "checkpoint-000000004.pt").exists()   # a reader moves nothing
        assert CheckpointDir(str(tmp_path / "empty")).newest_readable(print) is None

    def test_an_unwritable_directory_is_a_clear_error(self, tmp_path):
        (tmp_path / "file").write_text("")
        with pytest.raises(DynBatchError, match="cannot use --checkpoint-dir"):
            CheckpointDir(str(tmp_path / "file" / "sub"))

    def test_a_changed_setting_is_named(self):
        saved = fingerprint(TrainConfig(global_batch=64, model="mlp"))
        check_fingerprint(saved, TrainConfig(global_batch=64, model="mlp", lr=0.5), "ckpt")
        with pytest.raises(DynBatchError, match=r"--model mlp \(now cnn\), "
                                                r"--global-batch 64 \(now 32\)"):
            check_fingerprint(saved, TrainConfig(global_batch=32, model="cnn"), "ckpt")

    @pytest.mark.parametrize("option, value, written", [
        ("dataset", "mnist", "digits"), ("image_size", 32, 64), ("seed", 7, 0),
        ("batching", "static", "dynamic")])
    def test_each_setting_the_readme_promises_is_checked(self, option, value, written):
        """The README names --dataset, --image-size, --seed and --batching beside --model
        and --global-batch as settings a resume must share."""
        saved = fingerprint(TrainConfig())
        flag = "--" + option.replace("_", "-")
        with pytest.raises(DynBatchError, match=rf"written with {flag} {written} "
                                                rf"\(now {value}\);"):
            check_fingerprint(saved, TrainConfig(**{option: value}), "ckpt")


def test_truncated_metrics_keep_what_came_before_the_checkpoint(tmp_path):
    path = tmp_path / "m.jsonl"
    records = [{"step": s, "batch_sizes": [1]} for s in range(6)] + [
        {"type": "eval", "step": 4}, {"type": "eval", "step": 6}, {"type": "summary"}]
    path.write_text("".join(f"{r}\n".replace("'", '"') for r in records))
    truncate_metrics(str(path), 4)
    assert read_metrics(str(path)) == records[:4] + [{"type": "eval", "step": 4}]


def local_run(tmp_path, **options):
    config = TrainConfig(model="mlp", dataset="digits", global_batch=64, seed=2,
                         eval_every=10, progress=False, metrics=str(tmp_path / "m.jsonl"),
                         save_model=str(tmp_path / "model.pt"), **options)
    return train(config, LocalBackend()), torch.load(config.save_model)


@pytest.mark.parametrize("batching", ["dynamic", "abs"])
def test_a_resumed_run_continues_the_whole_runs_steps(tmp_path, batching):
    """Ended at step 13 (the end checkpoint), resumed to 30: every step once in the
    metrics, --max-steps counting the whole run; synchronous steps end with the weights of
    the run that never stopped. ABS-SGD's windows are timed, so no other run computes the
    same ones: its weights are those of its logged windows replayed as two runs, the first
    ended (its last window applied at its end), the second going on from it."""
    ckpt, samples = str(tmp_path / "ckpt"), tmp_path / "samples"
    first, _ = local_run(tmp_path, batching=batching, max_steps=13, checkpoint_dir=ckpt,
                         checkpoint_every=5, sample_log=str(samples))
    assert first["steps"] == 13
    summary, weights = local_run(tmp_path, batching=batching, max_steps=30,
                                 checkpoint_dir=ckpt, checkpoint_every=5, resume=True,
                                 sample_log=str(samples))
    records = read_metrics(str(tmp_path / "m.jsonl"))
    assert [r["step"] for r in step_records(records)] == list(range(30))
    assert [r["type"] for r in records if r.get("type") in ("resume", "summary")] == \
        ["resume", "summary"]
    assert summary["steps"] == 30 and summary["samples"] == sum(
        r["global_batch"] for r in step_records(records))
    assert [p.name for p in CheckpointDir(ckpt).checkpoints()] == [
        "checkpoint-000000020.pt", "checkpoint-000000025.pt", "checkpoint-000000030.pt"]
    if batching == "dynamic":
        alone = tmp_path / "alone"
        alone.mkdir()
        _, expected = local_run(alone, batching=batching, max_steps=30)
        assert_same_weights(weights, expected)
    else:
        windows = logged_windows(samples, 1)
        assert sorted(windows) == list(range(30))
        expected = replay_abs_run([windows[k] for k in range(30)], "mlp", seed=2,
                                  lr=TrainConfig.lr, momentum=TrainConfig.momentum,
                                  ended_at=13)
        assert_same_weights(weights, expected)


@pytest.mark.processes
def test_resume_without_a_checkpoint_starts_fresh_and_a_changed_setting_is_refused(tmp_path):
    ckpt = str(tmp_path / "ckpt")
    out = run_cli(["train", "--max-steps", "3", "--checkpoint-dir", ckpt, "--resume",
                   "--no-progress"])
    assert out.returncode == 0 and "no checkpoint in" in out.stderr, out.stderr
    expect_user_error(run_cli(["train", "--max-steps", "6", "--checkpoint-dir", ckpt,
                               "--resume", "--global-batch", "32", "--no-progress"]),
                      "was written with --global-batch 64 (now 32)")
    expect_user_error(run_cli(["train", "--resume"]), "give the directory")


@pytest.mark.processes
def test_resume_skips_an_unreadable_newest_checkpoint_and_a_killed_saves_leftover_is_removed(
        tmp_path):
    ckpt, model = tmp_path / "ckpt", tmp_path / "model.pt"
    args = ["train", "--model", "mlp", "--global-batch", "32", "--max-steps", "8",
            "--checkpoint-dir", str(ckpt), "--checkpoint-every", "4", "--no-progress",
            "--save-model", str(model)]
    assert run_cli(args).returncode == 0
    (ckpt / "checkpoint-000000008.pt").write_bytes(b"cut short")
    # A model save killed mid-write (its PID above Linux's largest, so never alive).
    leftover = tmp_path / "model.pt.tmp.4194311"
    leftover.write_bytes(b"half a model")
    out = run_cli([*args, "--resume"])
    assert out.returncode == 0, out.stderr
    assert "warning: skipping cannot read checkpoint" in out.stderr and \
        "checkpoint-000000008.pt" in out.stderr
    assert "resuming from" in out.stderr and "checkpoint-000000004.pt at step 4" in out.stderr
    assert not leftover.exists() and model.exists()


# No batch norm: a split step's update equals the one-rank step to rounding.
COMMON = ["--model", "mlp", "--dataset", "digits", "--global-batch", "64", "--lr", "0.05",
          "--seed", "3", "--max-steps", "40", "--epochs", "5", "--adjust-every", "2",
          "--eval-every", "10", "--no-progress"]


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The run in one process without a stop: the weights and metrics to reproduce."""
    return train_one_process(COMMON, tmp_path_factory.mktemp("one"), "one")


class Job:
    """A 2-rank job of COMMON with checkpoints (under `launcher`, Gloo by default), its ranks
    emulated slow (about 0.1 s a step) so that a test can stop it mid-run; with `elastic`, a
    Horovod elastic job of one host, `localhost:2`."""

    def __init__(self, tmp_path, every: int, elastic: bool = False, slowdown: str = "40,120",
                 options=(), launcher: Launcher = Launcher.GLOO):
        tmp_path.mkdir(parents=True, exist_ok=True)
        self.ckpt, self.metrics = tmp_path / "ckpt", tmp_path / "m.jsonl"
        self.model, self.log = tmp_path / "m.pt", tmp_path / "first.log"
        self.files = ["--checkpoint-dir", str(self.ckpt), "--checkpoint-every", str(every),
                      "--metrics", str(self.metrics), "--save-model", str(self.model)]
        self.launch = {}
        if elastic:
            hosts = tmp_path / "hosts.txt"
            hosts.write_text("localhost:2\n")
            self.files.append("--elastic")
            self.launch = dict(elastic_discovery=DISCOVER, min_np=1, max_np=2,
                               env={"HVD_DYNBATCH_HOSTS_FILE": str(hosts)})
        self.proc = start_local(launcher, 2, [*CLI, "train", *COMMON, *self.files,
                                                   "--slowdown", slowdown, *options],
                                log=str(self.log), **self.launch)

    def wait_until(self, condition, what: str, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        while not condition():
            assert self.proc.poll() is None, f"ended before {what}: {self.log.read_text()}"
            assert time.monotonic() < deadline, f"no {what} within {timeout} s"
            time.sleep(0.1)

    def steps_written(self) -> int:
        return len(step_records(read_metrics(str(self.metrics)))) if self.metrics.exists() \
            else 0

    def processes(self) -> list:
        """The job's processes still alive (the launcher's and the ranks', wherever they were
        reparented): those whose command line names its checkpoint directory."""
        alive = []
        for p in psutil.process_iter(["cmdline", "status"]):
            if str(self.ckpt) in " ".join(p.info["cmdline"] or []) and \
                    p.info["status"] != psutil.STATUS_ZOMBIE:
                alive.append(p)
        return alive

    def stopped_at(self, reasons, statuses=None) -> int:
        """The job's end after a stop: an exit status in `statuses` (default: any non-zero),
        no process left within 30 s, one message per rank (`reasons`, sorted; each a
        message's start), every rank at the same step, the one checkpoint there; that step."""
        result = wait_local(self.proc, 120)
        deadline = time.monotonic() + 30
        while self.processes() and time.monotonic() < deadline:
            time.sleep(0.1)
        left = self.processes()
        for p in left:
            p.kill()
        log = self.log.read_text()
        assert not result.timed_out and not left, f"left {left}\n{log}"
        assert (result.returncode in statuses) if statuses else result.returncode != 0, \
            f"exit status {result.returncode}\n{log}"
        stops = sorted(line.split("hvd-dynbatch: error: ", 1)[1] for line in log.splitlines()
                       if "hvd-dynbatch: error: stopped by" in line)
        assert len(stops) == len(reasons) and \
            all(s.startswith(r) for s, r in zip(stops, sorted(reasons))), log
        steps = {int(s.split(" at step ")[1].split()[0]) for s in stops}
        assert len(steps) == 1, stops
        step = steps.pop()
        assert [p.name for p in CheckpointDir(str(self.ckpt)).checkpoints()] == \
            [f"checkpoint-{step:09d}.pt"]
        assert self.steps_written() == step < 40
        return step

    def kill_after_checkpoint(self, step: int) -> None:
        """kill -9 of the whole job (launcher and ranks) once a checkpoint of `step` or later
        is on disk, before the run's end."""
        try:
            self.wait_until(lambda: any(int(p.stem.split("-")[1]) >= step
                                        for p in self.ckpt.glob("checkpoint-*.pt")),
                            f"checkpoint at step {step}")
        finally:
            kill_tree(self.proc.pid)
            wait_local(self.proc, 30)
        assert self.steps_written() < 40, "the job ended before it was killed"

    def resume(self, launcher, np, slowdown, reference, **launch):
        """Resume with --resume on `np` ranks; check the weights and metrics against the
        uninterrupted one-process run."""
        resumed = run_ranks(launcher, np, [*CLI, "train", *COMMON, *self.files, "--resume",
                                           "--slowdown", slowdown], timeout=240, **launch)
        assert resumed.returncode == 0, resumed.explain()
        assert "resuming from" in resumed.job.stderr
        steps = step_records(read_metrics(str(self.metrics)))
        assert [r["step"] for r in steps] == list(range(40))
        assert [r["global_batch"] for r in steps] == \
            [r["global_batch"] for r in step_records(reference[1])]
        assert_same_weights(torch.load(self.model), reference[0], rtol=1e-5)
        assert not [p for p in os.listdir(self.ckpt) if not p.startswith("checkpoint-")]
        return steps


@pytest.mark.processes
def test_a_killed_job_resumes_on_another_launcher_and_world_with_the_same_weights(
        tmp_path, reference):
    """kill -9 of the whole 2-rank Gloo job after its checkpoint at step 8 or later; resumed
    with --resume on 3 ranks under mpirun, it ends with the weights of one uninterrupted
    process, every step in the metrics once."""
    job = Job(tmp_path, every=4)
    job.kill_after_checkpoint(8)
    steps = job.resume(Launcher.MPIRUN, 3, "1,2,1", reference)
    assert {len(r["batch_sizes"]) for r in steps} == {2, 3}


@pytest.mark.processes
def test_a_killed_elastic_job_resumes_from_its_checkpoints(tmp_path, reference):
    """Elastic commits live in the workers' memory; with --checkpoint-dir they reach the
    disk too: an elastic job killed whole (launcher and every worker) resumes as a new
    elastic job with --resume and ends with the uninterrupted weights."""
    job = Job(tmp_path, every=4, elastic=True)
    job.kill_after_checkpoint(8)
    job.resume(Launcher.GLOO, 2, "1,1", reference, **job.launch)


@pytest.mark.processes
def test_a_killed_abs_job_resumes_with_the_weights_of_its_windows_run_without_a_stop(
        tmp_path):
    """ABS-SGD's windows are timed, so no other run computes the same ones; what a resume
    must keep is checked against the windows themselves. kill -9 of the 2-rank job after its
    checkpoint at step 8 or later (taken with window s-1's reduced gradient not yet applied);
    resumed: the windows before the resumed step s, from the first run's sample log, and
    from s on, from the resumed run's, replayed as one uninterrupted ABS-SGD run (each
    window's mean gradient applied one window later, weight prediction, the last flushed;
    window s predicted from the momentum alone, as a rank's share of the pending gradient
    is its own and not saved) give the saved weights. A resume that lost the pending
    gradient or the momentum, or that redid or skipped a window, ends elsewhere."""
    first, then = tmp_path / "samples-first", tmp_path / "samples-resumed"
    abs_options = ["--batching", "abs", "--micro-batch", "8"]
    job = Job(tmp_path, every=4, options=[*abs_options, "--sample-log", str(first)])
    job.kill_after_checkpoint(8)
    resumed = run_ranks(Launcher.GLOO, 2, [*CLI, "train", *COMMON, *job.files, "--resume",
                                           *abs_options, "--slowdown", "1,3",
                                           "--sample-log", str(then)], timeout=240)
    assert resumed.returncode == 0, resumed.explain()
    step = int(resumed.job.stderr.split("resuming from ")[1].split(" at step ")[1].split()[0])
    assert step >= 8 and step % 4 == 0, resumed.job.stderr
    before = logged_windows(first, 2)
    after = logged_windows(then, 2)
    assert sorted(after) == list(range(step, 40)) and set(range(step)) <= set(before)
    windows = [before[k] for k in range(step)] + [after[k] for k in range(step, 40)]
    assert [r["batch_sizes"] for r in step_records(read_metrics(str(job.metrics)))] == \
        [[len(i) for i in w] for w in windows]
    # COMMON's model, seed and lr, at the default momentum.
    expected = replay_abs_run(windows, "mlp", seed=3, lr=0.05,
                              momentum=TrainConfig.momentum, resumed_at=step)
    assert_same_weights(torch.load(job.model), expected, rtol=1e-4)


def rank_process(job: Job, rank: int) -> psutil.Process:
    """The process of `rank` in `job`."""
    ranks = [p for p in psutil.Process(job.proc.pid).children(recursive=True)
             if "hvd_dynbatch" in " ".join(p.cmdline()) and f"HOROVOD_RANK={rank}" in
             " ".join(f"{k}={v}" for k, v in p.environ().items())]
    assert len(ranks) == 1, ranks
    return ranks[0]


@pytest.mark.processes
def test_sigterm_to_one_rank_stops_every_rank_at_one_step_with_a_checkpoint(
        tmp_path, reference):
    """SIGTERM (Slurm's notice) to rank 1 alone: both ranks stop at the same step, within
    one exchange (--adjust-every 2), after a checkpoint there; --resume finishes the run
    with the uninterrupted weights."""
    job = Job(tmp_path, every=100)
    job.wait_until(lambda: job.steps_written() >= 6, "6 steps")
    rank_process(job, 1).send_signal(signal.SIGTERM)
    job.stopped_at(["stopped by SIGTERM to this rank", "stopped by a signal to another rank"])
    job.resume(Launcher.GLOO, 2, "1,1", reference)


@pytest.mark.processes
def test_sigterm_to_one_abs_rank_stops_every_rank_at_one_window(tmp_path):
    """Under ABS-SGD the request rides in the gradient reduction: both ranks stop at the same
    window, with a checkpoint there."""
    job = Job(tmp_path, every=100, options=["--batching", "abs", "--micro-batch", "8",
                                            "--eval-every", "2"])
    job.wait_until(lambda: job.steps_written() >= 4, "4 windows")
    rank_process(job, 1).send_signal(signal.SIGTERM)
    job.stopped_at(["stopped by SIGTERM to this rank", "stopped by a signal to another rank"])


# What each launcher does, stopped as a user stops it (Ctrl-C in the terminal: SIGINT to its
# process group, which holds the launcher and not the ranks; or SIGTERM to the launcher), and
# the notice each rank then acts on (`training.stops`). Signalled, mpirun (also under
# horovodrun --mpi) sends the ranks SIGCONT, SIGTERM 1 s later and SIGKILL 1 s after that;
# horovodrun --mpi, SIGTERMed, ends at once and leaves mpirun and the ranks running;
# horovodrun --gloo passes SIGTERM on and SIGKILLs what is left 5 s later.
SIGCONT = "stopped by SIGCONT to this rank (Open MPI's notice that it kills the job)"
LAUNCHER_STOPS = {
    (Launcher.MPIRUN, "ctrl-c"): SIGCONT,
    (Launcher.MPIRUN, "sigterm"): SIGCONT,
    (Launcher.MPI, "ctrl-c"): SIGCONT,
    (Launcher.MPI, "sigterm"): "stopped by the end of this rank's launcher",
    (Launcher.GLOO, "ctrl-c"): "stopped by SIGTERM to this rank",
    (Launcher.GLOO, "sigterm"): "stopped by SIGTERM to this rank",
}


@pytest.mark.processes
@pytest.mark.parametrize("launcher, action", list(LAUNCHER_STOPS))
def test_a_stopped_launcher_stops_every_rank_with_a_checkpoint_and_leaves_no_process(
        tmp_path, launcher, action, reference):
    """Twice each, the slow rank's steps about 0.1 s, then about 0.3 s (each up to twice
    that under the full suite's load): within Open MPI's 2 s from SIGCONT to SIGKILL the
    step under way ends (the next one too where the notice came after every rank's share of
    the step's stop poll had gone), then the checkpoint is written. Each trial ends with the
    checkpoint of the step where every rank stopped, every rank's line, a non-zero exit
    (horovodrun --gloo, signalled, can read its ranks' status as 0: see hostfiles/README.md)
    and no process left. The second trial's checkpoint resumes to the uninterrupted
    weights."""
    for trial, slowdown in enumerate(["10,30", "30,90"]):
        job = Job(tmp_path / f"trial{trial}", every=100, launcher=launcher, slowdown=slowdown)
        # Past the emulator's first steps, which can take seconds while it calibrates.
        job.wait_until(lambda: job.steps_written() >= 8, "8 steps")
        if action == "ctrl-c":
            os.killpg(job.proc.pid, signal.SIGINT)   # start_local's session: pgid == pid
        else:
            job.proc.send_signal(signal.SIGTERM)
        job.stopped_at([LAUNCHER_STOPS[launcher, action]] * 2,
                       statuses=(0, 1) if launcher is Launcher.GLOO else None)
    job.resume(launcher, 2, "1,1", reference)
