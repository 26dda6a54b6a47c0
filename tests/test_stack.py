"""The stack under each launcher: Horovod's world, mpi4py's world, the exchange, failures, and
the weighted optimizer as a user's script calls it."""
import subprocess
import time
from pathlib import Path

import pytest

from hvd_dynbatch.tools.launch import Launcher
from launcher import CLI, PYTHON, run_ranks

pytestmark = pytest.mark.processes

SCRIPTS = Path(__file__).parent / "scripts"


def test_package_imports_without_starting_horovod():
    code = ("import sys, hvd_dynbatch; "
            "assert 'horovod' not in sys.modules and 'mpi4py' not in sys.modules; "
            "print(hvd_dynbatch.__version__)")
    out = subprocess.run([PYTHON, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip()


@pytest.mark.parametrize("launcher, np, on_mpi, backend", [
    (Launcher.GLOO, 2, False, "horovod"),
    (Launcher.MPI, 2, True, "mpi4py"),
    (Launcher.MPIRUN, 3, True, "mpi4py"),
])
def test_world_seen_by_each_rank(launcher, np, on_mpi, backend):
    job = run_ranks(launcher, np, [*CLI, "check"], timeout=120)
    assert job.returncode == 0, job.explain()
    ranks = job.by_rank()
    assert sorted(ranks) == list(range(np)), job.explain()
    for rank, rec in ranks.items():
        assert rec["size"] == np
        assert rec["horovod_on_mpi"] is on_mpi
        assert rec["allreduce_sum_of_ranks"] == sum(range(np))
        assert rec["exchange_backend"] == backend
        assert rec["allgathered_ranks"] == list(range(np))
        if on_mpi:
            # mpi4py's world is Horovod's world, rank for rank.
            assert (rec["mpi_world_size"], rec["mpi_world_rank"]) == (np, rank)
        else:
            # Under Gloo every process is an MPI singleton.
            assert (rec["mpi_world_size"], rec["mpi_world_rank"]) == (1, 0)


@pytest.mark.parametrize("launcher, backend", [
    (Launcher.GLOO, "horovod"),
    (Launcher.MPI, "mpi4py"),
    (Launcher.MPIRUN, "mpi4py"),
])
def test_exchange_gather_runs_while_the_caller_works(launcher, backend):
    # The timing exchange starts its gather when backward ends and asks for it after the
    # gradients' allreduce: the gather must come out right with an allreduce in between,
    # and must not wait for the caller to ask (rank 0 holds its result back for 2 s).
    job = run_ranks(launcher, 2, [PYTHON, str(SCRIPTS / "gather_beside.py")], timeout=120)
    assert job.returncode == 0, job.explain()
    ranks = job.by_rank()
    assert sorted(ranks) == [0, 1], job.explain()
    for rec in ranks.values():
        assert rec["backend"] == backend
        assert rec["rows"] == [[0.0, 0.0], [1.0, 10.0]]
        assert rec["allreduce_total"] == 1000.0
        assert rec["late_rows"] == [0.0, 1.0]
    assert ranks[0]["waited"] >= ranks[0]["hold"]
    assert ranks[1]["waited"] < ranks[0]["hold"] / 2, job.explain()


@pytest.mark.parametrize("launcher", list(Launcher))
def test_failing_rank_ends_the_job(launcher):
    start = time.monotonic()
    job = run_ranks(launcher, 2, [PYTHON, str(SCRIPTS / "fail_rank.py")], timeout=90)
    assert not job.job.timed_out, f"the launcher hung after a rank failed\n{job.explain()}"
    assert job.returncode != 0, job.explain()
    assert time.monotonic() - start < 90


def test_the_weighted_optimizer_gives_the_whole_batch_step_however_horovod_reduces():
    # Ranks of 3 and 9 samples against one step of all 12, with the allreduce started per
    # gradient, in groups, after two backward passes and for a sparse gradient; and a NaN on
    # one rank skips the step on both.
    job = run_ranks(Launcher.GLOO, 2, [PYTHON, str(SCRIPTS / "weighted_step.py")], timeout=120)
    assert job.returncode == 0 and job.records, job.explain()
    report = job.records[-1]
    for case in ("per gradient", "groups", "two passes", "sparse"):
        assert report[case]["difference"] < 1e-6, (case, report)
    assert report["nan"] == {"skipped": True, "unchanged": True}
