"""How a rank learns that its job is being stopped, so that it can stop with a checkpoint.

Three notices, each turned into one call of `request(reason)` (the trainer asks every rank to
stop at the end of the step under way, see `batching.StepExchange`):

- SIGTERM and SIGINT to this rank (Slurm's notice before it kills a job, Ctrl-C, a launcher
  passing a signal on). A second SIGINT interrupts at once.
- SIGCONT from an Open MPI launcher: signalled, mpirun sends its ranks SIGCONT, SIGTERM one
  second later and SIGKILL one more second later (`odls_base_sigkill_timeout`), so the SIGCONT
  is the first notice and doubles the time left. A SIGCONT that ends a real stop (Ctrl-Z then
  `fg`, Slurm's suspend and resume) is told apart by the stall before it and ignored.
- The end of the launcher: a launcher that dies or is killed (SIGTERM to `horovodrun --mpi`
  ends it and leaves `mpirun` and the ranks running, unseen) is seen within half a second.
  The processes watched are this rank's ancestors up to the outermost launcher among them
  (horovodrun, mpirun, srun, ...); a rank started by none (a plain process) watches nothing.
"""
from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from typing import Callable, List, Optional, Tuple

LAUNCHERS = {"horovodrun", "mpirun", "mpiexec", "orterun", "prterun", "srun", "slurmstepd"}
TICK = 0.1            # seconds between the watcher's looks
STALL = 1.0           # a tick this much late means the process was stopped
LOOK_EVERY = 5        # ticks between looks at the launcher's processes


@contextlib.contextmanager
def stop_notices(request: Callable[[str], None]):
    """Call `request(reason)` once, on the first notice that the job is being stopped (see
    the module docstring), while the block runs. Signal handlers need the main thread;
    elsewhere nothing is installed."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    watcher = _Watcher(request, launcher_chain())
    asked = []

    def handler(signum, frame):
        if signum == signal.SIGINT and asked:
            raise KeyboardInterrupt
        if signum == signal.SIGCONT:
            watcher.continued = time.monotonic()
            return
        asked.append(signum)
        watcher.ask(f"{signal.Signals(signum).name} to this rank")

    previous = {sig: signal.signal(sig, handler)
                for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGCONT)}
    watcher.start()
    try:
        yield
    finally:
        watcher.stop()
        for sig, old in previous.items():
            signal.signal(sig, old)


def launcher_chain(pid: Optional[int] = None) -> List[Tuple[int, float, str]]:
    """The ancestors of process `pid` (this one) up to the outermost launcher among them, as
    (pid, start time, name); empty where no launcher started it."""
    import psutil

    chain, last = [], 0
    try:
        for parent in psutil.Process(pid).parents():
            name = _launcher_name(parent.cmdline()) or parent.name()
            chain.append((parent.pid, parent.create_time(), name))
            if name in LAUNCHERS:
                last = len(chain)
    except psutil.Error:
        pass
    return chain[:last]


def _launcher_name(cmdline: List[str]) -> Optional[str]:
    """The launcher a command line runs, if any: `mpirun ...`, `python .../horovodrun ...`,
    or `sh -c 'mpirun ...'` (what horovodrun --mpi execs into)."""
    words = cmdline[:2]
    if len(cmdline) >= 3 and cmdline[1] == "-c":
        words = cmdline[2].split()[:1]
    for word in words:
        name = os.path.basename(word)
        if name in LAUNCHERS:
            return name
    return None


class _Watcher(threading.Thread):
    """A daemon thread that looks every `TICK` seconds: at the launcher's processes (gone:
    a notice) and at a SIGCONT the handler noted (a notice unless the process had been
    stopped). `ask` passes the first notice on; later ones are dropped."""

    def __init__(self, request: Callable[[str], None], chain):
        super().__init__(name="hvd-dynbatch-stop-notices", daemon=True)
        self._request, self._chain = request, chain
        self._done = threading.Event()
        self._asked = False
        self.continued = None         # when a SIGCONT came, until the watcher has judged it
        self._resumed = -float("inf")  # when the last stall ended

    def ask(self, reason: str) -> None:
        if not self._asked:
            self._asked = True
            self._request(reason)

    def stop(self) -> None:
        self._done.set()

    def run(self) -> None:
        before, ticks = time.monotonic(), 0
        while not self._done.wait(TICK):
            now = time.monotonic()
            if now - before > STALL:
                self._resumed = now
            before, ticks = now, ticks + 1
            continued = self.continued
            # Judged a tick later, so that a stall's end is seen whichever came first.
            if continued is not None and now - continued >= TICK:
                self.continued = None
                if abs(self._resumed - continued) > STALL:
                    self.ask("SIGCONT to this rank (Open MPI's notice that it kills the job)")
            if self._chain and ticks % LOOK_EVERY == 0:
                gone = self._gone()
                if gone is not None:
                    self.ask(f"the end of this rank's launcher ({gone})")
                    self._chain = []

    def _gone(self) -> Optional[str]:
        """The first watched process that has ended, as 'name, pid N', or None."""
        import psutil

        for pid, started, name in self._chain:
            try:
                process = psutil.Process(pid)
                if process.create_time() == started and \
                        process.status() != psutil.STATUS_ZOMBIE:
                    continue
            except psutil.NoSuchProcess:
                pass
            return f"{name}, pid {pid}"
        return None
