"""How close the emulated slowdown lands to the factor asked for.

For each model, one worker alone (a 1-rank job, as the demo and `speedup.py` measure the
standalone rates their ideal speedups come from) at factor 1 and at each factor, in turns,
`--repeats` times. A round's measured factor is its rate at factor 1 over its rate at the
factor; the table gives the median and the range over rounds.

    python benchmarks/emulator_fidelity.py [--factors 4 8] [--repeats 3]
"""
from __future__ import annotations

import argparse
import statistics
import sys

from common import print_report

from hvd_dynbatch.tools.jobs import standalone_rates

# (model options, batch of one worker, steps): the CNN at the per-rank batches of the demo
# (digits, 512 on 2 ranks) and of speedup.py (synthetic, 256 on 2 ranks), a small batch, and
# ResNet-18.
CASES = [
    (["--model", "cnn", "--dataset", "digits"], 256, 30),
    (["--model", "cnn", "--dataset", "synthetic"], 128, 30),
    (["--model", "cnn", "--dataset", "synthetic"], 16, 30),
    (["--model", "resnet18", "--dataset", "synthetic"], 32, 15),
]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--factors", nargs="+", default=["4", "8"])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    rows = []
    for options, batch, steps in CASES:
        measured = {f: [] for f in args.factors}
        for repeat in range(args.repeats):
            # Each round starts with a different factor, so none always runs first.
            order = ["1", *args.factors]
            order = order[repeat % len(order):] + order[:repeat % len(order)]
            rates = standalone_rates(order, batch, options, steps)
            for f in args.factors:
                measured[f].append(rates["1"] / rates[f])
        for f, values in measured.items():
            median = statistics.median(values)
            rows.append([" ".join(options[1::2]), batch, f, f"{median:.2f}",
                         f"{min(values):.2f}-{max(values):.2f}",
                         f"{median / float(f) - 1:+.0%}"])
            print(f"{rows[-1][0]} batch {batch}: factor {f} measured {median:.2f}",
                  file=sys.stderr)
    print_report(
        f"Emulated slowdown, one worker alone (1 rank x 1 thread), {args.repeats} rounds; "
        f"measured factor = samples/s at factor 1 / samples/s at the factor, from the median "
        f"step time of the last 75% of steps.",
        ["model, data", "batch", "factor", "measured (median)", "range", "off by"], rows)


if __name__ == "__main__":
    main()
