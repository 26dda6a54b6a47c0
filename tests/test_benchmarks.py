"""Smoke runs of the benchmark scripts that users run on their own clusters: they start and
report what they promise (figures are the benchmarks' business, not the tests')."""
import subprocess
import sys
from pathlib import Path

from hvd_dynbatch.tools.launch import Launcher, local_env
from launcher import PYTHON, run_ranks

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"


def test_throughput_runs_as_ranks_of_an_mpirun_job():
    job = run_ranks(Launcher.MPIRUN, 2, [
        PYTHON, str(BENCHMARKS / "throughput.py"), "--model", "linear", "--steps", "6",
        "--global-batch", "32", "--slowdown", "1,3"], timeout=180)
    assert job.returncode == 0, job.explain()
    [report] = job.records
    assert report["world_size"] == 2 and sum(report["final_split"]) == 32
    assert len(report["rank_samples_per_sec"]) == 2 and min(report["rank_samples_per_sec"]) > 0
    assert report["steady_samples_per_sec"] > 0


def test_make_imagefolder_writes_a_trainable_folder(tmp_path):
    out = subprocess.run([sys.executable, str(BENCHMARKS / "make_imagefolder.py"), str(tmp_path),
                          "--classes", "3", "--train-per-class", "4", "--val-per-class", "2"],
                         env=local_env(), capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert len(list((tmp_path / "train").glob("class0*/*.jpg"))) == 12
    assert sorted(p.name for p in (tmp_path / "val").iterdir()) == ["class00", "class01",
                                                                   "class02"]
