import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

# The helpers in tests/ (launcher.py) are imported as plain modules.
sys.path.insert(0, str(Path(__file__).parent))

# Every test trains on the CPU, also on a GPU machine, unless it is marked `gpu`: on a node
# with one GPU the default --device auto would give rank 1 of a launched job a GPU that is not
# there, and exact comparisons with CPU replays hold on the CPU. The processes the tests start
# see no GPU; this process's GPUs are counted first (CUDA reads CUDA_VISIBLE_DEVICES once, as
# it starts), so a `gpu` test still has them, and hands them to its processes
# (launcher.gpu_env). In this process a test not marked `gpu` sees torch.cuda.is_available()
# false (`_cpu_unless_marked_gpu`).
GPUS = torch.cuda.device_count()
HAVE_GPU = GPUS > 0
os.environ["HVD_DYNBATCH_TEST_GPUS"] = os.environ.get("CUDA_VISIBLE_DEVICES",
                                                      ",".join(map(str, range(GPUS))))
os.environ["CUDA_VISIBLE_DEVICES"] = ""


@pytest.fixture(autouse=True)
def _cpu_unless_marked_gpu(request, monkeypatch):
    if not request.node.get_closest_marker("gpu"):
        monkeypatch.setattr(torch.cuda, "is_available", lambda: False)


@pytest.fixture(scope="session")
def slurm_cluster(tmp_path_factory):
    """A one-node Slurm cluster on localhost for the session (see tests/slurm.py); the set-up
    of `make test` installs its packages, and a machine without them fails here, not skips."""
    from hvd_dynbatch.tools.launch import local_env
    from slurm import PACKAGES, Cluster, missing

    absent = missing()
    if absent:
        pytest.fail(f"Slurm is not installed here ({', '.join(absent)} missing): run "
                    f"'make test', whose set-up installs {' '.join(PACKAGES)}", pytrace=False)
    cluster = Cluster(tmp_path_factory.mktemp("slurm"), cpus=os.cpu_count() or 2)
    cluster.env.update(local_env())
    cluster.env["SLURM_CONF"] = str(cluster.conf)
    cluster.start()
    yield cluster
    cluster.stop()


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "gpu: the test needs a CUDA GPU and runs on it (it skips without one); "
                   "every other test trains on the CPU")
    config.addinivalue_line(
        "markers", "processes: the test starts processes (a launcher's ranks, the "
                   "hvd-dynbatch command, a script); `make check` runs every test without it")
    # On a machine where it has never run, matplotlib builds its font cache on first use by
    # running fc-list: built here, before the guard below, which would refuse it in the
    # plotting tests.
    import matplotlib.font_manager  # noqa: F401


def pytest_collection_modifyitems(config, items):
    if HAVE_GPU:
        return
    for item in items:
        if item.get_closest_marker("gpu"):
            item.add_marker(pytest.mark.skip(reason="needs a CUDA GPU"))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """A test that starts a process must say so (`@pytest.mark.processes`), so that the
    unmarked tests, which `make check` runs, stay in this one process and take seconds. The
    guard covers the fixtures the test sets up too."""
    if item.get_closest_marker("processes"):
        yield
        return

    def refuse(self, args, *rest, **kwargs):
        raise AssertionError(f"{item.nodeid} starts a process ({args!r}) but is not marked "
                             f"@pytest.mark.processes")

    start = subprocess.Popen._execute_child
    subprocess.Popen._execute_child = refuse
    try:
        yield
    finally:
        subprocess.Popen._execute_child = start
