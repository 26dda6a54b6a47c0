"""A scale-up of the global batch under each learning-rate rule: none, linear, sqrt, smooth.

Two parts, same model, data and base learning rate:

1. The deterministic twin, for a clean comparison: 2 ranks, `--batch-schedule` multiplies
   the global batch by `--factor` at step `--change-at` (what an elastic job under
   `--batch-policy scale` does when it grows `--factor` times; dynamic batching makes the
   update independent of how many workers share the batch). Several seeds per rule.
2. The real event: a horovodrun elastic job on this machine (discovery script, hosts file)
   grows from 2 to 4 workers once it passes step `--change-at`, doubling the batch. The step
   at which the new workers join varies between runs (Horovod notices them at a commit after
   its discovery poll and the new processes' start); it is reported.

For each: the loss before the change, the spike after it (max and mean over `--window`
steps), and the loss and test accuracy at the end. Lin et al. (2019) claim the smooth rule
is more stable than the immediate linear rescale.

    python benchmarks/elastic_lr.py [--rules none linear sqrt smooth] [--seeds 3] [--plots DIR]
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

from common import DISCOVER, print_report

from hvd_dynbatch.tools.jobs import run_training_job
from hvd_dynbatch.tools.launch import Launcher, start_local, wait_local
from hvd_dynbatch.tools.plot import plot_comparison
from hvd_dynbatch.training.metrics import read_metrics, step_records


def twin(rule: str, seed: int, args) -> list:
    return run_training_job(2, [
        "--model", args.model, "--dataset", "digits", "--global-batch", str(args.global_batch),
        "--lr", str(args.lr), "--momentum", "0.9", "--seed", str(seed), "--epochs", "1000",
        "--max-steps", str(args.steps), "--eval-every", str(args.steps), "--lr-rule", rule,
        "--batch-schedule", f"{args.change_at}:{args.global_batch * args.factor}"])


def elastic(rule: str, args, workdir: Path) -> list:
    hosts, metrics = workdir / f"hosts-{rule}.txt", workdir / f"metrics-{rule}.jsonl"
    hosts.write_text("localhost:2\n")
    proc = start_local(Launcher.GLOO, 2, [
        sys.executable, "-m", "hvd_dynbatch", "train", "--elastic", "--model", args.model,
        "--dataset", "digits", "--global-batch", str(args.global_batch), "--lr", str(args.lr),
        "--momentum", "0.9", "--seed", "0", "--epochs", "1000", "--max-steps", str(args.steps),
        "--batch-policy", "scale", "--lr-rule", rule, "--slowdown", "8,8,8,8",
        "--eval-every", str(args.steps), "--commit-every", "5", "--no-progress",
        "--metrics", str(metrics)], log=str(workdir / f"job-{rule}.log"),
        env={"HVD_DYNBATCH_HOSTS_FILE": str(hosts)}, elastic_discovery=DISCOVER,
        min_np=1, max_np=4)
    while proc.poll() is None:
        if metrics.exists() and metrics.read_text().count('"batch_sizes"') >= args.change_at:
            hosts.write_text("localhost:4\n")
            break
        time.sleep(0.2)
    result = wait_local(proc, timeout=900)
    if result.returncode != 0:
        tail = (workdir / f"job-{rule}.log").read_text()[-3000:]
        raise SystemExit(f"the {rule} run failed (exit {result.returncode}):\n{tail}")
    return read_metrics(str(metrics))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rules", nargs="+", default=["none", "linear", "sqrt", "smooth"])
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--global-batch", type=int, default=32)
    parser.add_argument("--factor", type=int, default=4)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--model", default="cnn")
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--change-at", type=int, default=100)
    parser.add_argument("--window", type=int, default=20,
                        help="steps after the change over which the spike is measured")
    parser.add_argument("--plots", help="Directory for PNG plots of the lr and loss.")
    args = parser.parse_args()
    twin_rows, elastic_rows = [], []
    twin_runs, elastic_runs = {}, {}
    for rule in args.rules:
        for seed in range(args.seeds):
            print(f"twin: rule {rule}, seed {seed} ...", file=sys.stderr)
            records = twin(rule, seed, args)
            twin_runs.setdefault(rule, records)
            twin_rows.append([rule, seed, *figures(records, args.change_at, args.window)])
    with tempfile.TemporaryDirectory() as tmp:
        for rule in args.rules:
            print(f"elastic: rule {rule} ...", file=sys.stderr)
            records = elastic_runs[rule] = elastic(rule, args, Path(tmp))
            steps = step_records(records)
            change = next((r["step"] for r in steps if r["world_size"] == 4), None)
            if change is None:
                sys.exit(f"the elastic job (rule {rule}) ended before it grew to 4 workers: "
                         f"give it more --steps after --change-at {args.change_at}")
            elastic_rows.append([rule, change, *figures(records, change, args.window)])
    if args.plots:
        Path(args.plots).mkdir(parents=True, exist_ok=True)
        plot_comparison(twin_runs, str(Path(args.plots) / "elastic-lr-twin.png"),
                        f"Global batch x{args.factor} at step {args.change_at} (seed 0): "
                        f"learning rate and loss under each rule", mark_step=args.change_at)
        plot_comparison(elastic_runs, str(Path(args.plots) / "elastic-lr-real.png"),
                        "Real elastic event, 2 -> 4 workers: learning rate and loss")
    headers = ["mean loss, 10 steps before", "max loss after", "mean loss after",
               f"lr {args.window} steps after", "final loss (last 10 steps)",
               "final test accuracy"]
    print_report(
        f"Deterministic twin: 2 ranks, {args.model} on digits, global batch "
        f"{args.global_batch} -> {args.global_batch * args.factor} at step {args.change_at} "
        f"(--batch-schedule), lr {args.lr} for the starting batch, momentum 0.9, "
        f"{args.steps} steps. Loss is each step's training loss (batch-weighted over ranks); "
        f"'after' covers the {args.window} steps from the change.",
        ["lr rule", "seed", *headers], twin_rows)
    print()
    print_report(
        f"Real elastic event: horovodrun elastic, 2 -> 4 workers near step {args.change_at}, "
        f"--batch-policy scale (global batch {args.global_batch} -> "
        f"{2 * args.global_batch}), same model, lr and seed 0.",
        ["lr rule", "change at step", *headers], elastic_rows)


def figures(records: list, change: int, window: int) -> list:
    """Loss before and after the change at step `change`, the lr after it, the end."""
    by_step = {r["step"]: r for r in step_records(records)}
    last = max(by_step)
    before = [by_step[s]["loss"] for s in range(change - 10, change)]
    after = [by_step[s]["loss"] for s in range(change, change + window)]
    return [statistics.mean(before), max(after), statistics.mean(after),
            by_step[change + window]["lr"],
            statistics.mean(by_step[s]["loss"] for s in range(last - 9, last + 1)),
            records[-1]["final_accuracy"]]


if __name__ == "__main__":
    main()
