"""The example a user copies: a standard Horovod script converted to dynamic batching with a
handful of marked lines, run under horovodrun and mpirun."""
import difflib
import re
from pathlib import Path

import pytest

from hvd_dynbatch.tools.launch import Launcher
from launcher import PYTHON, run_ranks

ROOT = Path(__file__).resolve().parent.parent
ORIGINAL = ROOT / "examples" / "pytorch_mnist.py"
CONVERTED = ROOT / "examples" / "pytorch_mnist_dynbatch.py"


def changed_lines():
    """The converted script's lines that the original does not have, and the original's
    lines that the converted script dropped."""
    old, new = ORIGINAL.read_text().splitlines(), CONVERTED.read_text().splitlines()
    added, removed = [], []
    for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(None, old, new).get_opcodes():
        if tag != "equal":
            removed += old[i1:i2]
            added += new[j1:j2]
    return added, removed


def test_the_conversion_is_a_few_marked_lines():
    added, removed = changed_lines()
    assert 0 < len(added) <= 6, added
    assert all(line.endswith("# dynbatch") for line in added), added
    # What goes: Horovod's sampler, the loader built on it, its set_epoch, Horovod's optimizer.
    assert {"DistributedSampler(", "set_epoch", "hvd.DistributedOptimizer"} <= {
        key for key in ("DistributedSampler(", "set_epoch", "hvd.DistributedOptimizer")
        if any(key in line for line in removed)}
    assert len(removed) <= 7, removed


def test_the_readme_shows_the_diff():
    readme = (ROOT / "README.md").read_text()
    added, removed = changed_lines()
    for line in added:
        assert f"+{line}" in readme, line
    for line in removed:
        assert f"-{line}" in readme, line


@pytest.mark.parametrize("launcher, extra", [
    (Launcher.GLOO, ["--num-workers", "2"]),
    (Launcher.MPIRUN, ["--num-workers", "0"]),
])
@pytest.mark.processes
def test_the_converted_example_trains(launcher, extra):
    job = run_ranks(launcher, 2, [PYTHON, str(CONVERTED), "--epochs", "2", *extra],
                    timeout=240)
    assert job.returncode == 0, job.explain()
    tests = re.findall(r"test epoch (\d+): loss ([\d.]+) accuracy ([\d.]+)", job.job.stdout)
    assert [int(epoch) for epoch, _, _ in tests] == [1, 2], job.explain()
    # 2 epochs of 4,000 digits: the original script reaches about 0.8 here.
    assert float(tests[-1][2]) > 0.7, tests
    steps = re.findall(r"epoch 1 step \d+/(\d+)", job.job.stdout)
    assert steps and set(steps) == {"63"}, "4,000 samples in global batches of 64"
