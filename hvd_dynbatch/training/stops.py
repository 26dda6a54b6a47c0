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
import select
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
    elsewhere nothing is installed.

    Python runs a signal's handler in the main thread only once that thread is back in
    Python, which a blocking call (a wait in Horovod, a long kernel) can put off; so the
    signals also reach the watcher thread at once, through the wakeup file descriptor that
    CPython's C-level handler writes each signal's number to."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    reader, writer = os.pipe()
    os.set_blocking(writer, False)
    watcher = _Watcher(request, launcher_chain(), reader)
    interrupted = []

    def handler(signum, frame):
        if signum == signal.SIGINT:
            if interrupted:
                raise KeyboardInterrupt
            interrupted.append(signum)

    previous = {sig: signal.signal(sig, handler)
                for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGCONT)}
    previous_fd = signal.set_wakeup_fd(writer, warn_on_full_buffer=False)
    watcher.start()
    try:
        yield
    finally:
        signal.set_wakeup_fd(previous_fd)
        for sig, old in previous.items():
            signal.signal(sig, old)
        watcher.stop()
        os.close(reader)
        os.close(writer)


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
    """A daemon thread that reads the signals' numbers from `signals` (a pipe's read end)
    and looks at least every `TICK` seconds: at the launcher's processes (gone: a notice)
    and at a SIGCONT (a notice unless the process had been stopped, which shows as a late
    tick). The first notice goes to `request`; later ones are dropped."""

    def __init__(self, request: Callable[[str], None], chain, signals: int):
        super().__init__(name="hvd-dynbatch-stop-notices", daemon=True)
        self._request, self._chain, self._signals = request, chain, signals
        self._done = threading.Event()
        self._asked = False
        self._resumed = -float("inf")  # when the last stall ended

    def stop(self) -> None:
        self._done.set()
        self.join()

    def _ask(self, reason: str) -> None:
        if not self._asked:
            self._asked = True
            self._request(reason)

    def run(self) -> None:
        before, ticks = time.monotonic(), 0
        while not self._done.is_set():
            ready, _, _ = select.select([self._signals], [], [], TICK)
            now = time.monotonic()
            if now - before > STALL:
                self._resumed = now
            for number in os.read(self._signals, 64) if ready else b"":
                # This thread was stopped too: a stall ends at the latest where it reads the
                # SIGCONT that ended it.
                if number == signal.SIGCONT and now - self._resumed > STALL:
                    self._ask("SIGCONT to this rank (Open MPI's notice that it kills the job)")
                elif number in (signal.SIGTERM, signal.SIGINT):
                    self._ask(f"{signal.Signals(number).name} to this rank")
            if now - before >= TICK:
                before, ticks = now, ticks + 1
                if self._chain and ticks % LOOK_EVERY == 0:
                    gone = self._gone()
                    if gone is not None:
                        self._ask(f"the end of this rank's launcher ({gone})")
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
