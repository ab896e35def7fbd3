"""The memory a training job declares (Snakemake's ``mem_mb``) from the peaks the results snapshot measured.

``mem_mb`` is what a scheduler reserves for a job: ``snakemake --resources mem_mb=N`` runs jobs side by side
only while their declarations fit in N, and a SLURM profile requests it for the job, which the cluster
enforces (a job above its request is killed). A dataset's size class (``small`` 2000 MB, ...) is a guess;
every run folded into ``docs/results/runs.csv`` since 2026-11-29 records its peak resident memory
(``peak_memory_mb``, MiB, of the whole ``fgl-train`` process on the CPU), so a job that ran before declares
:data:`MARGIN` times its highest measured peak instead (:func:`declared_mb`).
"""

from __future__ import annotations

import csv
import math
from pathlib import Path

from fglrepro.grid import split_run_id

#: Declared memory over the highest measured peak (runs of other seeds differ a little; a scheduler's
#: own accounting counts page cache and libraries alike).
MARGIN = 1.25
#: Declarations are rounded up to multiples of this many MB, and are at least :data:`FLOOR_MB`.
STEP_MB = 500
FLOOR_MB = 1000
MIB = 1.048576  # MB (10^6 bytes) per MiB: run JSONs record MiB, Snakemake's mem_mb is MB


def measured_peaks(runs_csv: str | Path) -> dict[tuple, float]:
    """Highest ``peak_memory_mb`` (MiB) of the ``ok`` CPU runs of a snapshot's ``runs.csv``, by
    ``(study, run, dataset, clients)`` and by ``(run, dataset, clients)``; empty when the file is absent
    (a CUDA run's peak is its GPU memory, not the process's, and is left out)."""
    try:
        with open(runs_csv, newline="") as handle:
            rows = list(csv.DictReader(handle))
    except OSError:
        return {}
    peaks: dict[tuple, float] = {}
    for row in rows:
        if row.get("status") != "ok" or row.get("device") != "cpu" or not row.get("peak_memory_mb"):
            continue
        cell = (row["run"], row["dataset"], int(row["clients"]))
        for key in ((row["study"], *cell), cell):
            peaks[key] = max(peaks.get(key, 0.0), float(row["peak_memory_mb"]))
    return peaks


def declared_mb(peak_mib: float) -> int:
    """``mem_mb`` for a measured peak of ``peak_mib`` MiB: :data:`MARGIN` times the peak in MB, rounded up to
    a multiple of :data:`STEP_MB`, at least :data:`FLOOR_MB`."""
    return max(FLOOR_MB, STEP_MB * math.ceil(MARGIN * peak_mib * MIB / STEP_MB))


def measured_mem_mb(peaks: dict[tuple, float], study: str, run: str, dataset: str, clients: int) -> int | None:
    """:func:`declared_mb` of the highest peak of the study's run on ``dataset`` with ``clients`` clients (a
    grid point's run id counts as its row), else of that row on the dataset and client count in any study,
    else None (never measured)."""
    cell = (split_run_id(run)[0], dataset, int(clients))
    peak = peaks.get((study, *cell), peaks.get(cell))
    return None if peak is None else declared_mb(peak)
