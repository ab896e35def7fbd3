"""``fglrepro.allocator``: with its glibc settings a large block freed and allocated again reuses its
pages, and a process restarts itself with them once, keeping the user's own settings."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from fglrepro.allocator import TUNABLES, on_glibc

pytestmark = pytest.mark.skipif(not on_glibc(), reason="the settings are glibc's (other C libraries keep theirs)")

#: page faults of ten 64 MiB tensors (and a 4 MiB one beside each) made and dropped one after another
FAULTS = """
import resource, torch
for _ in range(3):  # warm-up: the heap reaches the size the loop needs
    x, y = torch.ones(16 * 2**20), torch.ones(2**20)
    del x, y
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(10):
    x, y = torch.ones(16 * 2**20), torch.ones(2**20)
    del x, y
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def page_faults(tunables: str | None) -> int:
    env = {k: v for k, v in os.environ.items() if k != "GLIBC_TUNABLES"}
    if tunables:
        env["GLIBC_TUNABLES"] = tunables
    proc = subprocess.run([sys.executable, "-c", FAULTS], env=env, capture_output=True, text=True, check=True)
    return int(proc.stdout)


def test_freed_large_blocks_are_reused_without_page_faults():
    pages = 10 * 17 * 2**20 * 4 // 4096  # every tensor's pages, faulted in once each
    assert page_faults(None) > pages // 2  # glibc maps each 64 MiB block afresh and faults its pages in again
    assert page_faults(TUNABLES) < pages // 20


RESTART = """
import os
from fglrepro.allocator import keeps_freed_memory, restart_keeping_freed_memory
print("start", keeps_freed_memory(), flush=True)
restart_keeping_freed_memory()
print(os.environ["GLIBC_TUNABLES"])
"""


def test_restart_adds_the_settings_once_and_keeps_the_users():
    env = {**os.environ, "GLIBC_TUNABLES": "glibc.malloc.arena_max=2"}
    proc = subprocess.run([sys.executable, "-c", RESTART], env=env, capture_output=True, text=True, check=True)
    assert proc.stdout.splitlines() == ["start False", "start True", f"glibc.malloc.arena_max=2:{TUNABLES}"]
