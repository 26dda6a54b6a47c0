"""Stopping a job as users do, many times: does every trial end with nothing lost?

Jobs of 2 ranks (the MLP on the digits, the ranks emulated slow so that a step takes
`--slowdown`'s time) under `horovodrun --mpi`, `horovodrun --gloo` and `mpirun`, each stopped
after a few steps by Ctrl-C (SIGINT to the launcher's process group, as a terminal sends
it) or by SIGTERM to the launcher. A trial is good when every rank printed its stop line at
one step, the checkpoint of that step is on disk, the launcher exited non-zero and no
process of the job is left 30 s later. The suite runs each case twice
(tests/test_checkpoint.py); this runs `--trials` of each, enough to catch a failure in 5.

    python benchmarks/stops.py [--trials 8] [--slowdown 30,90]
"""
from __future__ import annotations

import argparse
import os
import signal
import sys
import tempfile
import time
from pathlib import Path

import psutil
from common import print_report

from hvd_dynbatch.tools.launch import Launcher, start_local, wait_local

LAUNCHERS = {"horovodrun --mpi": Launcher.MPI, "horovodrun --gloo": Launcher.GLOO,
             "mpirun": Launcher.MPIRUN}


def trial(launcher: Launcher, action: str, slowdown: str, folder: Path) -> dict:
    """One job, stopped by `action` ("ctrl-c" or "sigterm") after 8 steps; what it left."""
    folder.mkdir(parents=True)
    ckpt, metrics, log = folder / "ckpt", folder / "m.jsonl", folder / "log"
    argv = [sys.executable, "-m", "hvd_dynbatch", "train", "--model", "mlp", "--dataset",
            "digits", "--global-batch", "64", "--max-steps", "400", "--epochs", "50",
            "--adjust-every", "2", "--no-progress", "--checkpoint-dir", str(ckpt),
            "--checkpoint-every", "1000", "--metrics", str(metrics), "--slowdown", slowdown]
    proc = start_local(launcher, 2, argv, log=str(log))
    deadline = time.monotonic() + 120
    while _steps(metrics) < 8 and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.1)
    signalled = time.monotonic()
    if action == "ctrl-c":
        os.killpg(proc.pid, signal.SIGINT)
    else:
        proc.send_signal(signal.SIGTERM)
    status = wait_local(proc, 60).returncode
    while _left(ckpt) and time.monotonic() < signalled + 30:
        time.sleep(0.1)
    ended = time.monotonic() - signalled
    left = _left(ckpt)
    for p in left:
        p.kill()
    lines = [line for line in log.read_text().splitlines() if "error: stopped by" in line]
    steps = {line.split(" at step ")[1].split()[0] for line in lines}
    saved = sorted(p.name for p in ckpt.glob("checkpoint-*.pt"))
    good = (len(lines) == 2 and len(steps) == 1 and status != 0 and not left and
            saved == [f"checkpoint-{int(next(iter(steps))):09d}.pt"])
    return {"good": good, "status": status, "lines": len(lines), "left": len(left),
            "seconds": ended, "checkpoint": bool(saved)}


def _steps(metrics: Path) -> int:
    try:
        return sum('"batch_sizes"' in line for line in metrics.read_text().splitlines())
    except FileNotFoundError:
        return 0


def _left(ckpt: Path) -> list:
    return [p for p in psutil.process_iter(["cmdline", "status"])
            if str(ckpt) in " ".join(p.info["cmdline"] or [])
            and p.info["status"] != psutil.STATUS_ZOMBIE]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=8)
    parser.add_argument("--slowdown", default="30,90",
                        help="Emulated slowdown of the 2 ranks (30,90: steps of about 0.3 s).")
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, launcher in LAUNCHERS.items():
            for action in ("ctrl-c", "sigterm"):
                results = []
                for k in range(args.trials):
                    print(f"{name}, {action}, trial {k + 1} of {args.trials} ...",
                          file=sys.stderr, flush=True)
                    results.append(trial(launcher, action, args.slowdown,
                                         Path(tmp) / f"{launcher.value}-{action}-{k}"))
                rows.append([name, "Ctrl-C" if action == "ctrl-c" else "SIGTERM to it",
                             f"{sum(r['good'] for r in results)} of {len(results)}",
                             sum(r["checkpoint"] for r in results),
                             sum(r["lines"] == 2 for r in results),
                             ",".join(sorted({str(r["status"]) for r in results})),
                             sum(r["left"] for r in results),
                             f"{max(r['seconds'] for r in results):.1f}"])
    print_report(f"2 ranks, mlp on digits, slowdown {args.slowdown}, stopped after 8 steps, "
                 f"{args.trials} trials per row. Good: both ranks' stop lines at one step, the "
                 f"checkpoint of that step, a non-zero exit, no process left 30 s later.",
                 ["launcher", "stopped by", "good", "with checkpoint", "with both lines",
                  "exit statuses", "processes left", "max seconds to the end"], rows)


if __name__ == "__main__":
    main()
