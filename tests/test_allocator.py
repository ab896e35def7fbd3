"""``keep_freed_memory``: a large block freed and allocated again reuses its pages."""

from __future__ import annotations

import platform
import subprocess
import sys

import pytest

pytestmark = pytest.mark.skipif(platform.system() != "Linux" or platform.libc_ver()[0] != "glibc",
                                reason="the setting is glibc's (other C libraries keep their allocator)")

#: page faults of ten 64 MiB tensors made and dropped one after another, after ten warm-up rounds
FAULTS = """
import resource, sys, torch
from fglrepro.allocator import keep_freed_memory
if sys.argv[1] == "reuse":
    assert keep_freed_memory()
for _ in range(10):  # warm-up: the heap grows until its free blocks fit the loop (tcache leftovers)
    x = torch.ones(16 * 2**20)
    y = torch.ones(2**20)
    del x, y
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(10):
    x = torch.ones(16 * 2**20)
    y = torch.ones(2**20)
    del x, y
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def page_faults(mode: str) -> int:
    proc = subprocess.run([sys.executable, "-c", FAULTS, mode], capture_output=True, text=True, check=True)
    return int(proc.stdout)


def test_freed_large_blocks_are_reused_without_page_faults():
    pages = 10 * 17 * 2**20 * 4 // 4096  # every tensor's pages, faulted in once each
    default, reuse = page_faults("default"), page_faults("reuse")
    assert default > pages // 2  # glibc maps each 64 MiB block afresh and faults its pages in again
    assert reuse < pages // 20
