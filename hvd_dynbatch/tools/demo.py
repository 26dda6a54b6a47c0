"""The main demo: static then dynamic batching of one job with emulated heterogeneity.

Two ranks on this machine train a small CNN on the embedded digits, rank 1 emulating a
worker 4 times slower. Both runs use the same global batch, learning rate and seed; the
table shows what dynamic batching changes: throughput, time to the target accuracy, and the
split the controller settled on.
"""
from __future__ import annotations

from typing import Callable

from ..core.heterogeneity import Slowdown
from ..training.metrics import clock_before, first_move, step_records, throughput_from
from .jobs import ideal_speedup, run_training_job, standalone_rates, summary_of
from .report import markdown_table

DEMO_MODEL = ["--model", "cnn", "--dataset", "digits", "--lr", "0.1", "--momentum", "0.9",
              "--seed", "0"]
DEMO_BATCH = 512
DEMO_TRAINING = [*DEMO_MODEL, "--global-batch", str(DEMO_BATCH), "--epochs", "40",
                 "--eval-every", "6", "--adjust-every", "3"]


def run_demo(np: int = 2, slowdown: str = "1,4", target: float = 0.9,
             echo: Callable[[str], None] = print) -> list:
    """Run the static and the dynamic job; print and return one summary per method."""
    options = [*DEMO_TRAINING, "--slowdown", slowdown, "--target-accuracy", str(target)]
    echo(f"hvd-dynbatch demo: {np} ranks on this machine, slowdown factors {slowdown}, "
         f"digits, CNN, global batch 512; training until {target:.0%} test accuracy")
    runs = []
    for batching in ("static", "dynamic"):
        echo(f"  running {batching} batching ...")
        runs.append(run_training_job(np, [*options, "--batching", batching]))
    summaries = [summary_of(records) for records in runs]
    base = summaries[0]["samples_per_sec"]
    rows = [[s["batching"], s["samples_per_sec"], f"{s['samples_per_sec'] / base:.2f}x",
             s["time_to_target"], s["steps"], s["final_accuracy"], s["final_split"]]
            for s in summaries]
    echo("")
    echo(markdown_table(["batching", "samples/s", "speedup", f"time to {target:.0%} (s)",
                         "steps", "accuracy", "final split"], rows))
    echo(_after_first_move(*runs))
    factors = Slowdown.parse(slowdown).factors
    if len(factors) == 1:
        echo("  measuring each worker alone ...")
        names = [f"{f:g}" for f in factors[0]]
        rates = standalone_rates(names, DEMO_BATCH // np, DEMO_MODEL)
        alone = ", ".join(f"{rates[f]:.0f} at factor {f}" for f in dict.fromkeys(names))
        echo(f"ideal speedup {ideal_speedup([rates[f] for f in names]):.2f}x: the most any "
             f"split can gain over equal batches, from each worker's rate alone at batch "
             f"{DEMO_BATCH // np} (samples/s: {alone})")
    return summaries


def _after_first_move(static: list, dynamic: list) -> str:
    """The speedup from the step the controller's first split took effect, with the share
    of the dynamic run's time spent before it at equal batches: in a run of a few dozen
    steps that start-up is a large part of the whole run's speedup falling short of the
    ideal."""
    first = first_move(dynamic)
    if first is None:
        return "the controller kept equal batches throughout"
    if step_records(static)[-1]["step"] < first:
        return f"the controller's first split took effect at step {first}, after the end " \
               f"of the static run"
    rates = [throughput_from(records, first) for records in (static, dynamic)]
    share = clock_before(dynamic, first) / summary_of(dynamic)["train_seconds"]
    return (f"from step {first} on, where the controller's first split took effect: "
            f"{rates[1] / rates[0]:.2f}x (samples/s: static {rates[0]:.0f}, dynamic "
            f"{rates[1]:.0f}); the {first} steps before it, at equal batches while the "
            f"controller timed the workers, took {share:.0%} of the dynamic run's time")
