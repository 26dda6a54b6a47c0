"""The Slurm batch scripts under a real one-node Slurm cluster (tests/slurm.py), as a user
submits them: arguments after the script go to `hvd-dynbatch train`, the environment is found
without editing, and a job stopped by a signal or requeued resumes from its newest checkpoint
and ends with the weights of an uninterrupted run, with no process left behind.

Each job trains the MLP on the digits with static batches on 2 ranks, rank 1 emulating a
worker 50 times slower, so that the run lasts long enough to be interrupted (about 15 s);
its weights do not depend on the emulation, so the uninterrupted reference is one process.
"""
import glob
import subprocess
import time
from pathlib import Path

import pytest
import torch

from launcher import assert_same_weights, train_one_process
from slurm import ENDED

pytestmark = pytest.mark.processes

HOSTFILES = Path(__file__).resolve().parent.parent / "hostfiles"
FORMS = ("mpirun", "srun", "horovodrun")
RUN = ["--model", "mlp", "--dataset", "digits", "--global-batch", "64", "--max-steps", "300",
       "--batching", "static", "--checkpoint-every", "20"]
# How each launch form's ranks are reached by `scancel --signal=TERM`: mpirun and horovodrun
# make no job step, so the signal must go to the batch shell, which passes it to the ranks
# (slurm_job_launch in slurm_job.sh); srun's tasks are a step, which scancel signals by
# default.
SCANCEL = {"mpirun": ["--batch"], "srun": [], "horovodrun": ["--batch"]}


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    weights, _ = train_one_process(RUN, tmp_path_factory.mktemp("reference"))
    return weights


class Job:
    """One submission of a batch script and what it leaves in its folder."""

    def __init__(self, cluster, form: str, folder: Path, extra=()):
        self.cluster, self.form, self.folder = cluster, form, folder
        self.metrics, self.model = folder / "m.jsonl", folder / "model.pt"
        self.id = cluster.submit([
            "--nodes=1", "--ntasks-per-node=2", "--cpus-per-task=1",
            f"--output={folder}/job-%j.out", str(HOSTFILES / f"slurm_{form}.sbatch"), *RUN,
            *extra, "--save-model", str(self.model), "--metrics", str(self.metrics),
            "--no-progress"], folder)

    def checkpoints(self) -> list:
        return sorted(glob.glob(f"{self.folder}/checkpoints-{self.id}/checkpoint-*.pt"))

    def output(self) -> str:
        return (self.folder / f"job-{self.id}.out").read_text()

    def wait_for_checkpoint(self, timeout: float = 90) -> None:
        deadline = time.monotonic() + timeout
        while not self.checkpoints():
            assert time.monotonic() < deadline, f"no checkpoint after {timeout} s\n{self.log()}"
            time.sleep(0.2)

    def requeue(self) -> None:
        """`scontrol requeue`, and the job eligible at once once it is pending again (Slurm
        delays a requeued job's start by two minutes, counted from when its old run ended)."""
        done = self.cluster.run(["scontrol", "requeue", str(self.id)])
        assert done.returncode == 0, done.stderr
        self.cluster.wait(self.id, {"PENDING"}, 60)
        # slurmd refuses a job whose launch is stamped no later than its last run's kill
        # ("Job N already killed, do not launch batch job"): stamps are whole seconds.
        time.sleep(2)
        done = self.cluster.run(["scontrol", "update", f"JobId={self.id}", "StartTime=now"])
        assert done.returncode == 0, done.stderr

    def wait(self, timeout: float = 180) -> dict:
        record = self.cluster.wait(self.id, ENDED, timeout)
        # Every process of the job is gone with it.
        left = subprocess.run(["pgrep", "-af", str(self.metrics)], capture_output=True,
                              text=True).stdout
        assert not left, f"processes outlived job {self.id}:\n{left}"
        return record

    def log(self) -> str:
        return f"--- job {self.id} ({self.form})\n{self.output()}\n{self.cluster.logs()}"


def test_a_script_outside_slurm_says_to_submit_it():
    done = subprocess.run(["bash", str(HOSTFILES / "slurm_mpirun.sbatch")], capture_output=True,
                          text=True, timeout=30, env={"PATH": "/usr/bin:/bin"})
    assert done.returncode != 0 and "submit this script with sbatch" in done.stderr


def test_without_an_environment_the_job_says_what_to_set(slurm_cluster, tmp_path):
    slurm_cluster.env["HVD_DYNBATCH_VENV"] = str(tmp_path / "nowhere")
    try:
        job = Job(slurm_cluster, "mpirun", tmp_path)
    finally:
        del slurm_cluster.env["HVD_DYNBATCH_VENV"]
    assert job.wait(60)["JobState"] == "FAILED"
    out = job.output()
    assert f"no hvd-dynbatch environment in {tmp_path / 'nowhere'}" in out, job.log()
    assert "run 'make setup'" in out and "Traceback" not in out


@pytest.mark.parametrize("form", FORMS)
def test_a_requeued_running_job_resumes_and_ends_with_the_weights_of_one_run(
        slurm_cluster, tmp_path, reference, form):
    job = Job(slurm_cluster, form, tmp_path, ["--slowdown", "1,50"])
    job.wait_for_checkpoint()
    job.requeue()
    record = job.wait()
    assert record["JobState"] == "COMPLETED" and record["Restarts"] == "1", job.log()
    out = job.output()
    assert "start 1," in out and "start 2," in out, job.log()
    # Slurm requeues a finished job too: the second start resumed from a step short of the
    # end, so the requeue cut the first run short.
    resumed = [int(line.split(" at step ")[1].split()[0]) for line in out.splitlines()
               if "resuming from" in line]
    assert resumed and all(0 < step < 300 for step in resumed), job.log()
    assert_same_weights(torch.load(job.model), reference, rtol=1e-5)


@pytest.mark.parametrize("form", FORMS)
def test_scancel_term_checkpoints_and_stops_and_a_requeue_goes_on(slurm_cluster, tmp_path,
                                                                  reference, form):
    job = Job(slurm_cluster, form, tmp_path, ["--slowdown", "1,50"])
    job.wait_for_checkpoint()
    before = job.checkpoints()
    done = slurm_cluster.run(["scancel", *SCANCEL[form], "--signal=TERM", str(job.id)])
    assert done.returncode == 0, done.stderr
    record = job.wait(60)
    # The ranks stopped early, at the same step, with a checkpoint of it, and said so; the
    # job failed (horovodrun, signalled itself, could report their status as 0).
    assert record["JobState"] == "FAILED", job.log()
    newest = job.checkpoints()[-1]
    assert newest not in before and int(Path(newest).stem.split("-")[1]) < 300, job.log()
    assert not job.model.exists()
    out = job.output()
    assert out.count("the same command with --resume goes on") == 2, job.log()
    if form != "srun":
        assert "SIGTERM passed to the 2 training processes on" in out, job.log()
    job.requeue()
    record = job.wait()
    assert record["JobState"] == "COMPLETED" and record["Restarts"] == "1", job.log()
    assert_same_weights(torch.load(job.model), reference, rtol=1e-5)
