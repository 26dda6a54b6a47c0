"""Smoke runs of the benchmark scripts that users run on their own clusters: they start and
report what they promise (figures are the benchmarks' business, not the tests')."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

from hvd_dynbatch.tools.launch import Launcher, local_env
from launcher import DISCOVER, PYTHON, run_ranks, table_rows

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"


@pytest.mark.processes
def test_throughput_runs_as_ranks_of_an_mpirun_job():
    job = run_ranks(Launcher.MPIRUN, 2, [
        PYTHON, str(BENCHMARKS / "throughput.py"), "--model", "linear", "--steps", "6",
        "--global-batch", "32", "--slowdown", "1,3", "--steps-per-iter", "3"],
        timeout=180)
    assert job.returncode == 0, job.explain()
    [report] = job.records
    assert report["world_size"] == 2 and sum(report["final_split"]) == 32
    assert len(report["rank_samples_per_sec"]) == 2 and min(report["rank_samples_per_sec"]) > 0
    assert report["steady_samples_per_sec"] > 0
    # Before it, rank 0's figures as Horovod's synthetic benchmark prints them.
    out = job.job.stdout
    iters = [line for line in out.splitlines() if "Iter #" in line]
    assert "Number of CPUs: 2" in out and len(iters) == 1, out
    assert "img/sec per CPU" in iters[0] and "Total img/sec on 2 CPU(s):" in out, out


@pytest.mark.processes
def test_plain_horovod_runs_in_horovods_elastic_state_under_the_elastic_launcher(tmp_path):
    """overhead.py's baseline for elastic jobs: plain Horovod committing as `train` does."""
    hosts, output = tmp_path / "hosts.txt", tmp_path / "plain.json"
    hosts.write_text("localhost:2\n")
    job = run_ranks(Launcher.GLOO, 2, [
        PYTHON, str(BENCHMARKS / "plain_horovod.py"), "--model", "linear", "--dataset",
        "digits", "--global-batch", "32", "--steps", "12", "--commit-every", "5",
        "--output", str(output)], timeout=180, elastic_discovery=DISCOVER, min_np=2, max_np=2,
        env={"HVD_DYNBATCH_HOSTS_FILE": str(hosts)})
    assert job.returncode == 0, job.explain()
    report = json.loads(output.read_text())
    assert report["commits"] == 2 and report["samples_per_sec"] > 0


@pytest.mark.processes
def test_step_clock_runs_on_the_cpu_and_reports_the_three_clocks():
    """The GPU check's step clock, dry-run on the CPU, so that it cannot first fail on a GPU.
    Whether the clocks agree is its own verdict (exit 0 or 1); on 2 busy cores it varies."""
    out = subprocess.run([sys.executable, str(BENCHMARKS / "step_clock.py"), "--device", "cpu",
                          "--model", "cnn", "--image-size", "32", "--steps", "8"],
                         env=local_env(), capture_output=True, text=True, timeout=120)
    assert out.returncode in (0, 1) and not out.stderr.count("Traceback"), out.stderr
    [truth], [toolkit], [host] = (table_rows(out.stdout, name) for name in (
        "torch.cuda.synchronize around the step (ground truth)", "hvd-dynbatch's compute time",
        "host clock, no wait"))
    assert truth[2] == "1.000", out.stdout
    assert all(float(row[1]) > 0 for row in (truth, toolkit, host)), out.stdout
    verdict = "agrees" if out.returncode == 0 else "DOES NOT agree"
    assert f"hvd-dynbatch's clock {verdict} with the ground truth within 5%" in out.stdout


@pytest.mark.processes
def test_make_imagefolder_writes_a_trainable_folder(tmp_path):
    out = subprocess.run([sys.executable, str(BENCHMARKS / "make_imagefolder.py"), str(tmp_path),
                          "--classes", "3", "--train-per-class", "4", "--val-per-class", "2"],
                         env=local_env(), capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert len(list((tmp_path / "train").glob("class0*/*.jpg"))) == 12
    assert sorted(p.name for p in (tmp_path / "val").iterdir()) == ["class00", "class01",
                                                                   "class02"]


def test_throughput_prints_horovods_figures_from_the_steady_steps():
    sys.path.insert(0, str(BENCHMARKS))
    from throughput import horovod_lines

    config = {"model": "cnn", "global_batch": 64}
    # 2 start-up steps (the quarter skipped), then 2 groups of 3: 64 x 3 samples in 0.6 s and 0.4 s.
    times = [1.0] * 2 + [0.2] * 3 + [0.4 / 3] * 3
    records = [{"type": "step", "step": k, "global_batch": 64, "batch_sizes": [48, 16],
                "step_time": t} for k, t in enumerate(times)]
    lines = horovod_lines(records + [{"type": "summary", "config": config}], 3, "GPU")
    per_device = [64 * 3 / 0.6 / 2, 64 * 3 / 0.4 / 2]          # 160 and 240
    mean, conf = 200.0, 1.96 * 40.0
    assert lines == ["Model: cnn", "Batch size: 64 over all devices", "Number of GPUs: 2",
                     f"Iter #0: {per_device[0]:.1f} img/sec per GPU",
                     f"Iter #1: {per_device[1]:.1f} img/sec per GPU",
                     f"Img/sec per GPU: {mean:.1f} +-{conf:.1f}",
                     f"Total img/sec on 2 GPU(s): {2 * mean:.1f} +-{2 * conf:.1f}"]


def test_settling_counts_the_adjustments_after_which_the_split_holds():
    sys.path.insert(0, str(BENCHMARKS))
    from settling import settle_figures

    before = [(128, 128), (200, 56), (206, 50), (205, 51), (205, 51), (205, 51)]
    after = [(205, 51), (60, 196), (51, 205), (50, 206), (51, 205), (51, 205)]
    imbalances = [4.0, 1.2, 1.05, 1.3, 1.0, 1.0, 4.0, 1.2, 1.3, 1.08, 1.0, 1.0]
    figures = settle_figures(before + after, imbalances, 6, 256)
    # Settled by the imbalance after 2 and 3 adjustments; the split held within 2% of B
    # (5.12 samples) of 205 and 51 after 1 and 2.
    assert figures[:2] == [2, 3]
    assert figures[4:] == ["205/51", "1/2"]


def test_settling_balance_is_the_step_time_the_ranks_throughputs_allow_over_the_slowest():
    sys.path.insert(0, str(BENCHMARKS))
    from settling import paired, windows

    # Rank 0 runs 3 samples in 0.3 s (a stalled step aside), rank 1 one in 0.2: 15 samples/s
    # between them would take a 4-sample step 0.2667 s, where the slowest rank took 0.3.
    records = [{"step": k, "batch_sizes": [3, 1], "compute_times": [t, 0.2],
                "update_times": [0.0, 0.0]} for k, t in enumerate([0.3, 0.3, 9.0])]
    records += [{"step": 3 + k, "batch_sizes": [2, 2], "compute_times": [0.1, 0.1]}
                for k in range(3)]
    (split, imbalance, balance), (_, even, balanced) = windows(records, 3)
    assert split == [3, 1] and imbalance == pytest.approx(1.5)
    assert balance == pytest.approx(0.2667 / 0.3, rel=1e-3)
    assert even == balanced == pytest.approx(1.0)
    # The second rule lost 1 point in one pair and gained 3 in the other.
    assert paired([0.90, 0.90], [0.89, 0.93]) == "+1.0% (+-2.0%), 1 of 2"


def test_settling_keeps_each_jobs_records_under_a_name_that_says_which_job(tmp_path):
    sys.path.insert(0, str(BENCHMARKS))
    from settling import keep_records
    from hvd_dynbatch.core.controller import Rule
    from hvd_dynbatch.training.metrics import read_metrics

    records = [{"step": 0, "batch_sizes": [128, 128]}, {"type": "summary"}]
    keep_records(str(tmp_path / "traces"), records, "0:1,4;75:4,1", "cnn", Rule.MODEL, 1)
    written = tmp_path / "traces" / "0-1,4+75-4,1_cnn_model_2.jsonl"
    assert read_metrics(str(written)) == records


def test_replay_rebuilds_the_readings_the_controller_saw_and_tells_a_split_it_did_not_make():
    """Rank 1 takes 4 times rank 0's time a sample, and rank 0's first three steps take 3
    times its later ones (a process warming up). From steps 2-4, whose median is a warm one,
    the `p` rule moves the even split to 205/51; a replay that timed steps 0-4 would not,
    and a job that ran another split is told."""
    sys.path.insert(0, str(BENCHMARKS))
    from replay import replay
    from hvd_dynbatch.training.config import TrainConfig

    def step(k, split):
        warming = 3.0 if k < 3 else 1.0
        return {"step": k, "batch_sizes": list(split), "update_times": [0.0, 0.0],
                "compute_times": [warming * 1e-3 * split[0], 4e-3 * split[1]]}

    config = TrainConfig(global_batch=256, controller="p", max_steps=10).plain()
    ran = [step(k, (128, 128)) for k in range(5)] + [step(k, (205, 51)) for k in range(5, 10)]
    found = replay([*ran, {"config": config}], 2, lag=0, min_batch=2)
    (first, second), replayed, recorded = found.readings, found.replayed, found.recorded
    assert first[0] == [128, 128] and first[1] == [pytest.approx(0.128), pytest.approx(0.512)]
    assert second[1] == [pytest.approx(0.205), pytest.approx(0.204)]  # timed afresh
    assert replayed[0] == [205, 51] == recorded[0] and recorded[1] is None
    assert found.fixed is None and found.changes == []
    other = [step(k, (128, 128)) for k in range(10)]
    found = replay([*other, {"config": config}], 2, lag=0, min_batch=2)
    assert found.replayed[0] != found.recorded[0]
    found = replay([*ran, {"config": config}], 0, lag=0, min_batch=2)
    assert found.replayed[0] != [205, 51]


def test_replay_exchanges_where_the_job_did_while_the_split_held():
    """10 ms steps whose even split holds: with `hold_seconds` 0.25 in the run's config the
    exchanges after the first come every 20 steps (hold_steps), without it (a run from
    before holds) every 5."""
    sys.path.insert(0, str(BENCHMARKS))
    from replay import replay
    from hvd_dynbatch.training.config import TrainConfig

    config = TrainConfig(global_batch=256, controller="p", max_steps=50).plain()
    ran = [{"step": k, "batch_sizes": [128, 128], "update_times": [0.0, 0.0],
            "compute_times": [0.01, 0.01]} for k in range(50)]
    found = replay([*ran, {"config": config}], 2, lag=0, min_batch=2)
    assert config["hold_seconds"] == 0.25 and len(found.readings) == 3  # after 5, 25, 45
    assert found.replayed == [[128, 128]] * 3
    # Commits every 10 steps exchange too, and a hold ends at the last within it: the
    # controller adjusts after steps 5, 20 and 40 (10, 30 and 50 fall in holds).
    elastic = {**config, "elastic": True}
    assert len(replay([*ran, {"config": elastic}], 2, lag=0, min_batch=2).readings) == 3
    del config["hold_seconds"]
    assert len(replay([*ran, {"config": config}], 2, lag=0, min_batch=2).readings) == 10


def changing_job(rule: str):
    """A job's records as the ranks would write them: two ranks at 2 ms of fixed cost and 1
    and 4 ms a sample, rank 0 three times slower from step 40, 60 steps, each split the one
    the replayed controller decides; and the config its summary carries."""
    sys.path.insert(0, str(BENCHMARKS))
    from replay import replay
    from hvd_dynbatch.training.config import TrainConfig

    config = TrainConfig(global_batch=256, controller=rule, max_steps=60, hold_seconds=0.0).plain()
    ran, split = [], [128, 128]
    for k in range(60):
        per_sample = [3e-3 if k >= 40 else 1e-3, 4e-3]
        ran.append({"step": k, "batch_sizes": list(split), "update_times": [0.0, 0.0],
                    "compute_times": [0.002 + c * b for c, b in zip(per_sample, split)]})
        if (k + 1) % config["adjust_every"] == 0:
            split = replay([*ran, {"config": config}], 2, lag=0, min_batch=2).replayed[-1]
    return ran, config


@pytest.mark.parametrize("rule", ["model", "pid"])
def test_replay_tells_the_changes_of_speed_the_controller_took(rule):
    """The first exchange after rank 0 slows down takes its speed for changed, and no other
    exchange takes a change. The splits the job ran reach, within a sample, the ones that
    equalise the step times (the equal fixed costs cancel): b0 = 4/5 of 256 = 204.8 before
    step 40, 4/7 of it = 146.3 after."""
    from replay import replay

    ran, config = changing_job(rule)
    assert abs(ran[39]["batch_sizes"][0] - 256 * 4 / 5) <= 1, ran[39]
    assert abs(ran[-1]["batch_sizes"][0] - 256 * 4 / 7) <= 1, ran[-1]
    assert replay([*ran, {"config": config}], 2, lag=0, min_batch=2).changes == [(45, [0])]


# Smoke runs of the benchmark scripts at their smallest sizes: a refactor that breaks one
# fails here. Where a script loops over methods, cases or launchers, the smallest run takes
# the ones whose code differs (a reference and a method compared with it, a plot's source;
# mpirun, the launcher that starts fastest); every training job costs 6-10 s of start here
# whatever its size (the imports of torch and torch._dynamo, horovodrun's own start), so
# these take 20-60 s each.
def script(name: str, *args, timeout: float = 240) -> str:
    """`python benchmarks/NAME ARGS` as a user runs it; its standard output."""
    done = subprocess.run([PYTHON, str(BENCHMARKS / name), *args], cwd=BENCHMARKS,
                          env=local_env(), capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    return done.stdout


@pytest.mark.processes
def test_replay_script_tells_a_job_it_replays_matches(tmp_path):
    ran, config = changing_job("model")
    path = tmp_path / "changing.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in [*ran, {"config": config}]))
    (row,) = table_rows(script("replay.py", str(path)), "changing")
    assert row[1] == "yes" and row[-1] == "45:0", row


@pytest.mark.processes
def test_fixed_costs_script_prints_every_rule_at_every_size():
    out = script("fixed_costs.py", "--workers", "8,16", "--adjustments", "12", "--events",
                 "6:leave=0.25")
    # 3 fixed costs x 2 spreads x 2 worker counts x 3 rules, then the event for 2 x 3.
    costs = [row for first in ("0", "0.05", "0.2") for row in table_rows(out, first)
             if len(row) == 9]
    assert len(costs) == 36 and {row[3] for row in costs} == {"p", "pid", "model"}, out
    events = [row for first in ("8", "16") for row in table_rows(out, first)]
    assert len(events) == 6 and all(row[2] == "at 6" for row in events), out


@pytest.mark.processes
def test_time_to_accuracy_script_times_both_batchings():
    out = script("time_to_accuracy.py", "--slowdowns", "1,4", "--repeats", "1", "--target",
                 "0.5")
    rows = table_rows(out, "1,4")
    assert [row[1] for row in rows] == ["static", "dynamic"], out
    assert all(float(row[3]) > 0 for row in rows), out


@pytest.mark.processes
def test_checkpoint_cost_script_times_writes_and_a_training_with_checkpoints():
    out = script("checkpoint_cost.py", "--models", "resnet18", "--writes", "1",
                 "--train-model", "cnn", "--steps", "6", "--every", "3")
    (written,) = table_rows(out, "resnet18")
    assert float(written[1]) == pytest.approx(11.7, abs=0.1), written   # ResNet-18's size
    runs = {row[0]: row for first in ("none", "every 3 steps") for row in table_rows(out, first)}
    assert runs["none"][1] == "0" and runs["every 3 steps"][1] == "2", out


@pytest.mark.processes
def test_settling_script_refuses_a_schedule_without_a_change():
    done = subprocess.run([PYTHON, str(BENCHMARKS / "settling.py"), "--schedules", "0:1,4"],
                          env=local_env(), capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "must change the factors at least once" in done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.processes
def test_abs_compare_script_puts_abs_sgd_beside_static_batching():
    out = script("abs_compare.py", "--scenarios", "static", "--methods", "static", "abs",
                 "--repeats", "1", "--epochs", "1", "--global-batch", "128")
    rows = table_rows(out, "static 1,4")
    assert [row[1] for row in rows] == ["static", "ABS-SGD (staleness: predict)"], out
    # One epoch of the 1,437 training digits: ceil(1437 / 128) = 12 steps, or windows of the
    # target batch; only ABS-SGD's windows have a share settled near it.
    assert [row[7] for row in rows] == ["12", "12"], out
    assert rows[0][-1] == "-" and rows[1][-1].endswith("%"), out


@pytest.mark.processes
def test_emulator_fidelity_script_measures_each_factor_alone_and_in_a_job():
    out = script("emulator_fidelity.py", "--models", "cnn", "--batches", "16", "--factors", "2",
                 "--repeats", "1")
    rows = table_rows(out, "cnn synthetic")
    assert [(row[1], row[2], row[3]) for row in rows] == [
        ("16", "1", "alone"), ("16", "2", "alone"), ("16", "1", "in a job"),
        ("16", "2", "in a job")], out
    # In a job the factor expected is the one asked for; alone, f (1 - u) + u, below it.
    assert [row[7] for row in rows[2:]] == ["1.00", "2.00"], out
    assert 1 < float(rows[1][7]) <= 2 and all(float(row[4]) > 0 for row in rows), out


@pytest.mark.processes
def test_settling_script_reports_real_ranks_the_cluster_model_and_its_drift():
    schedule = "0:1,4;10:4,1"
    out = script("settling.py", "--models", "linear", "--steps", "20", "--adjust-every", "5",
                 "--schedules", schedule, "--rules", "p", "--seeds", "2", "--global-batch",
                 "64")
    rows = table_rows(out, schedule)
    assert [row[1:3] for row in rows if len(row) == 12] == [
        ["linear (real ranks)", "p"], ["cluster model, 5% noise", "p"]], out
    assert [row[1] for row in rows if len(row) == 6] == ["p"], out


@pytest.mark.processes
def test_speedup_script_compares_static_and_dynamic_with_the_ideal():
    out = script("speedup.py", "--slowdowns", "1,4", "--steps", "8", "--model", "linear",
                 "--global-batch", "64")
    (row,) = table_rows(out, "1,4")
    assert row[4].endswith("x") and float(row[5].rstrip("x")) > 1, out
    assert sum(map(int, row[7].split(","))) == 64, out   # the final split holds the batch


@pytest.mark.processes
def test_matrix_script_runs_each_method_at_a_level_and_plots_it(tmp_path):
    out = script("matrix.py", "--levels", "HL2", "--methods", "static", "pid", "--epochs", "1",
                 "--plots", str(tmp_path), "--plot-levels", "HL2")
    rows = table_rows(out, "HL2")
    assert [(row[1], row[2]) for row in rows] == [("1,2", "static"), ("1,2", "dynamic pid")]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["matrix-HL2-pid.png",
                                                          "matrix-HL2.png"]


@pytest.mark.processes
def test_overhead_script_compares_each_loop_with_plain_horovod():
    out = script("overhead.py", "--repeats", "1", "--steps", "6", "--launches", "mpirun",
                 "--model", "linear", "--global-batch", "64")
    rows = table_rows(out, "mpirun")
    assert [row[1] for row in rows] == ["plain Horovod", "static", "dynamic"], out
    assert rows[0][4] == "+0.0%" and all(row[4].endswith("%") for row in rows[1:]), out
    assert all(int(row[6]) >= 1 for row in rows[1:]), out   # exchanges in the one job


@pytest.mark.processes
def test_imagenet_subset_script_trains_on_generated_folders_and_times_loading():
    out = script("imagenet_subset.py", "--model", "cnn", "--epochs", "1", "--loader-workers",
                 "1", "--loading-models", "cnn", "--loading-ranks", "1", "--loading-steps",
                 "4", "--photo-size", "64x48")
    assert [row[0] for row in table_rows(out, "static") + table_rows(out, "dynamic")] == \
        ["static", "dynamic"], out
    loading = table_rows(out, "cnn")
    assert [row[2] for row in loading] == ["decoded in the step", "decoded ahead by 1 workers",
                                           "synthetic (no loading)"], out
    assert loading[-1][5] == "0", out   # synthetic data is the no-loading reference


@pytest.mark.processes
def test_elastic_lr_script_runs_the_twin_and_a_job_that_grows():
    out = script("elastic_lr.py", "--rules", "smooth", "--seeds", "1", "--steps", "120",
                 "--change-at", "12", "--window", "5", timeout=300)
    rows = table_rows(out, "smooth")
    assert len(rows) == 2 and rows[0][1] == "0", out
    # The real job grew once it passed step 12, so its change comes later.
    assert int(rows[1][1]) > 12, out
