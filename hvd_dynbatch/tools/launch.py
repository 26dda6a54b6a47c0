"""Start a job of N ranks on this machine under horovodrun (Gloo or MPI) or mpirun.

The demo, the benchmarks and the tests all launch through here, so the flags that one machine
needs (Open MPI's root and oversubscription switches, one compute thread per rank, the loopback
interface for Gloo) are written once. On a cluster, users call horovodrun, mpirun or srun
themselves; see the README.
"""
from __future__ import annotations

import enum
import json
import os
import shutil
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Optional, Sequence

from ..errors import LaunchError


class Launcher(str, enum.Enum):
    """How the ranks are started."""

    GLOO = "gloo"      # horovodrun --gloo
    MPI = "mpi"        # horovodrun --mpi
    MPIRUN = "mpirun"  # Open MPI's mpirun directly


def _tool(name: str) -> str:
    """The launcher beside this Python (the project's virtual environment) or on PATH."""
    beside = Path(sys.executable).parent / name
    if beside.exists():
        return str(beside)
    found = shutil.which(name)
    if found is None:
        raise LaunchError(f"'{name}' was not found; run the set-up (make setup) first")
    return found


def local_command(launcher: Launcher, np: int, argv: Sequence[str], *,
                  elastic_discovery: Optional[str] = None, min_np: Optional[int] = None,
                  max_np: Optional[int] = None) -> list:
    """The command line that runs `argv` as `np` ranks on localhost.

    With `elastic_discovery` (a host-discovery script) the job is a Horovod elastic job, which
    is Gloo-only; `min_np` and `max_np` bound its size.
    """
    if np < 1:
        raise LaunchError(f"the number of ranks must be at least 1, got {np}")
    launcher = Launcher(launcher)
    if launcher is Launcher.MPIRUN:
        if elastic_discovery:
            raise LaunchError("elastic jobs run under horovodrun (Gloo), not mpirun")
        return [_tool("mpirun"), "-np", str(np), "--oversubscribe", "--bind-to", "none", *argv]
    cmd = [_tool("horovodrun"), "-np", str(np)]
    if elastic_discovery:
        if launcher is not Launcher.GLOO:
            raise LaunchError("Horovod elastic runs on Gloo only: use the gloo launcher")
        # On one machine the elastic driver hangs without an explicit interface.
        cmd += ["--host-discovery-script", elastic_discovery, "--network-interface", "lo"]
        if min_np is not None:
            cmd += ["--min-np", str(min_np)]
        if max_np is not None:
            cmd += ["--max-np", str(max_np)]
    else:
        cmd += ["-H", f"localhost:{np}"]
    cmd.append("--gloo" if launcher is Launcher.GLOO else "--mpi")
    return [*cmd, *argv]


def local_env(threads_per_rank: int = 1, extra: Optional[Mapping[str, str]] = None) -> dict:
    """The environment for local ranks: Open MPI allowed as root, a fixed number of threads."""
    env = dict(os.environ)
    env.update({
        "OMPI_ALLOW_RUN_AS_ROOT": "1",
        "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
        # More ranks than cores is normal here (3 ranks on 2 cores).
        "OMPI_MCA_rmaps_base_oversubscribe": "1",
        # A rank waiting in MPI yields its core instead of spinning; with as many ranks as
        # cores, spinning slowed the other rank's compute by about half (85 vs 54 ms a step).
        "OMPI_MCA_mpi_yield_when_idle": "1",
        "OMP_NUM_THREADS": str(threads_per_rank),
        "PYTHONUNBUFFERED": "1",
    })
    if extra:
        env.update(extra)
    return env


@dataclass
class JobResult:
    """What a local job left: its exit code, its output, and whether it ran out of time."""

    returncode: int
    stdout: str
    stderr: str
    timed_out: bool


def start_local(launcher: Launcher, np: int, argv: Sequence[str], *, capture: bool = True,
                log: Optional[str] = None, env: Optional[Mapping[str, str]] = None,
                cwd: Optional[str] = None, **elastic) -> subprocess.Popen:
    """Start `argv` as `np` local ranks and return the launcher's process at once.

    The job's output is captured (`capture`), written to the file `log`, or else inherited.
    A long job with much output should use `log`: captured output is only read at the end.
    """
    if log is not None:
        output = open(log, "a", encoding="utf-8")
    else:
        output = subprocess.PIPE if capture else None
    try:
        return subprocess.Popen(
            local_command(launcher, np, argv, **elastic), env=local_env(extra=env), cwd=cwd,
            start_new_session=True, text=True, stdin=subprocess.DEVNULL, stdout=output,
            stderr=subprocess.STDOUT if log is not None else output)
    finally:
        if log is not None:
            output.close()


def wait_local(proc: subprocess.Popen, timeout: float) -> JobResult:
    """Wait at most `timeout` seconds for a job from `start_local`.

    On time-out the launcher and all its descendants are killed (Horovod starts ranks in
    process groups of their own, so killing the launcher's group alone is not enough): no rank
    outlives the call.
    """
    try:
        out, err = proc.communicate(timeout=timeout)
        timed_out = False
    except subprocess.TimeoutExpired:
        kill_tree(proc.pid)
        out, err = proc.communicate()
        timed_out = True
    except BaseException:
        kill_tree(proc.pid)
        raise
    return JobResult(proc.returncode, out or "", err or "", timed_out)


def run_local(launcher: Launcher, np: int, argv: Sequence[str], *, timeout: float,
              **options) -> JobResult:
    """Run `argv` as `np` local ranks and wait at most `timeout` seconds for the result."""
    return wait_local(start_local(launcher, np, argv, **options), timeout)


def json_records(text: str) -> list:
    """Every JSON object that ends a line of a job's output.

    Launchers prefix rank output differently ("[0]<stdout>:" under Gloo, "[1,0]<stdout>:"
    under horovodrun --mpi, nothing under mpirun), so each object is taken from the first
    "{" of its line.
    """
    records = []
    for line in text.splitlines():
        start = line.find("{")
        if start < 0:
            continue
        try:
            value = json.loads(line[start:])
        except ValueError:
            continue
        if isinstance(value, dict):
            records.append(value)
    return records


def kill_tree(pid: int) -> None:
    """SIGKILL a process and every process below it."""
    import psutil

    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return
    for p in procs:
        try:
            p.send_signal(signal.SIGKILL)
        except psutil.NoSuchProcess:
            pass
