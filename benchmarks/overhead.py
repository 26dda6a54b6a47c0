"""The cost of dynamic batching's machinery at equal batches, under every launcher.

Jobs of 2 ranks with no emulated slowdown, the same model, data and global batch, under
`horovodrun --gloo`, horovodrun's elastic mode, `horovodrun --mpi` and `mpirun`: plain
`hvd.DistributedOptimizer` (benchmarks/plain_horovod.py; under elastic, in Horovod's elastic
state, committed as often as `train --elastic` commits) and `hvd-dynbatch train` with static
and with dynamic batching. They run in turns, `--repeats` times, each round starting with a
different job, and the median of each is compared with plain Horovod under the same launcher.
It also prints the share of the training time that the timing exchange and the controller
took, how many exchanges a job made and what one cost. Fast steps make that share large, so
the default is the CNN on the digits.

    python benchmarks/overhead.py [--repeats 3] [--steps 120]
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

from common import DISCOVER, print_report

from hvd_dynbatch.tools.jobs import measuring_run, run_training_job
from hvd_dynbatch.tools.launch import Launcher, run_local
from hvd_dynbatch.training.config import TrainConfig
from hvd_dynbatch.training.metrics import steady_throughput

HERE = Path(__file__).resolve().parent
# name: (launcher, elastic)
LAUNCHES = {"horovodrun --gloo": (Launcher.GLOO, False), "elastic": (Launcher.GLOO, True),
            "horovodrun --mpi": (Launcher.MPI, False), "mpirun": (Launcher.MPIRUN, False)}


def elastic_options(launch: str, workdir: str) -> dict:
    """What `run_local` needs besides the launcher to start a job under `launch`: for
    horovodrun's elastic mode, the discovery script, fixed bounds and a hosts file."""
    if not LAUNCHES[launch][1]:
        return {}
    hosts = Path(workdir) / "hosts.txt"
    hosts.write_text("localhost:2\n")
    return {"elastic_discovery": DISCOVER, "min_np": 2, "max_np": 2,
            "env": {"HVD_DYNBATCH_HOSTS_FILE": str(hosts)}}


def plain_horovod(args, launch: str, workdir: str) -> float:
    output = Path(workdir) / "plain.json"
    output.unlink(missing_ok=True)
    launcher, elastic = LAUNCHES[launch]
    commits = ["--commit-every", str(TrainConfig.commit_every)] if elastic else []
    job = run_local(launcher, 2,
                    [sys.executable, str(HERE / "plain_horovod.py"), "--model", args.model,
                     "--dataset", args.dataset, "--global-batch", str(args.global_batch),
                     "--steps", str(args.steps), "--output", str(output), *commits],
                    timeout=600, **elastic_options(launch, workdir))
    if job.returncode != 0 or not output.exists():
        raise SystemExit(f"plain Horovod run failed:\n{(job.stdout + job.stderr)[-2000:]}")
    return json.loads(output.read_text())["samples_per_sec"]


def ours(options: list, launch: str, workdir: str) -> list:
    """The records of a `hvd-dynbatch train` job of 2 ranks under `launch`."""
    launcher, elastic = LAUNCHES[launch]
    return run_training_job(2, [*options, *(["--elastic"] if elastic else [])],
                            launcher=launcher, **elastic_options(launch, workdir))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--steps", type=int, default=120)
    parser.add_argument("--global-batch", type=int, default=256)
    parser.add_argument("--model", default="cnn")
    parser.add_argument("--dataset", default="digits")
    parser.add_argument("--launches", nargs="+", default=list(LAUNCHES), choices=list(LAUNCHES))
    args = parser.parse_args()
    options = ["--model", args.model, "--dataset", args.dataset, "--global-batch",
               str(args.global_batch), *measuring_run(args.steps), "--lr", "0.05"]
    jobs = [(launch, loop) for launch in args.launches
            for loop in ("plain Horovod", "static", "dynamic")]
    rates = {job: [] for job in jobs}
    shares = {job: [] for job in jobs}
    exchanges = {job: [] for job in jobs}
    with tempfile.TemporaryDirectory() as workdir:
        for repeat in range(args.repeats):
            # Each round starts with a different job, so none always runs first or last.
            shift = repeat * len(jobs) // args.repeats
            for launch, loop in jobs[shift:] + jobs[:shift]:
                print(f"round {repeat + 1}: {launch}, {loop} ...", file=sys.stderr)
                if loop == "plain Horovod":
                    rates[launch, loop].append(plain_horovod(args, launch, workdir))
                    continue
                records = ours([*options, "--batching", loop], launch, workdir)
                rates[launch, loop].append(steady_throughput(records))
                summary = records[-1]
                shares[launch, loop].append(summary["exchange_seconds"]
                                            / summary["train_seconds"])
                exchanges[launch, loop].append((summary["exchanges"],
                                                summary["exchange_seconds"]))
    rows = []
    for (launch, loop), values in rates.items():
        base = rates.get((launch, "plain Horovod"))
        rate = statistics.median(values)
        share, made = shares[launch, loop], exchanges[launch, loop]
        rows.append([launch, loop, [round(v) for v in values], rate,
                     f"{rate / statistics.median(base) - 1:+.1%}" if base else None,
                     f"{statistics.median(share):.2%}" if share else None,
                     [count for count, _ in made] if made else None,
                     f"{1e3 * sum(s for _, s in made) / sum(c for c, _ in made):.2f}"
                     if made else None])
    print_report(
        f"Equal batches, no slowdown: {args.model} on {args.dataset}, global batch "
        f"{args.global_batch}, {args.steps} steps, 2 ranks x 1 thread, {args.repeats} runs "
        f"each in rotating turns; throughput from the median step time of the last 75% of "
        f"steps; exchange + controller share = the exchanges' time (starting the gather, "
        f"waiting for it, the controller) over the training time; ms per exchange over all "
        f"runs.",
        ["launcher", "loop", "runs (samples/s)", "median (samples/s)", "vs plain Horovod",
         "exchange + controller share", "exchanges per job", "ms per exchange"], rows)


if __name__ == "__main__":
    main()
