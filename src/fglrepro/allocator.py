"""Keep freed memory in the process: large tensors reuse heap pages instead of fresh ones.

glibc's ``malloc`` serves every block above its mmap threshold (dynamic, at most 32 MiB on 64-bit
Linux) with a fresh ``mmap`` and gives it back to the kernel on ``free``. A training step allocates
and frees the same large temporaries every step (the engine's client-stacked weights ``[K, F, H]``,
their gradients and Adam updates, Fed-PUB's masked weights), so each step faults in and zero-fills
those pages anew: on CiteSeer with 50 clients Fed-PUB spent more CPU time in the kernel than in its
own arithmetic. :data:`TUNABLES` turn ``mmap`` off and heap trimming (below 2 GiB of free top) off,
so freed blocks stay in the heap and the next step reuses them. They also turn off the per-thread
cache and the fast bins of small blocks: torch allocates with ``posix_memalign``, whose small leftover
pieces would otherwise sit unmerged between large freed blocks, and the heap would grow past them
(peak memory +26 % instead of +6 % on FedGKD Table 5's CiteSeer-50 cell). The numbers a run computes
do not change; CPU and peak memory before and after are in benchmarks/MALLOC.md.

glibc reads these settings only when a process starts (``GLIBC_TUNABLES``, glibc 2.26 or later), so
``fgl-train`` restarts itself with them (:func:`restart_keeping_freed_memory`) unless ``--malloc
default`` is given.
"""

from __future__ import annotations

import os
import platform
import sys

#: glibc malloc tunables: no mmap, trim only above 2 GiB of free heap top, no thread cache, no fast bins
TUNABLES = ("glibc.malloc.mmap_max=0:glibc.malloc.trim_threshold=2147483647:"
            "glibc.malloc.tcache_count=0:glibc.malloc.mxfast=0")


def on_glibc() -> bool:
    """Whether the C library is glibc (Linux; not musl, not macOS)."""
    return platform.system() == "Linux" and platform.libc_ver()[0] == "glibc"


def keeps_freed_memory() -> bool:
    """Whether this process started with :data:`TUNABLES` on glibc."""
    return on_glibc() and TUNABLES in os.environ.get("GLIBC_TUNABLES", "")


def restart_keeping_freed_memory() -> None:
    """Replace this process by the same command line started with :data:`TUNABLES` added to
    ``GLIBC_TUNABLES`` (same process id, so a workflow or scheduler watching it sees one process).
    Returns at once where the C library is not glibc or the settings are in place already."""
    if not on_glibc() or keeps_freed_memory():
        return
    tunables = ":".join(filter(None, [os.environ.get("GLIBC_TUNABLES"), TUNABLES]))
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, [sys.executable, *sys.orig_argv[1:]], {**os.environ, "GLIBC_TUNABLES": tunables})
