"""Where a run was made: the source tree (commit, and whether it had uncommitted changes) and the
machine's floating-point stack (CPU model, torch build, BLAS / MKL / OpenMP, threads).

Two runs of the same spec give the same numbers only on the same code and, for some methods, the
same floating-point stack (:func:`machine`); a run records both so that a difference can be traced,
and the snapshot refuses runs made from a dirty tree (:func:`fglrepro.report.snapshot.check_clean`).
A tree is dirty for a run only where it differs from its commit in what a run executes or reads
(:data:`RUN_PATHS`): an edited benchmark script, test or document does not change a run's numbers.
"""

from __future__ import annotations

import os
import platform
import subprocess
from pathlib import Path

#: top-level folders of the repository that hold outputs, not source: changes there leave the tree clean.
OUTPUT_DIRS = ("results", "data")
#: top-level paths of the repository that a run executes or reads: the package, the studies and
#: settings, the workflow, the bundled raw files and the package's own metadata.
RUN_PATHS = ("src", "config", "workflow", "resources", "Snakefile", "pyproject.toml")
#: environment variables that change which kernels or how many threads torch's CPU backends use.
NUMERIC_ENV = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "MKL_CBWR", "MKL_ENABLE_INSTRUCTIONS", "ATEN_CPU_CAPABILITY",
               "ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA")


def _git(args: list[str], cwd: Path) -> str | None:
    """stdout of ``git <args>`` in ``cwd``, or None when git or the repository is not there."""
    try:
        out = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout if out.returncode == 0 else None


def dirty_paths(porcelain: str, ignore: tuple[str, ...] = OUTPUT_DIRS) -> list[str]:
    """The changed or untracked paths of ``git status --porcelain`` output, without those under
    the top-level folders ``ignore`` (outputs: results/, data/)."""
    paths = []
    for line in porcelain.splitlines():
        path = line[3:].split(" -> ")[-1].strip('"')
        if path and path.split("/", 1)[0] not in ignore:
            paths.append(path)
    return paths


def run_paths(paths: list[str]) -> list[str]:
    """Those of ``paths`` (repository-relative) that can change a run: under :data:`RUN_PATHS`."""
    return [path for path in paths if path.split("/", 1)[0] in RUN_PATHS]


def source_tree(where: str | Path | None = None) -> dict:
    """``git_commit`` (HEAD of the repository holding ``where``, default this package; ``unknown``
    outside a git checkout), ``git_dirty`` (whether tracked or untracked files under
    :data:`RUN_PATHS` differ from that commit; None when unknown) and ``git_dirty_paths`` (up to 20
    of them)."""
    cwd = Path(where or __file__).resolve()
    cwd = cwd if cwd.is_dir() else cwd.parent
    head = _git(["rev-parse", "HEAD"], cwd)
    if not head:
        return {"git_commit": "unknown", "git_dirty": None, "git_dirty_paths": []}
    top = _git(["rev-parse", "--show-toplevel"], cwd)
    status = _git(["status", "--porcelain", "--untracked-files=all"], Path(top.strip()) if top else cwd)
    paths = run_paths(dirty_paths(status)) if status is not None else None
    return {"git_commit": head.strip(), "git_dirty": None if paths is None else bool(paths),
            "git_dirty_paths": (paths or [])[:20]}


def cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo`` on Linux, else :func:`platform.processor`)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def machine() -> dict:
    """The floating-point stack a run used: CPU model, torch version, the CPU kernels' instruction
    set (``cpu_capability``), MKL / OpenMP / oneDNN availability and versions, intra- and inter-op
    thread counts, the numeric environment variables that are set, and torch's build
    configuration (``torch.__config__.show()``: compiler, BLAS, LAPACK, build flags)."""
    import torch

    return {
        "cpu_model": cpu_model(), "cpu_count": os.cpu_count(), "platform": platform.platform(),
        "torch_version": torch.__version__, "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "mkl": torch.backends.mkl.is_available(), "openmp": torch.backends.openmp.is_available(),
        "mkldnn": torch.backends.mkldnn.is_available(), "threads": torch.get_num_threads(),
        "interop_threads": torch.get_num_interop_threads(),
        "env": {key: os.environ[key] for key in NUMERIC_ENV if key in os.environ},
        "parallel_info": torch.__config__.parallel_info(), "torch_build": torch.__config__.show(),
    }


def provenance(where: str | Path | None = None) -> dict:
    """The fields a run JSON records about its origin: :func:`source_tree` and ``machine``
    (:func:`machine`)."""
    return {**source_tree(where), "machine": machine()}
