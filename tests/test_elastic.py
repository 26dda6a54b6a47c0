"""Elastic training under real horovodrun elastic jobs on localhost.

The discovery script in hostfiles/ reads a hosts file that the test rewrites mid-run. Every
worker logs the samples of each step (--sample-log), so the test can check that every sample
of each finished epoch was used exactly once, counting a step redone after a reset once.
"""
import collections
import json
import os
import signal
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from hvd_dynbatch.elastic import on_reset
from hvd_dynbatch.launch import Launcher, kill_tree, start_local, wait_local
from hvd_dynbatch.metrics import read_metrics
from hvd_dynbatch.timing import StepTimer
from launcher import CLI

DISCOVER = str(Path(__file__).resolve().parent.parent / "hostfiles" / "discover_hosts.sh")
DIGITS_TRAIN = 1437
# A 30x emulated slowdown makes a step take ~50 ms, slow enough for workers to come and go.
TRAIN = ["train", "--elastic", "--model", "cnn", "--dataset", "digits", "--global-batch", "96",
         "--epochs", "100", "--slowdown", "30,30,30", "--eval-every", "100", "--commit-every",
         "10", "--no-progress"]


class ElasticJob:
    """A horovodrun elastic job whose hosts the test changes through a hosts file."""

    def __init__(self, tmp_path, hosts, np, args):
        self.hosts_file, self.log = tmp_path / "hosts.txt", tmp_path / "job.log"
        self.metrics = tmp_path / "metrics.jsonl"
        self.samples = tmp_path / "samples"
        self.set_hosts(hosts)
        self.proc = start_local(
            Launcher.GLOO, np, [*CLI, *TRAIN, *args, "--metrics", str(self.metrics),
                                "--sample-log", str(self.samples)],
            log=str(tmp_path / "job.log"),
            env={"HVD_DYNBATCH_HOSTS_FILE": str(self.hosts_file)},
            elastic_discovery=DISCOVER, min_np=1, max_np=3)

    def set_hosts(self, hosts):
        self.hosts_file.write_text("\n".join(hosts) + "\n")

    def steps(self):
        if not self.metrics.exists():
            return []
        return [json.loads(line) for line in self.metrics.read_text().splitlines()
                if '"batch_sizes"' in line]

    def wait_for(self, condition, what, timeout=120):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if condition(self.steps()):
                return
            if self.proc.poll() is not None:
                pytest.fail(f"the job ended (exit {self.proc.returncode}) before {what}:\n"
                            f"{self.log.read_text()[-3000:]}")
            time.sleep(0.5)
        kill_tree(self.proc.pid)
        pytest.fail(f"timed out waiting for {what}")

    def finish(self, timeout=240):
        result = wait_local(self.proc, timeout)
        assert not result.timed_out, "the elastic job did not finish in time"
        assert result.returncode == 0, self.log.read_text()[-3000:]
        return read_metrics(str(self.metrics))


def sample_coverage(sample_dir, dataset_size):
    """Per finished epoch, whether each sample was used exactly once; and the redone steps."""
    records = [json.loads(line) for f in Path(sample_dir).iterdir()
               for line in f.read_text().splitlines()]
    latest = collections.defaultdict(int)
    for r in records:
        latest[r["step"]] = max(latest[r["step"]], r["generation"])
    used = collections.defaultdict(list)
    for r in records:
        if r["generation"] == latest[r["step"]]:
            used[r["epoch"]].extend(r["indices"])
    finished = sorted(used)[:-1]
    exact = {e: sorted(used[e]) == list(range(dataset_size)) for e in finished}
    redone = {r["step"] for r in records if r["generation"] < latest[r["step"]]}
    return exact, redone


def test_grow_and_shrink_with_scaled_batch_and_smooth_learning_rate(tmp_path):
    job = ElasticJob(tmp_path, ["localhost:2"], 2,
                     ["--max-steps", "400", "--batch-policy", "scale", "--lr-rule", "smooth",
                      "--smooth-steps", "10", "--lr", "0.04"])
    job.wait_for(lambda s: len(s) >= 20, "20 steps on 2 workers")
    job.set_hosts(["localhost:3"])
    job.wait_for(lambda s: sum(r["world_size"] == 3 for r in s) >= 40, "40 steps on 3 workers")
    job.set_hosts(["localhost:2"])
    records = job.finish()
    assert job.proc.returncode == 0

    steps = {r["step"]: r for r in records if "batch_sizes" in r}
    assert sorted(steps) == list(range(400))
    worlds = [steps[s]["world_size"] for s in sorted(steps)]
    changes = [w for k, w in enumerate(worlds) if k == 0 or w != worlds[k - 1]]
    assert changes == [2, 3, 2], changes
    grow = worlds.index(3)
    shrink = grow + worlds[grow:].index(2)
    full = [steps[s] for s in sorted(steps) if steps[s]["global_batch"] in (96, 144)]
    assert all(r["global_batch"] == 48 * r["world_size"] for r in full)
    assert all(len(r["batch_sizes"]) == r["world_size"] for r in steps.values())

    # The learning rate moves from 0.04 to 0.06 over 10 x 1.5 = 15 steps, and back.
    lr = [steps[s]["lr"] for s in sorted(steps)]
    assert lr[grow - 1] == pytest.approx(0.04) and lr[grow + 15] == pytest.approx(0.06)
    assert lr[shrink + 15] == pytest.approx(0.04)
    jumps = [abs(b - a) for a, b in zip(lr, lr[1:])]
    assert max(jumps) <= 0.02 / 15 * 1.001, "no single jump: the change is spread over 15 steps"

    exact, redone = sample_coverage(job.samples, DIGITS_TRAIN)
    assert len(exact) >= 20 and all(exact.values()), exact
    summary = records[-1]
    assert summary["type"] == "summary" and summary["steps"] == 400
    assert summary["elastic_generations"] == 3


def test_a_killed_worker_is_survived_from_the_last_commit(tmp_path):
    # Two host names for this machine: Horovod blacklists the host of a failed worker, and
    # a job whose every host is blacklisted stops.
    job = ElasticJob(tmp_path, ["localhost:2", "127.0.0.1:1"], 3, ["--max-steps", "200"])
    job.wait_for(lambda s: len(s) >= 25, "25 steps on 3 workers")
    victim = next(job.samples.glob("127.0.0.1-*.jsonl")).stem.split("-")[1]
    os.kill(int(victim), signal.SIGKILL)
    records = job.finish()
    assert job.proc.returncode == 0

    resets = [r for r in records if r.get("type") == "reset"]
    assert resets and resets[-1]["world_size"] == 2
    assert resets[-1]["step"] % 10 == 0, "survivors go on from a commit"
    steps = {r["step"] for r in records if "batch_sizes" in r}
    assert steps == set(range(200))
    exact, redone = sample_coverage(job.samples, DIGITS_TRAIN)
    assert all(exact.values()) and len(exact) >= 10
    assert redone and max(redone) - min(redone) < 10, "only steps after the last commit redo"


def test_reset_callback_does_not_communicate():
    """Horovod runs reset callbacks before the state sync, where a collective would hang.

    Horovod is not initialised in this process, so any Horovod call would raise, and the
    trainer's communicator raises on any use.
    """
    class NoComm:
        def __getattr__(self, name):
            raise AssertionError(f"the reset callback used the communicator ({name})")

    timer = StepTimer()
    timer.record(1.0)
    trainer = SimpleNamespace(pending=[(1, 0.1, 2.0)], pending_info=[{"step": 3}],
                              timer=timer, comm=NoComm())
    on_reset(trainer)
    assert trainer.pending == [] and trainer.pending_info == []
    assert timer.smoothed != timer.smoothed  # NaN: timings start afresh


def test_without_elastic_a_lost_worker_ends_the_job_with_an_error(tmp_path):
    samples = tmp_path / "samples"
    proc = start_local(Launcher.GLOO, 2, [
        *CLI, "train", "--model", "cnn", "--epochs", "100", "--max-steps", "2000",
        "--slowdown", "30,30", "--no-progress", "--sample-log", str(samples)])
    deadline = time.monotonic() + 60
    while not (samples.exists() and len(list(samples.iterdir())) == 2):
        assert time.monotonic() < deadline and proc.poll() is None, "the job did not start"
        time.sleep(0.5)
    time.sleep(2)
    victim = sorted(samples.iterdir())[0].stem.split("-")[-1]
    os.kill(int(victim), signal.SIGKILL)
    result = wait_local(proc, timeout=60)
    assert not result.timed_out, "the job hung after losing a worker"
    assert result.returncode != 0
