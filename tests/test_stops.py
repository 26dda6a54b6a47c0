"""How a rank learns that its job is being stopped (training/stops.py): signals, Open MPI's
SIGCONT notice (and a SIGCONT that only ends a real stop), and its launcher's end. The
launched jobs stopped these ways are in test_checkpoint.py."""
import os
import select
import signal
import subprocess
import sys
import textwrap
import time

import psutil
import pytest

from hvd_dynbatch.training import stops
from hvd_dynbatch.training.stops import _launcher_name, launcher_chain, stop_notices


def wait_for(reasons: list, count: int = 1, timeout: float = 2.0) -> list:
    deadline = time.monotonic() + timeout
    while len(reasons) < count and time.monotonic() < deadline:
        time.sleep(0.01)
    return reasons


@pytest.mark.parametrize("cmdline, name", [
    (["/usr/bin/mpirun", "-np", "2", "python", "x.py"], "mpirun"),
    (["/venv/bin/python", "/venv/bin/horovodrun", "-np", "2"], "horovodrun"),
    (["/bin/sh", "-c", "mpirun --allow-run-as-root -np 2 python x.py"], "mpirun"),
    (["srun", "--mpi=pmix", "python"], "srun"),
    (["slurmstepd: [12.0]"], None),
    (["/bin/bash", "train.sh"], None),
    (["python", "-m", "hvd_dynbatch", "train"], None),
    ([], None),
])
def test_a_launcher_is_named_by_what_its_command_runs(cmdline, name):
    assert _launcher_name(cmdline) == name


def test_a_process_no_launcher_started_watches_nothing():
    # pytest runs under a shell or CI's runner, no launcher among them.
    assert launcher_chain() == []


def test_the_first_signal_asks_once_and_a_second_sigint_interrupts():
    reasons = []
    with stop_notices(reasons.append):
        os.kill(os.getpid(), signal.SIGINT)
        os.kill(os.getpid(), signal.SIGTERM)
        assert wait_for(reasons) == ["SIGINT to this rank"]
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(1)
    time.sleep(0.2)
    assert reasons == ["SIGINT to this rank"]
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL   # handlers given back


def test_a_sigcont_while_running_is_open_mpis_notice():
    reasons = []
    with stop_notices(reasons.append):
        os.kill(os.getpid(), signal.SIGCONT)
        assert wait_for(reasons) == [
            "SIGCONT to this rank (Open MPI's notice that it kills the job)"]


def test_the_end_of_a_watched_launcher_is_a_notice(monkeypatch):
    """A chain whose outer process has ended (a pid that is not there): a notice within a
    second; one whose processes all live (this one): none."""
    reasons = []
    monkeypatch.setattr(stops, "launcher_chain", lambda: [
        (os.getpid(), psutil.Process().create_time(), "python"),
        (2 ** 22 + 7, 0.0, "mpirun")])
    with stop_notices(reasons.append):
        assert wait_for(reasons) == [f"the end of this rank's launcher (mpirun, pid {2 ** 22 + 7})"]
    reasons.clear()
    monkeypatch.setattr(stops, "launcher_chain", lambda: [
        (os.getpid(), psutil.Process().create_time(), "mpirun")])
    with stop_notices(reasons.append):
        time.sleep(stops.TICK * stops.LOOK_EVERY * 2.5)
    assert reasons == []


CHILD = textwrap.dedent("""
    import sys, time
    from hvd_dynbatch.training.stops import stop_notices
    with stop_notices(lambda reason: print(reason, flush=True)):
        print("ready", flush=True)
        time.sleep(30)
""")


@pytest.mark.processes
def test_a_sigcont_that_ends_a_real_stop_is_no_notice():
    """Ctrl-Z then fg, or Slurm's suspend and resume: SIGSTOP, seconds, SIGCONT. The child
    says nothing; a SIGCONT afterwards, while it runs, is a notice again."""
    child = subprocess.Popen([sys.executable, "-c", CHILD], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline() == "ready\n"
        child.send_signal(signal.SIGSTOP)
        time.sleep(2 * stops.STALL)
        child.send_signal(signal.SIGCONT)
        said, _, _ = select.select([child.stdout], [], [], 1.0)
        assert not said, child.stdout.readline()
        child.send_signal(signal.SIGCONT)
        assert child.stdout.readline().startswith("SIGCONT to this rank")
    finally:
        child.kill()
        child.wait()
