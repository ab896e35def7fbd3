"""What a training job declares to its scheduler, from what the results snapshot measured.

A job's ``mem_mb`` and ``runtime`` are what a scheduler reserves for it: ``snakemake --resources mem_mb=N`` runs
jobs side by side only while their declarations fit in N, and a SLURM profile requests both for the job, which
the cluster enforces (a job above its request is killed). A dataset's size class (``small`` 2000 MB and 30 min,
...) is a guess; every run folded into ``docs/results/runs.csv`` records its cost (``cpu_s``, else ``wall_s``) and,
since 2026-11-29, its peak resident memory (``peak_memory_mb``, MiB, of the whole ``fgl-train`` process on the
CPU). A job that ran before therefore declares :data:`MARGIN` times its highest measured peak
(:func:`declared_mb`), :data:`RUNTIME_MARGIN` times its highest measured cost (:func:`declared_minutes`), and
its measured cost as its Snakemake ``priority`` (:func:`priority`): the dearest jobs start first, so a run on
many cores does not end waiting for one long job that started last.
"""

from __future__ import annotations

import csv
import math
from pathlib import Path
from typing import NamedTuple

from fglrepro.grid import split_run_id

#: Declared memory over the highest measured peak (runs of other seeds differ a little; a scheduler's
#: own accounting counts page cache and libraries alike).
MARGIN = 1.25
#: Declarations are rounded up to multiples of this many MB, and are at least :data:`FLOOR_MB`.
STEP_MB = 500
FLOOR_MB = 1000
MIB = 1.048576  # MB (10^6 bytes) per MiB: run JSONs record MiB, Snakemake's mem_mb is MB
#: Declared runtime over the highest measured cost (one thread per job; a cluster's cores may be slower or
#: shared), rounded up to multiples of :data:`STEP_MINUTES`, at least :data:`FLOOR_MINUTES`.
RUNTIME_MARGIN = 3
STEP_MINUTES = 5
FLOOR_MINUTES = 10


class Measured(NamedTuple):
    """The highest peak memory (MiB) and cost (seconds) of a snapshot's ``ok`` CPU runs, each keyed by
    ``(study, run, dataset, clients)`` and by ``(run, dataset, clients)``."""

    peak_mib: dict[tuple, float]
    seconds: dict[tuple, float]


def measured(runs_csv: str | Path) -> Measured:
    """:class:`Measured` of a snapshot's ``runs.csv`` (empty when the file is absent). A CUDA run is left out
    (its peak is GPU memory and its time is not a CPU job's), and so is a run without the measurement. A cell's
    cost is its highest ``cpu_s``; the wall time counts only for a cell with no run that recorded its CPU time
    (runs folded before 2026-11-29), since a wall time taken under load can be several times the CPU time."""
    try:
        with open(runs_csv, newline="") as handle:
            rows = list(csv.DictReader(handle))
    except OSError:
        return Measured({}, {})
    found, cpu, wall = Measured({}, {}), {}, {}
    for row in rows:
        if row.get("status") != "ok" or row.get("device") != "cpu":
            continue
        cell = (row["run"], row["dataset"], int(row["clients"]))
        for table, value in ((found.peak_mib, row.get("peak_memory_mb")), (cpu, row.get("cpu_s")),
                             (wall, row.get("wall_s"))):
            if value:
                for key in ((row["study"], *cell), cell):
                    table[key] = max(table.get(key, 0.0), float(value))
    found.seconds.update(wall)
    found.seconds.update(cpu)
    return found


def lookup(table: dict[tuple, float], study: str, run: str, dataset: str, clients: int) -> float | None:
    """The measurement of the study's run on ``dataset`` with ``clients`` clients (a grid point's run id
    counts as its row), else of that row on the dataset and client count in any study, else None."""
    cell = (split_run_id(run)[0], dataset, int(clients))
    return table.get((study, *cell), table.get(cell))


def declared_mb(peak_mib: float) -> int:
    """``mem_mb`` for a measured peak of ``peak_mib`` MiB: :data:`MARGIN` times the peak in MB, rounded up to
    a multiple of :data:`STEP_MB`, at least :data:`FLOOR_MB`."""
    return max(FLOOR_MB, STEP_MB * math.ceil(MARGIN * peak_mib * MIB / STEP_MB))


def declared_minutes(seconds: float) -> int:
    """``runtime`` (minutes) for a measured cost of ``seconds``: :data:`RUNTIME_MARGIN` times it, rounded up to
    a multiple of :data:`STEP_MINUTES`, at least :data:`FLOOR_MINUTES`."""
    return max(FLOOR_MINUTES, STEP_MINUTES * math.ceil(RUNTIME_MARGIN * seconds / 60 / STEP_MINUTES))


def priority(seconds: float | None, default_minutes: int) -> int:
    """Snakemake ``priority`` of a training job: its measured cost in seconds, or, never measured, the runtime
    its size class allows (``default_minutes``): a job not measured counts as a long one, so it starts early
    rather than last."""
    return int(seconds) if seconds is not None else 60 * default_minutes
