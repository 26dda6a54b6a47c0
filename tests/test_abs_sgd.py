"""ABS-SGD: the window rule alone, and real runs checked against a one-process replay."""
import math

import numpy as np
import pytest
import torch

from hvd_dynbatch.core.abs_sgd import Window, WindowRule, last_micro_batch, next_micro_batch
from hvd_dynbatch.errors import DynBatchError
from hvd_dynbatch.tools.launch import Launcher
from hvd_dynbatch.training.metrics import read_metrics
from evaluation import logged_windows, replay_abs_run
from launcher import CLI, assert_same_weights, run_ranks, train_one_process


class TestWindowRule:
    def test_quotas_share_the_target_batch_by_the_measured_rates(self):
        rule = WindowRule(target_batch=128)
        # Ranks at 4000 and 1000 samples/s: 5000 samples/s in all, 128 samples in 25.6 ms,
        # 102.4 and 25.6 of them; the larger remainder takes the odd sample.
        window = rule.next_window([40, 10], [0.01, 0.01], 0.001)
        assert window.quotas == (102, 26)
        assert window.seconds == pytest.approx(0.0256)
        assert window.cap == pytest.approx(1.5 * 0.0256)
        assert window.floor == pytest.approx(0.5 * 0.0256)

    @pytest.mark.parametrize("seed", range(5))
    def test_the_quotas_add_up_to_the_target_batch(self, seed):
        rng = np.random.default_rng(seed)
        counts = rng.integers(1, 300, size=4)
        window = WindowRule(256).next_window(counts, rng.uniform(0.01, 0.2, size=4), 0.0)
        assert sum(window.quotas) == 256 and min(window.quotas) >= 1

    def test_noise_is_smoothed_and_a_real_change_is_followed_at_once(self):
        rule = WindowRule(target_batch=100, gain=0.5)
        rule.next_window([100], [1.0], 0.0)                   # 100 samples/s
        assert rule.next_window([110], [1.0], 0.0).seconds == pytest.approx(100 / 105)
        # 40% of the speed (a node slowed down): beyond the jump threshold, taken whole.
        assert rule.next_window([42], [1.0], 0.0).seconds == pytest.approx(100 / 42)

    def test_the_window_is_never_shorter_than_the_reduction(self):
        window = WindowRule(128).next_window([1280], [0.01], 0.009)
        assert window.seconds == pytest.approx(0.009) and window.quotas == (1152,)

    def test_until_every_rate_is_known_the_ranks_share_equally_without_a_cap(self):
        rule = WindowRule(65)
        window = rule.next_window([0, 0], [0.0, 0.0], 0.002)
        assert window.quotas == (33, 33) and math.isnan(window.seconds)
        window = rule.next_window([40, 0], [0.01, 0.0], 0.0)
        assert window.quotas == (33, 33) and window.cap == math.inf
        rule.next_window([0, 10], [0.0, 0.01], 0.0)
        # No reading from rank 1 this time: its estimate stands.
        assert rule.next_window([40, 0], [0.01, 0.0], 0.0).quotas == (52, 13)

    def test_bad_settings_are_rejected(self):
        with pytest.raises(DynBatchError):
            WindowRule(0)
        with pytest.raises(DynBatchError):
            WindowRule(64, gain=0)


@pytest.mark.parametrize("remaining, expected", [
    (0.100, 16),    # a full micro-batch fits
    (0.0052, 5),    # 5.2 samples' time left: 5
    (0.0004, 0),    # less than half a sample: close the window
    (0.0011, 2),    # one sample fits, but batch norm needs two
    (-0.001, 0)])
def test_the_last_micro_batch_ends_the_window_nearest_to_its_length(remaining, expected):
    assert last_micro_batch(remaining, 0.001, 16, least=2) == expected


# Rank 0's quota 40 in a window of 20 ms: cap 30 ms, floor 10 ms; 1 ms per sample.
WINDOW = Window(quotas=(40, 10), seconds=0.020, cap=0.030, floor=0.010)


@pytest.mark.parametrize("count, elapsed, expected", [
    (0, 0.05, 16),      # the first micro-batch is always taken
    (16, 0.010, 16),    # full micro-batches towards the quota
    (32, 0.018, 8),     # the last one cut to the quota
    (32, 0.0272, 3),    # near the cap: what fits before it
    (32, 0.031, 0),     # past the cap, short of the quota: done
    (40, 0.0052, 5),    # quota met before the floor: on to the floor
    (40, 0.012, 0)])    # quota met after the floor: done
def test_a_window_runs_to_its_quota_within_the_cap_and_on_to_the_floor(count, elapsed,
                                                                        expected):
    assert next_micro_batch(WINDOW, 0, count, elapsed, 0.001, 16, least=2) == expected


def test_before_the_rates_are_known_a_window_is_its_quota_alone():
    first = WindowRule(64).first_window(2)
    assert next_micro_batch(first, 1, 0, 0.0, 0.0, 8) == 8
    assert next_micro_batch(first, 1, 24, 9.0, 0.001, 8) == 8
    assert next_micro_batch(first, 1, 32, 0.0, 0.001, 8) == 0
    # Batch norm's two samples, even where one is left of the quota.
    assert next_micro_batch(first, 1, 31, 0.0, 0.001, 8, least=2) == 2


SEED, LR, MOMENTUM, STEPS = 4, 0.05, 0.9, 12
ARGS = ["train", "--batching", "abs", "--model", "linear", "--dataset", "digits",
        "--global-batch", "64", "--micro-batch", "8", "--lr", str(LR), "--momentum",
        str(MOMENTUM), "--seed", str(SEED), "--max-steps", str(STEPS), "--epochs", "50",
        "--slowdown", "1,3", "--adjust-every", "3", "--eval-every", "100", "--no-progress"]


@pytest.mark.processes
@pytest.mark.parametrize("launcher", list(Launcher))
def test_each_update_is_the_sample_weighted_mean_of_the_previous_window(tmp_path, launcher):
    samples, model, metrics = tmp_path / "samples", tmp_path / "m.pt", tmp_path / "m.jsonl"
    job = run_ranks(launcher, 2, [*CLI, *ARGS, "--sample-log", str(samples), "--save-model",
                                  str(model), "--metrics", str(metrics)], timeout=180)
    assert job.returncode == 0, job.explain()
    windows = logged_windows(samples, 2)
    assert sorted(windows) == list(range(STEPS))
    # Window k's samples give the mean gradient, each rank's part at the weights it
    # predicted (the default compensation); it is applied one window later, the last flushed.
    expected = replay_abs_run([windows[k] for k in range(STEPS)], "linear", SEED, LR,
                              MOMENTUM)
    assert_same_weights(torch.load(model), expected, rtol=1e-4)

    records = read_metrics(str(metrics))
    summary = records[-1]
    assert summary["weights_identical"], "ranks ended with different weights"
    assert len(summary["weights_checksums"]) == 2
    steps = [r for r in records if "batch_sizes" in r]
    assert [r["batch_sizes"] for r in steps] == [list(map(len, windows[k]))
                                                 for k in range(STEPS)]
    # Throughput counts every rank's samples, not rank 0's.
    assert summary["samples"] == sum(len(i) for w in windows.values() for i in w)
    # Rank 1 emulates a worker 3 times slower: it gets through fewer micro-batches.
    later = steps[2:]
    assert sum(r["batch_sizes"][0] for r in later) > 1.5 * sum(r["batch_sizes"][1]
                                                               for r in later)
    # Windows are planned once both ranks' rates are known: from window 2 (reduction 0 comes
    # with window 1's update).
    assert [r["window"] for r in steps[:2]] == [None, None]
    assert all(r["window"] > 0 for r in steps[2:])


@pytest.mark.processes
def test_epochs_count_target_batches_and_max_steps_sets_the_length(tmp_path):
    """ABS-SGD's epoch is ceil(1437 / 64) = 23 windows of the target batch; --max-steps 24
    alone runs past the first epoch (the default of one epoch does not cap it)."""
    _, records = train_one_process(["--batching", "abs", "--model", "linear", "--global-batch",
                                    "64", "--max-steps", "24"], tmp_path)
    summary = records[-1]
    assert (summary["steps"], summary["epochs_completed"]) == (24, 1)


@pytest.mark.processes
def test_the_default_configuration_converges_on_two_unequal_ranks(tmp_path):
    """The issue's defaults (lr 0.05, heavy-ball momentum 0.9) on a small problem: an MLP on
    the digits, target batch 256, 2 ranks one 4x slower, 120 windows (0.94 test accuracy
    here). At target batch 64, weight prediction took it to 0.94-0.947 in three runs,
    uncompensated (`--staleness none`, what ABS-SGD did before) to 0.59-0.68. Settled
    windows hold the target batch: by quota, a window falls short only where a rank hit the
    cap. They are never shorter than a reduction, though: on a faster machine a window of 64
    of these samples took about as long as one (2-3 ms), and 30% of the windows grew past
    64 by more than 10%; at 128, 7% did on a quiet machine and 20% in a busy CI run; at 256,
    3% on a quiet machine."""
    metrics = tmp_path / "m.jsonl"
    job = run_ranks(Launcher.GLOO, 2, [
        *CLI, "train", "--batching", "abs", "--model", "mlp", "--dataset", "digits",
        "--global-batch", "256", "--micro-batch", "8", "--lr", "0.05", "--momentum", "0.9",
        "--seed", "0", "--max-steps", "120", "--eval-every", "0", "--slowdown", "1,4",
        "--metrics", str(metrics), "--no-progress"], timeout=180)
    assert job.returncode == 0, job.explain()
    records = read_metrics(str(metrics))
    assert records[-1]["final_accuracy"] >= 0.9
    counts = [r["global_batch"] for r in records if "batch_sizes" in r][2:]
    assert sum(abs(c - 256) <= 26 for c in counts) >= 0.8 * len(counts), counts
