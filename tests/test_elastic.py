"""Elastic training under real horovodrun elastic jobs on localhost.

The discovery script in hostfiles/ reads a hosts file that the test rewrites mid-run. Every
worker logs the samples of each step (--sample-log), so the test can check that every sample
of each finished epoch was used exactly once, counting a step redone after a reset once.
"""
import collections
import dataclasses
import json
import os
import signal
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from hvd_dynbatch.backend.backends import LocalBackend
from hvd_dynbatch.backend.comm import Communicator
from hvd_dynbatch.core.timing import WARMUP_STEPS
from hvd_dynbatch.core.sampler import VariableBatchSampler
from hvd_dynbatch.tools.launch import Launcher, kill_tree, start_local, wait_local
from hvd_dynbatch.training.batching import StepRecord
from hvd_dynbatch.training.config import TrainConfig
from hvd_dynbatch.training.elastic import on_reset
from hvd_dynbatch.training.metrics import read_metrics, step_records
from hvd_dynbatch.training.trainer import Trainer
from launcher import CLI, DISCOVER

DIGITS_TRAIN = 1437
# A 10x emulated slowdown makes a step slow enough for workers to come and go. Only the
# protocol is under test, and the emulation multiplies any load on the machine into wall
# time (at 30x the grow-and-shrink job took 80 s here).
# The Gloo timeout the README recommends, which bounds the survivors' stall on a lost worker.
GLOO_TIMEOUT = 10
TRAIN = ["train", "--elastic", "--model", "cnn", "--dataset", "digits", "--global-batch", "96",
         "--epochs", "100", "--slowdown", "10,10,10", "--eval-every", "100", "--commit-every",
         "10", "--no-progress"]


class ElasticJob:
    """A horovodrun elastic job whose hosts the test changes through a hosts file."""

    def __init__(self, tmp_path, hosts, np, args, running):
        self.hosts_file, self.log = tmp_path / "hosts.txt", tmp_path / "job.log"
        self.metrics = tmp_path / "metrics.jsonl"
        self.samples = tmp_path / "samples"
        self.set_hosts(hosts)
        self.proc = start_local(
            Launcher.GLOO, np, [*CLI, *TRAIN, *args, "--metrics", str(self.metrics),
                                "--sample-log", str(self.samples)],
            log=str(tmp_path / "job.log"),
            env={"HVD_DYNBATCH_HOSTS_FILE": str(self.hosts_file),
                 "HOROVOD_GLOO_TIMEOUT_SECONDS": str(GLOO_TIMEOUT)},
            elastic_discovery=DISCOVER, min_np=1, max_np=3)
        running.append(self.proc)

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
        pytest.fail(f"timed out waiting for {what}:\n{self.log.read_text()[-3000:]}")

    def finish(self, timeout=480):
        result = wait_local(self.proc, timeout)
        assert not result.timed_out, "the elastic job did not finish in time"
        assert result.returncode == 0, self.log.read_text()[-3000:]
        return read_metrics(str(self.metrics))


@pytest.fixture
def running():
    """Launcher processes a test started; whatever is still running at its end, passed or
    failed, is killed with all its ranks."""
    procs = []
    yield procs
    for proc in procs:
        if proc.poll() is None:
            kill_tree(proc.pid)
            proc.wait()


def check_summary(records):
    """Cross-rank facts of a finished elastic run: every rank had the same weights at every
    evaluation and at the end, and the summary counts the samples of the steps that counted
    (the latest record of a step redone after a reset)."""
    evals = [r for r in records if r.get("type") == "eval"]
    assert evals and all(len(set(e["weights_checksums"])) == 1 for e in evals), evals
    summary = records[-1]
    assert summary["type"] == "summary"
    assert summary["weights_identical"], summary["weights_checksums"]
    assert len(summary["weights_checksums"]) == summary["world_size"]
    latest = {r["step"]: r for r in step_records(records)}
    assert summary["samples"] == sum(r["global_batch"] for r in latest.values())
    assert summary["steps"] == len(latest) == max(latest) + 1
    return summary


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


@pytest.mark.processes
def test_grow_and_shrink_with_scaled_batch_and_smooth_learning_rate(tmp_path, running):
    job = ElasticJob(tmp_path, ["localhost:2"], 2,
                     ["--max-steps", "400", "--batch-policy", "scale", "--lr-rule", "smooth",
                      "--smooth-steps", "10", "--lr", "0.04", "--eval-every", "10"], running)
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
    summary = check_summary(records)
    assert summary["steps"] == 400 and summary["world_size"] == 2
    assert summary["elastic_generations"] == 3
    # The worker that joined had the others' weights: evaluations on 3 workers agree too.
    assert any(len(e["weights_checksums"]) == 3 for e in records if e.get("type") == "eval")


@pytest.mark.processes
def test_a_killed_worker_is_survived_from_the_last_commit(tmp_path, running):
    # Two host names for this machine: Horovod blacklists the host of a failed worker, and
    # a job whose every host is blacklisted stops.
    job = ElasticJob(tmp_path, ["localhost:2", "127.0.0.1:1"], 3, ["--max-steps", "200"],
                     running)
    job.wait_for(lambda s: len(s) >= 25, "25 steps on 3 workers")
    victim = next(job.samples.glob("127.0.0.1-*.jsonl")).stem.split("-")[1]
    os.kill(int(victim), signal.SIGKILL)
    records = job.finish()
    assert job.proc.returncode == 0

    resets = [r for r in records if r.get("type") == "reset"]
    assert resets and resets[-1]["world_size"] == 2
    resumed = resets[-1]["step"]
    assert resumed % 10 == 0, "survivors go on from a commit"
    steps = {r["step"] for r in records if "batch_sizes" in r}
    assert steps == set(range(200))
    exact, redone = sample_coverage(job.samples, DIGITS_TRAIN)
    assert all(exact.values()) and len(exact) >= 10
    # Only steps after the last commit are redone (none, if the kill came right after it).
    assert all(resumed <= step < resumed + 10 for step in redone), (resumed, redone)
    # A step the metrics hold twice (written before the kill, redone after) is marked by a
    # later generation the second time.
    generations = {}
    for r in (r for r in records if "batch_sizes" in r):
        assert r["generation"] > generations.get(r["step"], 0), r
        generations[r["step"]] = r["generation"]
    summary = check_summary(records)
    assert summary["world_size"] == 2


class World(Communicator):
    """Rank and size of a world, without a way to talk to it: binding and resuming are local.
    A step's stop poll (one value: nobody asks to stop) is answered and counted."""

    backend = "none"

    def __init__(self, rank, size):
        self._rank, self._size = rank, size
        self.polls = 0

    rank = property(lambda self: self._rank)
    size = property(lambda self: self._size)

    def allgather(self, values):
        if list(values) != [0.0]:
            raise AssertionError("resuming must not communicate")
        self.polls += 1
        return np.zeros((self.size, 1))


class WorldBackend(LocalBackend):
    """A one-process backend that claims to be rank `rank` of `size`."""

    def __init__(self, rank, size):
        self.world = World(rank, size)

    def communicator(self):
        return self.world


# No exchange within the steps below (adjust_every), so no communication is needed.
ELASTIC = TrainConfig(model="linear", global_batch=64, elastic=True, seed=5, lr_rule="smooth",
                      adjust_every=1000)


def run_steps(trainer, count):
    """Hand out and close `count` steps without training (the position is what matters)."""
    batches = iter(trainer.steps.loader)
    for _ in range(count):
        next(batches)
        trainer.steps.batching.step_done()


@pytest.fixture(scope="module")
def committed():
    """Rank 0 of 2 after 7 steps: a moved split, the controller's state, the position, the
    clock, the learning rate ramping back after B went 64 -> 128 -> 64; and its state."""
    trainer = Trainer(ELASTIC, WorldBackend(0, 2))
    trainer.join_world(World(0, 2))
    batching = trainer.steps.batching
    batching.set_global_batch(64, split=(20, 44))
    batching.controller.update((20, 44), [0.1, 0.3])
    run_steps(trainer, 7)
    trainer.schedule.on_batch_change(3, 128)
    trainer.schedule.on_batch_change(5, 64)
    return trainer, trainer.state_dict()


def test_reset_callback_does_not_communicate(committed):
    """Horovod runs reset callbacks before the state sync, where a collective would hang:
    the trainer's communicator raises on any use, and there are 7 steps' facts to drop."""
    trainer, _ = committed
    batching = trainer.steps.batching
    assert len(batching._exchange) == 7 and batching.timer.smoothed > 0
    polls = batching.comm.polls
    on_reset(trainer)
    assert batching.comm.polls == polls == 7
    assert len(batching._exchange) == 0
    assert batching.timer.smoothed != batching.timer.smoothed  # NaN: timings start afresh


def test_a_world_of_the_same_size_resumes_with_the_committed_split(committed):
    trainer, state = committed
    batching = trainer.steps.batching
    assert batching.split == (20, 44) and batching.controller.state.adjustments == 1
    joined = Trainer(ELASTIC, WorldBackend(1, 2))
    joined.join_world(World(1, 2), committed=state)
    resumed = joined.steps.batching
    assert (joined.comm.rank, joined.comm.size) == (1, 2)
    assert resumed.split == (20, 44)
    # As JSON, so that the fixed costs not yet fitted (NaN) compare equal.
    assert (json.dumps(resumed.controller.state.state_dict(), sort_keys=True)
            == json.dumps(batching.controller.state.state_dict(), sort_keys=True))
    assert resumed.state_dict()["position"] == batching.state_dict()["position"]
    assert (resumed.step, resumed.clock) == (7, batching.clock) and resumed.step == 7
    assert trainer.schedule.lr(10) != ELASTIC.lr
    assert [joined.schedule.lr(k) for k in range(50)] == [trainer.schedule.lr(k)
                                                         for k in range(50)]
    assert joined.run.generation == trainer.run.generation + 1
    # It takes rank 1's slice of the step the job goes on with.
    ahead = VariableBatchSampler(len(trainer.data.train), 1, (20, 44), ELASTIC.seed)
    ahead.load_state_dict(batching.state_dict()["position"])
    x, _, _ = next(iter(joined.steps.loader))
    assert torch.equal(x, trainer.data.train.fetch(ahead.next_step().indices)[0])


def test_a_world_of_another_size_resumes_from_an_even_split(committed):
    trainer, state = committed
    grown = Trainer(ELASTIC, WorldBackend(2, 3))
    grown.join_world(World(2, 3), committed=state)
    resumed = grown.steps.batching
    assert resumed.split == (22, 21, 21)
    assert resumed.controller.state.adjustments == 0
    assert resumed.state_dict()["position"] == trainer.steps.batching.state_dict()["position"]
    assert grown.state_dict()["steps"]["splits"] == [[7, [22, 21, 21]]]


def test_a_slowed_rank_that_a_shrink_leaves_alone_does_not_calibrate_again():
    """Its emulated factor holds from the first step of the 1-rank world: the typical compute
    (the rank at factor 1's 0.4 ms a sample) comes along, so its first step sleeps to 4 times
    that, where a calibrating rank would run at full speed."""
    trainer = Trainer(dataclasses.replace(ELASTIC, slowdown="4,1"), WorldBackend(0, 2))
    trainer.join_world(World(0, 2))
    trainer.emulator.observe([StepRecord(step, 0, [32, 32], [0.05, 0.0128], 1.0)
                              for step in range(WARMUP_STEPS, WARMUP_STEPS + 3)])
    trainer.join_world(World(0, 1), committed=trainer.state_dict())
    started = time.perf_counter()
    trainer.emulator.after_compute(WARMUP_STEPS + 3, 64, 0.03)
    assert time.perf_counter() - started >= 4 * 0.0256 - 0.03 - 0.001
    assert not trainer.emulator.calibrated(WARMUP_STEPS + 3)


def lines_in(directory: Path) -> dict:
    """Lines written so far to each file of `directory`."""
    return {f: len(f.read_text().splitlines()) for f in directory.iterdir()}


@pytest.mark.processes
def test_without_elastic_a_lost_worker_ends_the_job_with_an_error(tmp_path, running):
    samples = tmp_path / "samples"
    proc = start_local(Launcher.GLOO, 2, [
        *CLI, "train", "--model", "cnn", "--epochs", "100", "--max-steps", "2000",
        "--slowdown", "30,30", "--no-progress", "--sample-log", str(samples)])
    running.append(proc)
    deadline = time.monotonic() + 60
    # Both ranks have trained a few steps: the victim dies in the middle of training.
    while not (samples.exists() and len(lines_in(samples)) == 2
               and min(lines_in(samples).values()) >= 3):
        assert time.monotonic() < deadline and proc.poll() is None, "the job did not start"
        time.sleep(0.2)
    victim = sorted(samples.iterdir())[0].stem.split("-")[-1]
    os.kill(int(victim), signal.SIGKILL)
    result = wait_local(proc, timeout=60)
    assert not result.timed_out, "the job hung after losing a worker"
    assert result.returncode != 0
