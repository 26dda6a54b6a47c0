"""The `hvd-dynbatch` command: a thin click layer over the library.

Every command that runs inside a launcher (`check`, `train`) is started once per rank by
horovodrun, mpirun or srun; `demo` starts such a job on this machine itself.
"""
from __future__ import annotations

import dataclasses
import enum
import json
import sys

import click

from ..backend.device import PRECISIONS
from ..core.controller import Rule
from ..core.lr import RULES
from ..core.simulator import SETTLED, RateDistribution, Scenario
from ..errors import DynBatchError
from ..training.config import Batching, BatchPolicy, OnNan, Staleness, TrainConfig

_TRAIN_DEFAULTS = {f.name: f.default for f in dataclasses.fields(TrainConfig)}
_SCENARIO = Scenario(1)  # the simulator's defaults


class _Group(click.Group):
    """Turns a `DynBatchError` into a one-line error and exit code 2, never a traceback."""

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except DynBatchError as exc:
            click.echo(f"hvd-dynbatch: error: {exc}", err=True)
            sys.exit(2)


@click.group(cls=_Group)
@click.version_option(package_name="hvd-dynbatch")
def main():
    """Data-parallel training with Horovod on workers that are not alike."""


@main.command()
def check():
    """Check the stack under a launcher: each rank prints its view of the job as JSON."""
    from .check import run_check

    click.echo(json.dumps(run_check(), sort_keys=True))


def _batch_schedule(ctx, param, value):
    if value is None:
        return ()
    try:
        return tuple(tuple(int(x) for x in part.split(":")) for part in value.split(","))
    except ValueError:
        raise click.BadParameter(f"expected STEP:BATCH pairs like 100:128,200:64, "
                                 f"got '{value}'") from None


def _int_list(ctx, param, value):
    if value is None:
        return None
    try:
        return tuple(int(v) for v in value.split(","))
    except ValueError:
        raise click.BadParameter(f"expected comma-separated integers, got '{value}'") from None


def _configured(*decls, **kwargs):
    """A `train` option whose default is that of the `TrainConfig` field it names
    (`--max-steps`: `max_steps`), so that every default is written once."""
    field = decls[0].split("/")[0].lstrip("-").replace("-", "_")
    default = _TRAIN_DEFAULTS[field]
    if isinstance(default, enum.Enum):
        default = default.value
    if default is None or default == ():
        return click.option(*decls, **kwargs)
    return click.option(*decls, default=default, show_default=True, **kwargs)


@main.command()
@_configured("--model", help="linear, mlp, cnn, resnet18, resnet50 or torchvision:NAME.")
@_configured("--dataset", help="digits (embedded), synthetic or imagefolder.")
@_configured("--data-dir", type=click.Path(), help="Root of an imagefolder dataset.")
@_configured("--image-size", type=int,
             help="Image side of imagefolder [default: 64] and synthetic [default: 32] data.")
@_configured("--global-batch", help="B, summed over ranks.")
@_configured("--lr", help="Learning rate.")
@_configured("--momentum")
@_configured("--seed")
@_configured("--epochs", type=int,
             help="Stop after this many epochs [default: 1, unless --max-steps is given].")
@_configured("--max-steps", type=int, help="Stop after this many steps.")
@_configured("--batching", type=click.Choice([b.value for b in Batching]))
@_configured("--controller", type=click.Choice([r.value for r in Rule]),
             help="Dynamic batching rule: a fitted fixed-plus-per-sample time model "
                  "(model), refined proportional (pid), or plain proportional (p).")
@_configured("--controller-gain",
             help="pid: fraction of the way to the balanced split moved per adjustment.")
@_configured("--integral-gain", help="pid: weight of the accumulated same-sign error.")
@_configured("--adjust-every", help="Steps between timing exchanges (and split adjustments).")
@_configured("--hold-seconds", help="While the split holds: seconds of steps between timing "
                                    "exchanges, up to 4 x --adjust-every steps (0: none).")
@_configured("--min-batch", help="Smallest batch of one rank.")
@_configured("--max-batch", type=int, help="Largest batch of one rank (a memory cap).")
@_configured("--initial-split", callback=_int_list, help="First split, e.g. 16,48.")
@_configured("--slowdown", help="Emulated slowdown per rank, '1,4', or a schedule "
                                "'0:1,4;50:4,1' (factors from each step on).")
@_configured("--eval-every", help="Steps between test evaluations (0: each epoch end).")
@_configured("--target-accuracy", type=float,
             help="Stop when the test accuracy reaches this (0-1); records the time to it.")
@_configured("--metrics", type=click.Path(), help="JSON-lines metrics file (rank 0).")
@_configured("--save-model", type=click.Path(), help="Rank 0 writes the final state_dict.")
@_configured("--threads", help="Compute threads per rank.")
@_configured("--amp", type=click.Choice(list(PRECISIONS)),
             help="Mixed precision of the forward pass: off (float32), bf16 (bfloat16 "
                  "autocast; weights, gradients and optimizer stay float32) or fp16 (float16 "
                  "autocast with loss scaling; steps that overflow are skipped alike on "
                  "every rank).")
@_configured("--fp16-allreduce", is_flag=True,
             help="Send the gradients as float16 (Horovod's fp16 compression).")
@_configured("--channels-last", is_flag=True,
             help="Lay batches of images out NHWC (faster convolutions on recent GPUs; "
                  "the weights stay NCHW, as Horovod needs).")
@_configured("--cudnn-benchmark", is_flag=True,
             help="On a GPU, let cuDNN time its algorithms for each new batch shape; the "
                  "first step at each batch size is then left out of the timing.")
@_configured("--device", help="auto (each rank its node's GPU number local rank, where CUDA is "
                               "there, else the CPU), cpu, cuda or cuda:N.")
@_configured("--loader-workers",
             help="DataLoader processes that decode and prefetch steps (2 each); a new split "
                  "takes effect that many steps after the controller decides it.")
@_configured("--progress/--no-progress", help="Progress bar on rank 0 (only on a terminal).")
@_configured("--warmup-steps", help="Linear learning-rate warm-up over this many steps.")
@_configured("--lr-decay-steps", callback=_int_list,
             help="Steps at which the learning rate is multiplied by --lr-decay, e.g. 100,200.")
@_configured("--lr-decay")
@_configured("--elastic", is_flag=True,
             help="Survive workers joining and leaving (horovodrun elastic mode, Gloo).")
@_configured("--batch-policy", type=click.Choice([p.value for p in BatchPolicy]),
             help="On a world-size change: keep B, or scale it with the worker count.")
@_configured("--lr-rule", type=click.Choice(list(RULES)),
             help="Learning rate on a change of B: none, linear, sqrt, smooth "
                  "[default: smooth under --batch-policy scale, else none].")
@_configured("--smooth-steps", help="Steps of the smooth rule's ramp per factor of batch change.")
@_configured("--commit-every", help="Steps between elastic state commits.")
@_configured("--batch-schedule", callback=_batch_schedule,
             help="Change the global batch at given steps, e.g. 100:128 (not with --elastic); "
                  "the learning-rate rule applies as to an elastic change.")
@_configured("--micro-batch", help="ABS-SGD: samples per micro-batch within a compute window.")
@_configured("--window-gain",
             help="ABS-SGD: weight of the newest window's measured rate in each rank's rate "
                  "estimate, which sets its quota (1: the last window's alone).")
@_configured("--staleness", type=click.Choice([r.value for r in Staleness]),
             help="ABS-SGD: how the one-window-stale gradient is compensated: weight "
                  "prediction, momentum correction, delay compensation (DC-ASGD), or none.")
@_configured("--sample-log", type=click.Path(),
             help="Directory where each process logs the sample indices of every step.")
@_configured("--on-nan", type=click.Choice([o.value for o in OnNan]),
             help="A step whose gradient is not finite is never applied: stop the run with "
                  "an error, or skip the step and go on.")
@_configured("--skip-limit",
             help="Under --on-nan skip: this many steps in a row not applied stop the run as "
                  "--on-nan stop does.")
@_configured("--skip-bad-samples", is_flag=True,
             help="Replace an image that cannot be decoded by the next readable one (counted "
                  "in the summary) instead of stopping with an error naming it.")
@_configured("--checkpoint-dir", type=click.Path(file_okay=False),
             help="Rank 0 writes checkpoints here (model, optimizer, the run's state).")
@_configured("--checkpoint-every", help="Steps between checkpoints (one is also written at "
                                        "the end).")
@_configured("--checkpoint-keep", help="How many of the newest checkpoints to keep.")
@_configured("--resume", is_flag=True,
             help="Continue from the newest checkpoint in --checkpoint-dir (start fresh if "
                  "there is none); --max-steps and --epochs count the whole run.")
def train(**options):
    """Train on this rank of a Horovod job (run under horovodrun, mpirun or srun)."""
    from ..backend.backends import stopped_by_peer
    from ..training.trainer import train as run_training

    config = TrainConfig(**options)
    try:
        summary = run_training(config)
    except Exception as exc:
        if not stopped_by_peer(exc):
            raise
        raise DynBatchError(f"another rank failed, so this one stopped ({exc}); that rank's "
                            f"own error says why (a worker lost with its node, not an error, "
                            f"is survived by --elastic under horovodrun's elastic mode)") \
            from None
    if summary["rank"] == 0:
        click.echo(_summary_line(summary))


def _summary_line(s: dict) -> str:
    acc = "n/a" if s["final_accuracy"] is None else f"{s['final_accuracy']:.3f}"
    ttt = "" if s["time_to_target"] is None else f", target reached in {s['time_to_target']:.1f}s"
    return (f"{s['batching']} batching on {s['world_size']} ranks: {s['steps']} steps, "
            f"{s['samples_per_sec']:.0f} samples/s, loss {s['final_loss']:.4f}, "
            f"accuracy {acc}{ttt}, final split {s['final_split']}")


@main.command()
@click.option("--np", "np_", default=2, show_default=True, help="Ranks to start on this machine.")
@click.option("--slowdown", default="1,4", show_default=True,
              help="Emulated slowdown factor of each rank.")
@click.option("--target-accuracy", default=0.9, show_default=True)
def demo(np_, slowdown, target_accuracy):
    """Static versus dynamic batching on this machine, with emulated heterogeneity."""
    from .demo import run_demo
    from ..core.heterogeneity import Slowdown

    Slowdown.parse(slowdown).check_world(np_)
    run_demo(np_, slowdown, target_accuracy, echo=click.echo)


@main.command()
@click.argument("metrics", nargs=-1, required=True,
                type=click.Path(exists=True, dir_okay=False))
@click.option("-o", "--output", required=True, type=click.Path(dir_okay=False),
              help="The PNG to write.")
@click.option("--title", default="", help="A title above the panels.")
def plot(metrics, output, title):
    """Plot metrics files. One: per-rank batch sizes and compute times, loss, accuracy, lr.
    Several: their loss, accuracy and lr side by side, each named by its file."""
    import json
    from pathlib import Path

    from ..training.metrics import read_metrics
    from .plot import plot_comparison, plot_run

    runs = {}
    for path in metrics:
        try:
            runs[Path(path).stem] = read_metrics(path)
        except (OSError, json.JSONDecodeError) as exc:
            raise DynBatchError(f"cannot read metrics file {path}: {exc}") from None
    if len(runs) == 1:
        plot_run(next(iter(runs.values())), output, title)
    else:
        plot_comparison(runs, output, title)
    click.echo(f"wrote {output}")


@main.command()
@click.option("--workers", default="8,64,256,1024,4096", show_default=True,
              callback=_int_list, help="Worker counts to simulate, comma-separated.")
@click.option("--rule", "rules", multiple=True, type=click.Choice([r.value for r in Rule]),
              help="Controller rule(s) [default: all].")
@click.option("--rates", type=click.Choice([d.value for d in RateDistribution]),
              default=_SCENARIO.distribution.value, show_default=True,
              help="How worker speeds spread: lognormal, log-uniform, or three hardware "
                   "generations in equal shares.")
@click.option("--spread", default=_SCENARIO.spread, show_default=True,
              help="Fastest worker's rate over the slowest's.")
@click.option("--noise", default=_SCENARIO.noise, show_default=True,
              help="Relative standard deviation of each step's compute time.")
@click.option("--drift", default=_SCENARIO.drift, show_default=True,
              help="Log standard deviation of a worker's speed factor, drawn afresh each "
                   "adjustment window (a shared node's speed moving between windows).")
@click.option("--steps-per-adjustment", default=_SCENARIO.steps, show_default=True,
              help="Steps between adjustments (the controller sees each worker's median).")
@click.option("--adjustments", default=_SCENARIO.adjustments, show_default=True)
@click.option("--batch-per-worker", default=_SCENARIO.batch_per_worker, show_default=True,
              help="Global batch = this x the starting worker count.")
@click.option("--overhead", default=_SCENARIO.overhead, show_default=True,
              help="Fixed seconds per step on every worker, besides the per-sample work.")
@click.option("--gradient-mb", default=_SCENARIO.allreduce.gradient_bytes / 1e6,
              show_default=True,
              help="Gradient size allreduced per step, MB (ResNet-50: about 100).")
@click.option("--bandwidth-gbps", default=_SCENARIO.allreduce.bandwidth * 8 / 1e9,
              show_default=True, help="Link bandwidth of the ring allreduce, Gbit/s.")
@click.option("--latency-us", default=_SCENARIO.allreduce.latency * 1e6, show_default=True,
              help="Latency per allreduce message, microseconds.")
@click.option("--events", help="Changes during the run, e.g. "
                               "'10:slow=0.1@2;20:leave=0.25;30:join=0.25' (at adjustment "
                               "10, 10% of the workers become 2x slower; ...).")
@click.option("--target", default=SETTLED, show_default=True,
              help="Efficiency against the ideal split that counts as settled.")
@click.option("--seed", default=_SCENARIO.seed, show_default=True)
def simulate(workers, rules, rates, spread, noise, drift, steps_per_adjustment, adjustments,
             batch_per_worker, overhead, gradient_mb, bandwidth_gbps, latency_us, events,
             target, seed):
    """Run the batch controller against a simulated cluster of many workers."""
    from tqdm import tqdm

    from ..core.simulator import Event, RingAllreduce
    from .scale import scale_study

    base = Scenario(workers[0], RateDistribution(rates), spread, noise, steps_per_adjustment,
                    adjustments, batch_per_worker, overhead,
                    RingAllreduce(gradient_mb * 1e6, bandwidth_gbps * 1e9 / 8, latency_us * 1e-6),
                    tuple(Event.parse_schedule(events)), seed, drift)
    click.echo(scale_study(base, workers, rules or list(Rule), target,
                           lambda runs: tqdm(runs, desc="simulating", disable=None)))
