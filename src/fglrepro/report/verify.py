"""Check that the committed snapshot reproduces here: rebuild a seeded sample of the runs of
``docs/results/runs.csv`` through the workflow in a scratch results folder and compare every metric.

``fgl-report verify --sample N`` picks N ``ok`` rows (:func:`select_runs`: a seeded draw among the
cheap ones, by the wall time the row recorded, run cheapest first; FedSage+ only when named), asks
Snakemake for their run JSONs (:func:`snakemake_command`), compares test accuracy, macro-F1, best
round and rounds run with the row (:func:`compare`: ``equal``, ``within`` :data:`TOLERANCE` points,
or ``differs``) and prints them with the machine's floating-point stack
(:func:`fglrepro.provenance.machine`). With ``--grid`` a grid row's other points are rebuilt too,
and the point validation picks is compared with the row's.

``fgl-report compare-results --results DIR`` rebuilds nothing: it compares the run JSONs a finished
workflow left under ``DIR`` with the snapshot's rows that name them (:func:`compare_results`) and sums
the verdicts and differences per study, run and the commit that made the row
(:func:`comparison_summary`): does a full run reproduce the snapshot, and where not, which stored code
does it differ from.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

import pandas as pd

#: largest difference (percentage points) of test accuracy or macro-F1 still reported as ``within``
#: tolerance; the bound the README states for a rebuild on another machine.
TOLERANCE = 0.05
#: metrics compared, runs.csv column -> how to read it from a run JSON's ``metrics``.
METRICS = {
    "test_acc": lambda m: 100 * m["best"]["test_acc"],
    "test_f1_macro": lambda m: 100 * m["best"]["test_f1_macro"],
    "best_round": lambda m: m["best"]["round"],
    "rounds_run": lambda m: m["final"]["round"],
}
#: the metrics compared with :data:`TOLERANCE`; the others (rounds) must be equal.
TOLERANT = ("test_acc", "test_f1_macro")
#: methods never drawn unless named (hours per run and GBs of checkpoints).
EXPENSIVE = ("fedsage_plus",)
#: the verdicts of :func:`classify`, best first.
VERDICTS = ("equal", "within", "differs", "failed")


def _choices_error(what: str, bad: Sequence, valid: Sequence) -> None:
    from fglrepro.config import ConfigError

    if bad:
        raise ConfigError(f"unknown {what} {sorted(bad)}; valid: {sorted(valid)}")


def candidate_rows(runs: pd.DataFrame, studies: Sequence[str] = (), methods: Sequence[str] = (),
                   max_seconds: float | None = None, device: str = "cpu") -> pd.DataFrame:
    """The ``ok`` rows of ``runs`` (runs.csv) that may be drawn: of ``studies`` and ``methods``
    (empty: all), whose recorded ``wall_s`` is at most ``max_seconds`` (None: any), made on the kind
    of ``device`` the rebuild uses (``cpu`` / ``cuda``: a CUDA run is not rebuilt on a CPU, nor the
    reverse; rows without a device count as CPU runs), and not of an :data:`EXPENSIVE` method unless
    ``methods`` names it. An unknown study or method raises :class:`~fglrepro.config.ConfigError`
    listing the valid ones."""
    _choices_error("study", set(studies) - set(runs["study"]), set(runs["study"]))
    _choices_error("method", set(methods) - set(runs["method"]), set(runs["method"]))
    keep = runs["status"] == "ok"
    made_on = runs["device"].fillna("cpu") if "device" in runs else pd.Series("cpu", index=runs.index)
    keep &= made_on.astype(str).str.split(":").str[0] == device
    if studies:
        keep &= runs["study"].isin(studies)
    keep &= runs["method"].isin(methods) if methods else ~runs["method"].isin(EXPENSIVE)
    if max_seconds is not None:
        keep &= runs["wall_s"] <= max_seconds
    return runs[keep]


def select_runs(runs: pd.DataFrame, n: int, seed: int = 0, studies: Sequence[str] = (),
                methods: Sequence[str] = (), max_seconds: float | None = 120.0, device: str = "cpu"
                ) -> pd.DataFrame:
    """``n`` rows drawn uniformly with ``seed`` from :func:`candidate_rows` (all of them when
    fewer), in the order of their recorded ``wall_s``, cheapest first (so that an interrupted
    verification has checked the most rows)."""
    pool = candidate_rows(runs, studies, methods, max_seconds, device)
    chosen = pool.sample(n=min(n, len(pool)), random_state=seed)
    return chosen.sort_values("wall_s", kind="stable")


def classify(committed: float, rebuilt: float | None, tolerance: float = TOLERANCE) -> str:
    """``equal`` (the same float), ``within`` (``|rebuilt - committed| <= tolerance``),
    ``differs``, or ``failed`` (no rebuilt value)."""
    if rebuilt is None or (isinstance(rebuilt, float) and math.isnan(rebuilt)):
        return "failed"
    if rebuilt == committed:
        return "equal"
    return "within" if abs(rebuilt - committed) <= tolerance else "differs"


def rebuilt_metrics(record: Mapping | None) -> dict[str, float | None]:
    """The :data:`METRICS` of a rebuilt run JSON (all None when it is missing or not ``ok``)."""
    if not record or record.get("status") != "ok":
        return dict.fromkeys(METRICS)
    return {key: read(record["metrics"]) for key, read in METRICS.items()}


def compare(row: Mapping, record: Mapping | None, tolerance: float = TOLERANCE) -> dict:
    """One row of the verification: the row's ids, per metric the committed and rebuilt values and
    :func:`classify`'s verdict (rounds must be equal: a round is ``differs`` unless equal), and the
    row's verdict, the worst of its metrics'."""
    rebuilt = rebuilt_metrics(record)
    out = {key: row[key] for key in ("study", "run", "grid_point", "method", "dataset", "clients", "seed")}
    verdicts = []
    for key, value in rebuilt.items():
        verdict = classify(row[key], value, tolerance if key in TOLERANT else 0.0)
        out |= {key: row[key], f"{key}_rebuilt": value, f"{key}_verdict": verdict}
        verdicts.append(verdict)
    out["verdict"] = max(verdicts, key=VERDICTS.index)
    return out


def snakemake_command(targets: Sequence[str], studies: Sequence[str], results_dir: str, data_dir: str,
                      cores: int = 1, extra: Sequence[str] = (), settings: Sequence[str] = ()) -> list[str]:
    """The Snakemake call that builds run JSONs ``targets`` of ``studies`` with results and data
    in ``results_dir`` and ``data_dir`` (every dataset allowed, failed jobs not stopping the
    others); ``settings``: more ``key=value`` config items (:func:`input_paths`)."""
    return [sys.executable, "-m", "snakemake", "--cores", str(cores), "--keep-going", *extra, "--config",
            f"studies=[{','.join(sorted(set(studies)))}]", "only_datasets=all", f"results_dir={results_dir}",
            f"data_dir={data_dir}", *settings, "--", *targets]


def input_paths(source: Path, checkout: Path) -> list[str]:
    """``key=value`` config items that point an exported tree ``source`` at the input folders of the
    ``checkout`` verify runs from: its ``config/config.yaml``'s ``mirror`` roots (:func:`mirror_roots`) and
    ``partition_dir``, made absolute, since a relative ``../shared/datasets`` would otherwise be looked up
    beside the scratch copy. Only keys the exported tree's own config has are set (an older commit may not
    know them)."""
    from fglrepro.data.download import mirror_roots
    from fglrepro.io import read_yaml

    if not (checkout / "config" / "config.yaml").is_file() or not (source / "config" / "config.yaml").is_file():
        return []
    known, here = read_yaml(source / "config" / "config.yaml"), read_yaml(checkout / "config" / "config.yaml")
    items = []
    if "mirror" in known and "mirror" in here:
        roots = [str((checkout / root).resolve()) for root in mirror_roots(here["mirror"])]
        items.append(f"mirror=[{','.join(roots)}]")
    if "partition_dir" in known and here.get("partition_dir"):
        items.append(f"partition_dir={(checkout / here['partition_dir']).resolve()}")
    return items


def grid_targets(row: Mapping, grid: Mapping[str, list], results_dir: str) -> dict[str, str]:
    """Point id -> run JSON for every point of ``grid`` (the study entry's ``grid``) at the row's
    dataset, scheme, clients and seed, in grid order."""
    from fglrepro.grid import grid_points, point_id
    from fglrepro.report.snapshot import run_target

    ids = [point_id(values) for values in grid_points(grid)]
    return {point: run_target({**row, "grid_point": point}, results_dir) for point in ids}


def selected_point(records: Sequence[Mapping | None], points: Sequence[str]) -> str | None:
    """The grid point validation picks among rebuilt ``records`` (one per point of ``points``,
    None when missing), as the workflow picks it (:func:`fglrepro.grid.select_grid_points`)."""
    from fglrepro.grid import validation_score

    scores = [validation_score(r) if r else float("-inf") for r in records]
    return None if max(scores) == float("-inf") else points[scores.index(max(scores))]


def read_record(path: str | Path) -> dict | None:
    """A run JSON, or None when it was not written."""
    path = Path(path)
    return json.loads(path.read_text()) if path.is_file() else None


def format_value(value) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return f"{value:.4f}" if isinstance(value, float) else str(value)


def format_report(rows: Sequence[Mapping], machine: Mapping, tolerance: float = TOLERANCE) -> str:
    """The text ``fgl-report verify`` prints: the machine, one line per metric of each row
    (committed, rebuilt, difference, verdict), and the verdict counts."""
    lines = [f"machine: {machine['cpu_model']} ({machine['cpu_count']} CPUs), {machine['platform']}",
             f"torch {machine['torch_version']}, CPU kernels {machine['cpu_capability']}, MKL {machine['mkl']}, "
             f"OpenMP {machine['openmp']}, oneDNN {machine['mkldnn']}, threads {machine['threads']}, "
             f"environment {machine['env'] or 'none set'}", machine["parallel_info"].rstrip(),
             machine["torch_build"].rstrip(), "", f"tolerance: {tolerance} points (accuracy, macro-F1); rounds "
             "must be equal", ""]
    for row in rows:
        point = f"@{row['grid_point']}" if isinstance(row.get("grid_point"), str) else ""
        lines.append(f"{row['verdict'].upper():8s} {row['study']} {row['run']}{point} {row['dataset']}-"
                     f"{row['clients']} seed {row['seed']}, rebuilt at {row.get('rebuilt_at', 'HEAD')[:10]}")
        for key in METRICS:
            committed, rebuilt = row[key], row[f"{key}_rebuilt"]
            delta = "-" if rebuilt is None else f"{rebuilt - committed:+.4f}" if key in TOLERANT else \
                f"{int(rebuilt - committed):+d}"
            lines.append(f"    {key:14s} committed {format_value(committed):>9s} rebuilt {format_value(rebuilt):>9s} "
                         f"diff {delta:>8s}  {row[f'{key}_verdict']}")
        if "selected_point" in row:
            same = "same" if row["selected_point"] == row["grid_point"] else "DIFFERENT"
            lines.append(f"    grid point     committed {row['grid_point']} rebuilt selection "
                         f"{row['selected_point']} ({same})")
    counts = pd.Series([row["verdict"] for row in rows], dtype=object).value_counts()
    lines += ["", f"{len(rows)} runs: " + ", ".join(f"{counts.get(v, 0)} {v}" for v in VERDICTS)]
    return "\n".join(lines) + "\n"


def row_commit(row: Mapping) -> str | None:
    """The commit that made a row (``git_commit``), or None when runs.csv does not know it."""
    commit = row.get("git_commit")
    return commit if isinstance(commit, str) and commit not in ("", "unknown") else None


def export_commit(commit: str, into: Path, repo: str | Path = ".") -> Path:
    """The source tree of ``commit`` of the git repository ``repo`` (``git archive``), written to
    ``into`` once and reused; a commit the clone does not hold raises
    :class:`~fglrepro.config.ConfigError`."""
    from fglrepro.config import ConfigError

    if (into / "Snakefile").is_file():
        return into
    archive = subprocess.run(["git", "-C", str(repo), "archive", commit], capture_output=True)
    if archive.returncode != 0:
        why = archive.stderr.decode().strip()
        raise ConfigError(f"commit {commit} of runs.csv is not in the repository at {repo} ({why}); fetch it "
                          "(a full clone) or rebuild with the current tree (--at-head)")
    into.mkdir(parents=True, exist_ok=True)
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive.stdout, check=True)
    return into


def compare_results(runs: pd.DataFrame, results_dir: str | Path, studies: Sequence[str] = (),
                    tolerance: float = TOLERANCE) -> tuple[pd.DataFrame, list[str]]:
    """Compare the run JSONs already under ``results_dir`` with the ``ok`` rows of ``runs`` (runs.csv)
    of ``studies`` (empty: all) that name them (:func:`~fglrepro.report.snapshot.run_target`), without
    running anything. Returns one :func:`compare` row per row whose run JSON exists (``*_rebuilt``: the
    JSON's values), with the row's ``git_commit`` and the JSON's own (``made_at``); and the run JSONs of
    those studies under ``results_dir/runs`` that no row names (e.g. a grid's unselected points), sorted.
    An unknown study raises :class:`~fglrepro.config.ConfigError` listing the valid ones."""
    from fglrepro.report.snapshot import run_target

    _choices_error("study", set(studies) - set(runs["study"]), set(runs["study"]))
    keep = runs["status"] == "ok"
    if studies:
        keep &= runs["study"].isin(studies)
    out, named = [], set()
    for row in runs[keep].to_dict("records"):
        target = Path(run_target(row, str(results_dir)))
        if (record := read_record(target)) is not None:
            named.add(target)
            out.append({**compare(row, record, tolerance), "git_commit": row_commit(row),
                        "made_at": record.get("git_commit")})
    found = Path(results_dir, "runs").glob("*/*/*/*/*/seed*.json")
    others = sorted(str(p) for p in found if p not in named and (not studies or p.parts[-6] in studies))
    return pd.DataFrame(out), others


def comparison_summary(compared: pd.DataFrame) -> pd.DataFrame:
    """Per study, run and stored commit (``commit``, 7 hex digits) of :func:`compare_results`'s rows:
    ``runs``, the count of each of :data:`VERDICTS`, and the test accuracy's difference in points
    (results - snapshot): ``median_abs_diff``, ``max_abs_diff`` and the signed ``mean_diff``."""
    diff = compared["test_acc_rebuilt"].astype(float) - compared["test_acc"]
    frame = compared.assign(diff=diff, abs_diff=diff.abs(),
                            commit=compared["git_commit"].fillna("unknown").str[:7])
    groups = frame.groupby(["study", "run", "commit"], sort=True)
    table = groups.size().rename("runs").to_frame()
    for verdict in VERDICTS:
        table[verdict] = groups["verdict"].agg(lambda s, v=verdict: int((s == v).sum()))
    table["median_abs_diff"] = groups["abs_diff"].median()
    table["max_abs_diff"] = groups["abs_diff"].max()
    table["mean_diff"] = groups["diff"].mean()
    return table.reset_index()


def format_comparison(compared: pd.DataFrame, others: Sequence[str], results_dir: str | Path,
                      tolerance: float = TOLERANCE) -> str:
    """The text ``fgl-report compare-results`` prints: :func:`comparison_summary`, the verdict
    counts, and how many run JSONs no snapshot row names."""
    summary = comparison_summary(compared)
    counts = compared["verdict"].value_counts()
    lines = [f"run JSONs under {results_dir} against the snapshot's rows; tolerance {tolerance} points "
             "(accuracy, macro-F1), rounds must be equal; diff = results - snapshot, test accuracy (points)", "",
             summary.to_string(index=False, float_format=lambda v: f"{v:.4f}"), "",
             f"{len(compared)} runs: " + ", ".join(f"{counts.get(v, 0)} {v}" for v in VERDICTS),
             f"{len(others)} run JSONs that no ok row of the snapshot names (a grid's other points, runs it lacks)"]
    return "\n".join(lines) + "\n"


def verify(chosen: pd.DataFrame, work_dir: str | Path, cores: int = 1,
           grids: Mapping[tuple[str, str], Mapping] | None = None, tolerance: float = TOLERANCE,
           at_head: bool = False, data_dir: str | Path | None = None, extra: Sequence[str] = ()) -> list[dict]:
    """Rebuild the ``chosen`` rows (and with ``grids``, ``(study, run) -> grid``, every point of
    their grids) and :func:`compare` each with its committed row; a grid row gets
    ``selected_point``, the point validation picks among the rebuilt ones.

    Each row is rebuilt by the code of its own ``git_commit`` (:func:`export_commit`; one
    Snakemake call per commit, run in that tree with its package first on ``PYTHONPATH``), or with
    ``at_head`` (or an unknown commit) by the current tree; every rebuild reads raw files and published
    partitions from the current tree's folders (:func:`input_paths`). Results and prepared data go to
    ``work_dir/<commit>/`` (data to ``data_dir`` when given)."""
    import os

    from fglrepro.report.snapshot import run_target

    rows = chosen.to_dict("records")
    groups: dict[str, list[int]] = {}
    for i, row in enumerate(rows):
        groups.setdefault("HEAD" if at_head else row_commit(row) or "HEAD", []).append(i)
    out: dict[int, dict] = {}
    for commit, members in groups.items():
        base = (Path(work_dir) / commit[:10]).resolve()
        source = Path.cwd() if commit == "HEAD" else export_commit(commit, base / "source")
        env = dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}")
        if commit != "HEAD":
            env["PYTHONPATH"] = os.pathsep.join([str(source / "src"), *filter(None, [env.get("PYTHONPATH")])])
        results_dir = str(base / "results")
        data = str(Path(data_dir).resolve()) if data_dir else str(base / "data")
        targets = {i: run_target(rows[i], results_dir) for i in members}
        gridded = [i for i in members if isinstance(rows[i].get("grid_point"), str)
                   and (rows[i]["study"], rows[i]["run"]) in (grids or {})]
        points = {i: grid_targets(rows[i], grids[rows[i]["study"], rows[i]["run"]], results_dir) for i in gridded}
        wanted = list(dict.fromkeys([*targets.values(), *(t for grid in points.values() for t in grid.values())]))
        command = snakemake_command(wanted, [rows[i]["study"] for i in members], results_dir, data, cores, extra,
                                    input_paths(source, Path.cwd()))
        subprocess.run(command, cwd=source, env=env, check=False)
        for i in members:
            out[i] = {**compare(rows[i], read_record(targets[i]), tolerance), "rebuilt_at": commit}
            if i in points:
                out[i]["selected_point"] = selected_point([read_record(t) for t in points[i].values()],
                                                          list(points[i]))
    return [out[i] for i in range(len(rows))]
