"""How far a workflow run is, and about how long it has left, printed while Snakemake runs.

The Snakefile's ``onstart`` hands :func:`start` the run JSON paths of the training jobs Snakemake
will run (its DAG: explicit targets, ``--config`` restrictions and reruns of outdated runs
included); a daemon thread then prints, every ``every_s`` seconds, a line such as::

    progress: 12 of 120 training runs done (10 %), 3.2 CPU-min so far; about 25 min left at 2 at a time

The estimate adds the CPU seconds of the runs still to do and divides by the number of jobs that run at once. A run
the committed snapshot times (``docs/results/runs.csv``, :func:`stored_costs`: the CPU time, else wall time, of the
same job; for a grid point, of the points the snapshot kept for that cell; for a seed the snapshot lacks, of the
cell's other seeds; else of the same row on the same dataset and client count in another study or partition
scheme, :func:`planned_costs`) counts with that time, scaled by how this run's finished runs of the same
method compare with their stored times (of all methods until one of its own has finished), as the line says ("N runs
estimated from docs/results"). Another run counts with the median ``cpu_s`` of the runs of its method finished so
far; the rest are named instead of guessed ("not counted: ..."). A per-job time keeps the estimate right when the
dearest jobs run first (Snakemake's ``priority``, :mod:`fglrepro.resources`): a method's first finished runs are
then its longest, and their median would count every later run as long.
"""

from __future__ import annotations

import csv
import json
import statistics
import sys
import threading
import time
from collections.abc import Iterable
from pathlib import Path
from typing import TextIO

from fglrepro.grid import split_run_id
from fglrepro.processes import process_alive


def finished_cost(path: Path, since: float = 0.0) -> tuple[str, float] | None:
    """``(method, CPU seconds)`` of a run JSON finished at or after ``since`` (a ``time.time()``),
    or None (absent, older, or unreadable yet)."""
    try:
        if path.stat().st_mtime < since:
            return None
        record = json.loads(path.read_text())
        return record["method"], float(record.get("cpu_s", record["wall_s"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def run_key(path: str | Path) -> tuple[str, ...]:
    """A run JSON's path from its study on (``<study>/<run>/<dataset>/<scheme>/k<K>/seed<S>.json``), the same
    whatever the results folder."""
    return Path(path).parts[-6:]


def stored_costs(runs_csv: str | Path) -> dict[tuple[str, ...], float]:
    """``run_key -> seconds`` of the finished runs of a snapshot's ``runs.csv`` (``target``): ``cpu_s`` where
    recorded; for a run folded before runs recorded it, the median ``cpu_s`` of the other seeds of its cell
    (:func:`run_key` without the seed) where one did, else its ``wall_s`` (which under load is several times the
    CPU time). Empty when the file is absent."""
    try:
        with open(runs_csv, newline="") as handle:
            rows = [row for row in csv.DictReader(handle) if row.get("status") == "ok" and row.get("target")]
    except OSError:
        return {}
    cpu = {run_key(row["target"]): float(row["cpu_s"]) for row in rows if row.get("cpu_s")}
    by_cell: dict[tuple[str, ...], list[float]] = {}
    for key, seconds in cpu.items():
        by_cell.setdefault(key[:-1], []).append(seconds)
    out = {}
    for row in rows:
        key = run_key(row["target"])
        if key in cpu:
            out[key] = cpu[key]
        elif key[:-1] in by_cell:
            out[key] = statistics.median(by_cell[key[:-1]])
        elif row.get("wall_s"):
            out[key] = float(row["wall_s"])
    return out


def cell_key(key: tuple[str, ...]) -> tuple[str, ...]:
    """A :func:`run_key` without its grid point: the same for every point of a grid run's cell."""
    study, run, *rest = key
    return (study, split_run_id(run)[0], *rest)


def row_key(cell: tuple[str, ...]) -> tuple[str, ...]:
    """A :func:`cell_key`'s row, dataset and client count: the same in every study and partition scheme."""
    _, row, dataset, _, clients, _ = cell
    return row, dataset, clients


def planned_costs(paths: Iterable[Path], stored: dict[tuple[str, ...], float]) -> dict[Path, float]:
    """``path -> seconds`` of the planned run JSONs ``paths`` that ``stored`` (:func:`stored_costs`) times: the
    same job; else, for a grid point the snapshot does not keep (it keeps the point each cell chose), the median
    of the cell's stored points of the same seed; else the median of the cell's stored runs of other seeds (a seed
    not run yet costs about what the cell's other seeds did); else the median of the stored runs of the same row
    on the same dataset and client count in other studies or partition schemes (e.g. FedGM+ft on Computers-10 in
    O-pFGL's Louvain table for its Metis table; what :func:`fglrepro.resources.lookup` declares from)."""
    by_cell: dict[tuple[str, ...], list[float]] = {}
    by_seedless_cell: dict[tuple[str, ...], list[float]] = {}
    by_row: dict[tuple[str, ...], list[float]] = {}
    for key, cost in stored.items():
        cell = cell_key(key)
        by_cell.setdefault(cell, []).append(cost)
        by_seedless_cell.setdefault(cell[:-1], []).append(cost)
        by_row.setdefault(row_key(cell), []).append(cost)
    out = {}
    for path in paths:
        key = run_key(path)
        cell = cell_key(key)
        if key in stored:
            out[path] = stored[key]
        elif split_run_id(key[1])[1] is not None and cell in by_cell:
            out[path] = statistics.median(by_cell[cell])
        elif cell[:-1] in by_seedless_cell:
            out[path] = statistics.median(by_seedless_cell[cell[:-1]])
        elif row_key(cell) in by_row:
            out[path] = statistics.median(by_row[row_key(cell)])
    return out


def duration(seconds: float) -> str:
    """``under a minute``, ``about 25 min`` or ``about 3 h 05 min``."""
    minutes = round(seconds / 60)
    if minutes < 1:
        return "under a minute"
    return f"about {minutes} min" if minutes < 90 else f"about {minutes // 60} h {minutes % 60:02d} min"


class Progress:
    """Training runs of one workflow run: ``planned`` is ``(run JSON path, method)`` per job the
    run makes. A run counts as finished once its JSON, written at or after ``since`` (default: when
    this is made), can be read: an outdated run JSON that the workflow redoes is there, older, until
    its job replaces it. ``stored`` (:func:`stored_costs`) gives the snapshot's seconds of the planned runs it
    times; they are looked up once, here."""

    def __init__(self, planned: Iterable[tuple[str | Path, str]], workers: int, since: float | None = None,
                 stored: dict[tuple[str, ...], float] | None = None) -> None:
        self.todo = {Path(path): method for path, method in planned}
        self.workers = max(1, workers)
        self.since = time.time() if since is None else since
        self.stored = planned_costs(self.todo, stored or {})
        self.costs: dict[Path, tuple[str, float]] = {}

    def update(self) -> None:
        """Read the runs finished since the last call."""
        for path in self.todo.keys() - self.costs.keys():
            cost = finished_cost(path, self.since)
            if cost is not None:
                self.costs[path] = cost

    def speed(self) -> dict[str | None, float]:
        """``method -> `` CPU seconds of this run's finished runs of that method that the snapshot times, over
        their stored seconds; ``None ->`` the same over every method (1.0 before any such run finished)."""
        sums: dict[str | None, list[float]] = {None: [0.0, 0.0]}
        for path, (method, cpu) in self.costs.items():
            if path in self.stored:
                for key in (method, None):
                    pair = sums.setdefault(key, [0.0, 0.0])
                    pair[0] += cpu
                    pair[1] += self.stored[path]
        return {key: (spent / stored if stored > 0 else 1.0) for key, (spent, stored) in sums.items()}

    def line(self) -> str:
        """The progress line (see the module)."""
        done, total = len(self.costs), len(self.todo)
        spent = sum(cpu for _, cpu in self.costs.values())
        text = f"progress: {done} of {total} training runs done ({100 * done / max(total, 1):.0f} %)"
        text += f", {spent / 60:.1f} CPU-min so far"
        left = [(path, method) for path, method in self.todo.items() if path not in self.costs]
        if not left:
            return text
        by_method: dict[str, list[float]] = {}
        for method, cpu in self.costs.values():
            by_method.setdefault(method, []).append(cpu)
        speed = self.speed()
        estimated = [self.stored[p] * speed.get(m, speed[None]) for p, m in left if p in self.stored]
        timed = [statistics.median(by_method[m]) for p, m in left if p not in self.stored and m in by_method]
        unknown = [m for p, m in left if p not in self.stored and m not in by_method]
        if timed or estimated:
            at_once = min(self.workers, len(left))
            text += f"; {duration((sum(timed) + sum(estimated)) / at_once)} left at {at_once} at a time"
        notes = [f"{len(estimated)} runs estimated from docs/results"] if estimated else []
        if unknown:
            notes.append(f"not counted: {len(unknown)} runs of {', '.join(sorted(set(unknown)))}, not timed yet")
        return text + (f" ({'; '.join(notes)})" if notes else "")


def start(planned: Iterable[tuple[str | Path, str]], workers: int, every_s: float = 60.0,
          first_after_s: float = 30.0, stream: TextIO = sys.stderr,
          stored: dict[tuple[str, ...], float] | None = None) -> threading.Thread:
    """Print :meth:`Progress.line` ``first_after_s`` seconds after the start (so that the first
    line comes within a run's first minute, DAG building included) and then every ``every_s``
    seconds, from a daemon thread (it ends with the process); returns the thread. ``stored`` as in
    :class:`Progress`."""
    progress = Progress(planned, workers, stored=stored)

    def report() -> None:
        wait = first_after_s
        while True:
            time.sleep(wait)
            wait = every_s
            progress.update()
            print(progress.line(), file=stream, flush=True)

    thread = threading.Thread(target=report, name="fgl-progress", daemon=True)
    thread.start()
    return thread


# ---- a run that ends: jobs a signal stopped and how to go on, damaged run files; a lock held by another run


def cancel_rescheduling_timers() -> None:
    """Cancel the pending ``threading.Timer`` threads of this process (Snakemake's re-scheduling timers), so that
    Snakemake exits as soon as the workflow has ended.

    The workflow profile sets ``max-jobs-per-timespan`` to a one-minute window: Snakemake then looks over its ready
    jobs when a job ends and once a minute, instead of every second; each look stats every ready job's inputs
    (half a core with the ~450 ready jobs of the papers'-seeds main tables, ``benchmarks/MAIN_TABLES.md``). Each look
    leaves a timer, not a daemon thread, that would hold the finished process for up to that minute."""
    for thread in threading.enumerate():
        if isinstance(thread, threading.Timer):
            thread.cancel()


#: the line ``fgl-train`` logs when SIGTERM or SIGINT stops it (``fglrepro.cli.train``).
STOP_MARK = "stopped by SIG"


def marked_lines(log_dir: str | Path, since: float, mark: str) -> list[tuple[Path, list[str]]]:
    """``(log, its lines holding mark)`` of every log under ``log_dir`` written since ``since`` (a
    time.time()) with at least one such line."""
    found = []
    for path in sorted(Path(log_dir).rglob("*.log")) if Path(log_dir).is_dir() else []:
        try:
            if path.stat().st_mtime < since:
                continue
            lines = [line.strip() for line in path.read_text(errors="replace").splitlines() if mark in line]
        except OSError:
            continue
        if lines:
            found.append((path, lines))
    return found


def stopped_jobs(log_dir: str | Path, since: float) -> list[tuple[Path, str]]:
    """``(log, its stop line)`` of every training log under ``log_dir`` written since ``since``
    (a time.time()) that says the job was stopped by a signal."""
    return [(path, lines[-1]) for path, lines in marked_lines(log_dir, since, STOP_MARK)]


def stop_message(stopped: list[tuple[Path, str]]) -> str:
    """What a user reads after stopping a run: which training jobs stopped (with the round their
    checkpoint holds) and how to resume; ``""`` when no training job was stopped."""
    if not stopped:
        return ""
    lines = [f"The run was stopped: {len(stopped)} training job(s) stopped by a signal (Ctrl-C / SIGTERM), "
             "not failed. Their logs:"]
    lines += [f"  {path}: {line[line.index(STOP_MARK):]}" for path, line in stopped[:10]]
    lines += [f"  ... and {len(stopped) - 10} more"] if len(stopped) > 10 else []
    lines.append("To resume, run the same snakemake command again (add --rerun-incomplete if Snakemake asks for "
                 "it): finished jobs are kept and each stopped job resumes from its checkpoint (<run JSON>.ckpt).")
    return "\n".join(lines)


#: what ``fgl-aggregate`` logs for a run JSON it cannot read (``fglrepro.io.damaged_message``).
DAMAGED_MARK = "damaged file "


def damaged_runs_message(log_dir: str | Path, since: float) -> str:
    """What a user reads at the end of a run whose aggregation met damaged run JSONs (their cells say
    UNREADABLE; a plain rerun does not retrain them): each file and the command that rebuilds it, from
    the aggregate logs under ``log_dir`` written since ``since``; ``""`` when there was none."""
    lines = [line[line.index(DAMAGED_MARK):] for _, found in marked_lines(log_dir, since, DAMAGED_MARK)
             for line in found]
    if not lines:
        return ""
    head = [f"{len(lines)} run file(s) could not be read (cells UNREADABLE; a plain rerun does not retrain them):"]
    more = [f"  ... and {len(lines) - 10} more (logs/aggregate/)"] if len(lines) > 10 else []
    return "\n".join(head + lines[:10] + more)


#: where a running workflow records itself (under the working directory's .snakemake/).
ACTIVE_RUN = Path(".snakemake") / "fglrepro-active-run.json"


def record_active_run(pid: int, command: list[str], path: Path = ACTIVE_RUN) -> None:
    """Note that workflow process ``pid`` (run as ``command``) is running here."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"pid": pid, "started": time.strftime("%Y-%m-%d %H:%M:%S"),
                                "command": " ".join(command)}))


def clear_active_run(path: Path = ACTIVE_RUN) -> None:
    path.unlink(missing_ok=True)


def lock_hint(locks_dir: Path = Path(".snakemake") / "locks", path: Path = ACTIVE_RUN) -> str:
    """When the working directory is locked: whether the run that holds the lock is still going (then
    --unlock would let two runs write the same files) or gone (then --unlock is safe); ``""`` when
    nothing is locked."""
    if not locks_dir.is_dir() or not any(locks_dir.iterdir()):
        return ""
    try:
        active = json.loads(path.read_text())
    except (OSError, ValueError):
        return ("This directory is locked by a Snakemake run. Another run may be active: check (ps, other "
                "terminals) before `snakemake --unlock`, which is only safe once it has ended.")
    if process_alive(int(active["pid"])):
        return (f"Another run is active in this directory: pid {active['pid']}, started {active['started']} "
                f"(`{active['command']}`). Do NOT --unlock: wait for it, or stop it (Ctrl-C in its terminal or "
                f"kill -INT {active['pid']}) and start again.")
    return (f"The lock was left by a run that is gone (pid {active['pid']}, started {active['started']}): "
            "`snakemake --unlock` is safe, then rerun with --rerun-incomplete.")
