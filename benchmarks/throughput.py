"""Training throughput on synthetic data with unequal batches: total and per-rank rates.

In the spirit of Horovod's `pytorch_synthetic_benchmark.py`, but correct for batches that
differ between ranks: the total is all ranks' samples over wall time, and each rank's rate is
its own batch over its own busy time (compute and update). Rank 0 first prints the figures in
the format of Horovod's script (an "Iter #k" line per `--steps-per-iter` steady steps, the mean
per device +- 1.96 standard deviations, and the total), so they compare with the numbers users
know; a device's share is the total over the number of devices, as the batches differ. Then one
JSON line with the per-rank rates. It is one rank of a job, so it runs unchanged under any
launcher:

    horovodrun -np 8 -H node1:4,node2:4 python benchmarks/throughput.py --model resnet50
    mpirun -np 8 --hostfile hosts python benchmarks/throughput.py --model resnet50
    srun python benchmarks/throughput.py --model resnet50        (inside an sbatch script)

`--local N` starts N ranks on this machine instead (horovodrun --gloo), for a try without a
cluster; `--preset HL4` or `--slowdown 1,4` emulates heterogeneity there.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path


from hvd_dynbatch.backend.device import PRECISIONS
from hvd_dynbatch.core.heterogeneity import preset_factors
from hvd_dynbatch.training.metrics import busy_times, steady_steps, steady_throughput


def rank_main(args) -> None:
    import horovod.torch as hvd

    from hvd_dynbatch.training.config import TrainConfig
    from hvd_dynbatch.training.metrics import read_metrics
    from hvd_dynbatch.training.trainer import train

    hvd.init()
    slowdown = args.slowdown
    if args.preset:
        slowdown = ",".join(f"{f:g}" for f in preset_factors(args.preset, hvd.size()))
    with tempfile.TemporaryDirectory() as tmp:
        metrics = str(Path(tmp) / "metrics.jsonl")
        summary = train(TrainConfig(
            model=args.model, dataset="synthetic", image_size=args.image_size,
            global_batch=args.global_batch,
            epochs=1000, max_steps=args.steps, eval_every=100000, batching=args.batching[0],
            slowdown=slowdown, metrics=metrics, progress=False, threads=args.threads,
            device=args.device, amp=args.amp, fp16_allreduce=args.fp16_allreduce,
            channels_last=args.channels_last, cudnn_benchmark=args.cudnn_benchmark))
        if hvd.rank() == 0:
            records = read_metrics(metrics)
            kind = "GPU" if summary["device"].startswith("cuda") else "CPU"
            for line in horovod_lines(records, args.steps_per_iter, kind):
                print(line)
            print(json.dumps(report(records, summary)))


def horovod_lines(records: list, steps_per_iter: int, device: str) -> list:
    """The steady steps' figures as Horovod's synthetic benchmark prints them: samples/s per
    device for each group of `steps_per_iter` steps (all ranks' samples over the group's wall
    time, over the number of devices), their mean +- 1.96 standard deviations, and the total."""
    steady = steady_steps(records)
    devices = len(steady[-1]["batch_sizes"])
    per_device = []
    lines = [f"Model: {records[-1]['config']['model']}",
             f"Batch size: {records[-1]['config']['global_batch']} over all devices",
             f"Number of {device}s: {devices}"]
    for k in range(len(steady) // steps_per_iter):
        group = steady[k * steps_per_iter:(k + 1) * steps_per_iter]
        rate = sum(r["global_batch"] for r in group) / sum(r["step_time"] for r in group)
        per_device.append(rate / devices)
        lines.append(f"Iter #{k}: {per_device[-1]:.1f} img/sec per {device}")
    if not per_device:
        return lines + [f"(fewer steady steps than --steps-per-iter {steps_per_iter})"]
    mean, conf = statistics.mean(per_device), 1.96 * statistics.pstdev(per_device)
    return lines + [f"Img/sec per {device}: {mean:.1f} +-{conf:.1f}",
                    f"Total img/sec on {devices} {device}(s): {devices * mean:.1f} "
                    f"+-{devices * conf:.1f}"]


def report(records: list, summary: dict) -> dict:
    """Total samples/s over the run and in the steady state (`common.steady_throughput`), and
    each rank's rate: its batch over its busy time, medians over the steady steps."""
    steady = steady_steps(records)
    ranks = len(steady[-1]["batch_sizes"])
    return {
        "model": summary["config"]["model"], "batching": summary["batching"],
        "world_size": summary["world_size"], "global_batch": summary["config"]["global_batch"],
        "samples_per_sec": round(summary["samples_per_sec"], 1),
        "steady_samples_per_sec": round(steady_throughput(records), 1),
        "rank_samples_per_sec": [round(statistics.median(
            r["batch_sizes"][i] / busy_times(r)[i] for r in steady), 1)
            for i in range(ranks)],
        "final_split": summary["final_split"]}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="resnet18",
                        help="A model of the package: cnn, resnet18, resnet50, ...")
    parser.add_argument("--global-batch", type=int, default=64)
    parser.add_argument("--image-size", type=int, default=32,
                        help="Side of the synthetic images (224: ImageNet's).")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--batching", nargs="+", default=["dynamic"],
                        choices=["static", "dynamic", "abs"],
                        help="One under a launcher; with --local, each in turn.")
    parser.add_argument("--threads", type=int, default=1, help="Compute threads per rank.")
    parser.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N.")
    parser.add_argument("--amp", default="off", choices=list(PRECISIONS),
                        help="Mixed precision of the forward pass.")
    for flag in ("--fp16-allreduce", "--channels-last", "--cudnn-benchmark"):
        parser.add_argument(flag, action="store_true", help="As `hvd-dynbatch train`'s.")
    parser.add_argument("--steps-per-iter", type=int, default=10,
                        help="Steps per 'Iter' line (Horovod's --num-batches-per-iter).")
    parser.add_argument("--slowdown", help="Emulated slowdown per rank, e.g. 1,4.")
    parser.add_argument("--preset", help="Emulated heterogeneity preset, e.g. HL4.")
    parser.add_argument("--local", type=int, metavar="N",
                        help="Start N ranks on this machine rather than run as one rank.")
    args = parser.parse_args()
    if args.local is None:
        if len(args.batching) != 1:
            parser.error("under a launcher, give one --batching")
        rank_main(args)
        return
    from hvd_dynbatch.tools.launch import Launcher, json_records, run_local
    from hvd_dynbatch.tools.report import markdown_table

    rows = []
    for batching in args.batching:
        print(f"{batching} on {args.local} local ranks ...", file=sys.stderr)
        argv = [sys.executable, __file__, *_without_local(sys.argv[1:]), "--batching", batching]
        job = run_local(Launcher.GLOO, args.local, argv, timeout=3600)
        if job.returncode != 0:
            sys.exit(f"throughput job failed (exit {job.returncode}):\n{job.stderr[-3000:]}")
        rows += [[r["batching"], r["samples_per_sec"], r["steady_samples_per_sec"],
                  r["rank_samples_per_sec"], r["final_split"]] for r in json_records(job.stdout)]
    print(f"{args.model} on synthetic data, global batch {args.global_batch}, {args.steps} steps, "
          f"{args.local} local ranks, heterogeneity {args.preset or args.slowdown or 'none'}.")
    print()
    print(markdown_table(["batching", "samples/s (run)", "samples/s (steady)",
                          "per-rank samples/s", "final split"], rows))


def _without_local(argv: list) -> list:
    """The arguments minus --local N and --batching ... (a rank gets its own --batching)."""
    out, skipping = [], False
    for a in argv:
        if a in ("--local", "--batching"):
            skipping = True
        elif skipping and not a.startswith("--"):
            continue
        else:
            skipping = False
            if not a.startswith(("--local=", "--batching=")):
                out.append(a)
    return out


if __name__ == "__main__":
    main()
