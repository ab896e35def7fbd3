"""Keep freed memory in the process: large tensors reuse heap pages instead of fresh ones.

glibc's ``malloc`` serves every block above its mmap threshold (dynamic, at most 32 MiB on 64-bit
Linux) with a fresh ``mmap`` and gives it back to the kernel on ``free``. A training step allocates
and frees the same large temporaries every step (the engine's client-stacked weights ``[K, F, H]``,
their gradients and Adam updates, Fed-PUB's masked weights, FedSage+'s generator outputs), so each
step faults in and zero-fills those pages anew: on CiteSeer with 50 clients Fed-PUB spent more CPU
time in the kernel than in its own arithmetic. With ``mmap`` off and heap trimming off, freed blocks
stay in the heap and the next step reuses them. Fast bins go off too: torch allocates with
``posix_memalign``, whose small leftover pieces would otherwise sit unmerged between large freed
blocks and make the heap grow past them. The numbers a run computes do not change.

The price is memory: the heap keeps its high-water mark until the process exits (what the run JSON's
``peak_memory_mb`` reports anyway) and fragments more than fresh mappings do, up to about 1.2x the
peak (benchmarks/METHOD_COSTS.md: CPU and peak memory, before and after). ``fgl-train`` calls
:func:`keep_freed_memory` at start unless ``--malloc default`` is given.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import platform

#: ``mallopt`` parameters (glibc's ``malloc.h``)
M_MXFAST = 1
M_TRIM_THRESHOLD = -1
M_MMAP_MAX = -4


def keep_freed_memory() -> bool:
    """Tell glibc's allocator to serve large blocks from the heap, to give its free top back only
    above 2 GiB and to merge small freed blocks at once (no fast bins).

    Returns whether the settings took effect: ``False`` where the C library is not glibc (macOS,
    musl), whose allocators keep their own defaults.
    """
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return False
    libc = ctypes.CDLL(ctypes.util.find_library("c"))
    trim_above = ctypes.c_int(2**31 - 1)  # bytes: the largest int mallopt takes
    settings = ((M_MMAP_MAX, 0), (M_TRIM_THRESHOLD, trim_above), (M_MXFAST, 0))
    return all([bool(libc.mallopt(param, value)) for param, value in settings])
