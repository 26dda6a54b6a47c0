"""The C library's allocator under training on the CPU: freed memory kept for the next step.

PyTorch takes a CPU tensor's memory from the C library's malloc, and glibc hands large blocks
back to the kernel when they are freed: a block above the mmap threshold is unmapped, and free
memory at the top of the heap beyond the trim threshold is trimmed. The next step asks for the
same sizes again and pays for fresh pages, a page fault and a zeroed page each. glibc also
moves the mmap threshold by itself (freeing a mapped block raises it to that block's size), so
which steps pay depends on what was freed before, and a rank's speed flips between two modes.
In 2-rank jobs on this project's 2-core machine (cnn, synthetic data, global batch 256,
slowdown 1,4), the unslowed rank computed at about 300 us a sample in some adjustment windows
and 420-600 in others, the flips coming every few windows; the emulated slow rank, sized from
the other's recent steps, echoed them a window later. In one job four windows at 211/45 read
an imbalance of 1.00-1.11 and the next, at 210/46, read 1.84. With both thresholds high, freed
memory stays with the process: such a job computed at 312-368 us a sample in every window
after its first two (where the process warms up), and took 20-21 s against 26 (system time 11
s against 19). Setting only the trim threshold fixes glibc's mmap threshold at its default of
128 KiB: every window alike, all at about 940 us a sample.

`keep_freed_memory()` sets both thresholds for this process and the processes it forks (data
loader workers). The train command calls it on CPU ranks; a training script of one's own can
call it first. A process then keeps what its steps have freed, as PyTorch's caching allocator
does on a GPU: one process training the cnn alone at random batches of 16-240 samples held
1.54-2.16 GiB resident over 1600 steps against 1.24-1.84 without (both growing at about the
same pace), and ran them in 74 s against 76. Outside glibc it does nothing.
"""
from __future__ import annotations

import ctypes
import sys

# mallopt's parameter numbers (glibc's malloc.h).
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
# Blocks up to 1 GiB come from the heap; the heap is trimmed past 2 GiB - 1 (mallopt takes
# an int).
_MMAP_THRESHOLD = 1 << 30
_TRIM_THRESHOLD = 2 ** 31 - 1


def keep_freed_memory() -> bool:
    """Make glibc's malloc keep freed memory for reuse (see the module docstring); return
    whether it did (False outside glibc)."""
    if not sys.platform.startswith("linux"):
        return False
    libc = ctypes.CDLL(None)
    if not hasattr(libc, "gnu_get_libc_version"):
        return False
    mallopt = libc.mallopt
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return bool(mallopt(_M_MMAP_THRESHOLD, _MMAP_THRESHOLD)
                and mallopt(_M_TRIM_THRESHOLD, _TRIM_THRESHOLD))
