"""A one-node Slurm cluster on localhost for the tests: munged, slurmctld and slurmd started
as root without systemd, everything (configuration, state, spool, logs, munge's key and
socket) in one scratch folder, on free ports, torn down by PID.

Jobs are watched by polling `scontrol show job` with a deadline, never with `sbatch --wait`,
so a job that hangs fails its test instead of the suite.
"""
from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

PACKAGES = ("slurmd", "slurmctld", "slurm-client", "munge")
ENDED = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "PREEMPTED",
         "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE"}

CONFIG = """\
ClusterName=hvdtest
SlurmctldHost=localhost(127.0.0.1)
SlurmctldPort={ctld_port}
SlurmdPort={slurmd_port}
CommunicationParameters=NoCtldInAddrAny,NoInAddrAny
AuthType=auth/munge
AuthInfo=socket={dir}/munge/munge.socket
CredType=cred/munge
SlurmUser=root
SlurmdUser=root
StateSaveLocation={dir}/state
SlurmdSpoolDir={dir}/spool
SlurmctldPidFile={dir}/slurmctld.pid
SlurmdPidFile={dir}/slurmd.pid
SlurmctldLogFile={dir}/slurmctld.log
SlurmdLogFile={dir}/slurmd.log
TmpFS={dir}/tmp
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
EnforcePartLimits=ALL
ReturnToService=2
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
KillWait=30
MinJobAge=600
NodeName=localhost NodeAddr=127.0.0.1 CPUs={cpus} State=UNKNOWN
PartitionName=debug Nodes=localhost Default=YES MaxTime=INFINITE State=UP
"""


class SlurmError(RuntimeError):
    """The cluster could not be set up, or a job did not do what was asked in time."""


def missing() -> list:
    """The Slurm and munge programs this machine lacks."""
    return [p for p in ("munged", "slurmctld", "slurmd", "sbatch", "scontrol")
            if shutil.which(p) is None]


def _free_ports(count: int) -> list:
    sockets = [socket.socket() for _ in range(count)]
    for s in sockets:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    return ports


class Cluster:
    """The running cluster; `env` is the environment its clients (sbatch, scontrol) need."""

    def __init__(self, folder: Path, cpus: int):
        self.dir = folder
        for sub in ("state", "spool", "tmp", "munge"):
            (folder / sub).mkdir(parents=True)
        ctld_port, slurmd_port = _free_ports(2)
        self.conf = folder / "slurm.conf"
        self.conf.write_text(CONFIG.format(dir=folder, ctld_port=ctld_port,
                                           slurmd_port=slurmd_port, cpus=cpus))
        self.env = {**os.environ, "SLURM_CONF": str(self.conf)}
        self._daemons = []

    def start(self, timeout: float = 30) -> "Cluster":
        munge = self.dir / "munge"
        key = munge / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        munge.chmod(0o700)
        self._daemon(["munged", "--foreground", "--force", f"--key-file={key}",
                      f"--socket={munge}/munge.socket", f"--pid-file={munge}/munged.pid",
                      f"--log-file={munge}/munged.log", f"--seed-file={munge}/munged.seed"],
                     "munged")
        self._wait_for(lambda: (munge / "munge.socket").exists(), timeout, "munged's socket")
        self._daemon(["slurmctld", "-D", "-i", "-f", str(self.conf)], "slurmctld")
        self._daemon(["slurmd", "-D", "-N", "localhost", "-f", str(self.conf)], "slurmd")
        self._wait_for(lambda: self.node_state() == "idle", timeout, "the node to be idle")
        return self

    def _daemon(self, argv: list, name: str) -> None:
        log = open(self.dir / f"{name}.out", "w")
        self._daemons.append(subprocess.Popen(argv, env=self.env, stdout=log,
                                              stderr=subprocess.STDOUT,
                                              start_new_session=True))

    def _wait_for(self, ready, timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while not ready():
            dead = [p.args[0] for p in self._daemons if p.poll() is not None]
            if dead or time.monotonic() > deadline:
                raise SlurmError(f"waited {timeout:.0f} s for {what}; "
                                 f"{'ended: ' + ', '.join(dead) if dead else 'still waiting'}"
                                 f"\n{self.logs()}")
            time.sleep(0.2)

    def logs(self) -> str:
        """The tail of every daemon's log, for a failing test's message."""
        out = []
        for log in sorted(self.dir.glob("*.log")) + sorted(self.dir.glob("*.out")):
            out.append(f"--- {log.name}\n" + "\n".join(log.read_text().splitlines()[-15:]))
        return "\n".join(out)

    def run(self, argv: list, **kwargs) -> subprocess.CompletedProcess:
        return subprocess.run(argv, env=self.env, capture_output=True, text=True,
                              timeout=60, **kwargs)

    def node_state(self) -> str:
        done = self.run(["sinfo", "-h", "-N", "-o", "%T"])
        return done.stdout.strip().rstrip("*~#") if done.returncode == 0 else ""

    def submit(self, argv: list, cwd: Path) -> int:
        """`sbatch --parsable ARGV` from `cwd`; the job's id."""
        done = self.run(["sbatch", "--parsable", *argv], cwd=cwd)
        if done.returncode != 0:
            raise SlurmError(f"sbatch {' '.join(map(str, argv))} failed: {done.stderr}")
        return int(done.stdout.strip().split(";")[0])

    def job(self, job_id: int) -> dict:
        """`scontrol show job` as a dict (JobState, RestartCnt, ExitCode, ...)."""
        done = self.run(["scontrol", "show", "-o", "job", str(job_id)])
        if done.returncode != 0:
            raise SlurmError(f"scontrol show job {job_id}: {done.stderr}")
        return dict(re.findall(r"(\w+)=(\S*)", done.stdout))

    def wait(self, job_id: int, states, timeout: float) -> dict:
        """Poll job `job_id` until its state is one of `states`; its record then."""
        deadline = time.monotonic() + timeout
        while True:
            record = self.job(job_id)
            if record["JobState"] in states:
                return record
            if time.monotonic() > deadline:
                raise SlurmError(f"job {job_id} is {record['JobState']} after {timeout:.0f} s,"
                                 f" not {'/'.join(sorted(states))}\n{self.logs()}")
            time.sleep(0.5)

    def stop(self, timeout: float = 60) -> None:
        """Cancel every job and wait for the jobs to go (slurmd ends their processes), then
        end the daemons (and whatever they started) by PID."""
        self.run(["scancel", "--user=root"])
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            listed = self.run(["squeue", "-h", "-t", "all", "-o", "%T"]).stdout.split()
            if not set(listed) - ENDED:
                break
            time.sleep(0.5)
        for process in reversed(self._daemons):
            try:
                os.killpg(process.pid, signal.SIGTERM)
            except ProcessLookupError:
                continue
        for process in self._daemons:
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
