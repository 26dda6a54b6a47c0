"""keep_freed_memory: a freed large block is reused, not faulted in again."""
import subprocess
import sys

import pytest

pytestmark = pytest.mark.processes

# Allocates, fills and frees a 64 MiB block 6 times, then prints the minor page faults of the
# last 5 rounds. glibc maps a block that large afresh each time (its mmap threshold rises at
# most to 32 MiB), so each round faults its pages in again (at least one fault per 2 MiB, where
# the kernel gives huge pages) unless the memory is kept.
ROUNDS = """
import resource, sys
import numpy as np
if sys.argv[1] == "keep":
    from hvd_dynbatch.backend.host_memory import keep_freed_memory
    assert keep_freed_memory()
def fill():
    block = np.empty(8 << 20)
    block.fill(1.0)
fill()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(5):
    fill()
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def faults(mode: str) -> int:
    out = subprocess.run([sys.executable, "-c", ROUNDS, mode], capture_output=True, text=True,
                         check=True)
    return int(out.stdout)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc only")
def test_freed_memory_is_reused_instead_of_faulted_in_again():
    default, kept = faults("default"), faults("keep")
    assert default >= 5 * 32
    assert kept < default / 10
