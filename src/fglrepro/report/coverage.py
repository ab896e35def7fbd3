"""The coverage matrix: per paper, each table and figure x dataset, how many of the paper's seeds
ran, or why none did.

Inputs are the study files (what each table needs: datasets, client counts, seeds, rows), the
runs of a results snapshot (``runs.csv``) or of a workflow run (``metrics/<study>.csv``), the
reported partition statistics (``config/paper/``) with the snapshot's ``<study>.partition_stats.csv``,
and a notes file (``docs/notes/coverage.yaml``) that says why a cell was not run where no file can
say it (CPU budget with its measured cost, a table without a study). A cell reads

- ``n of m``: n distinct seeds with an ``ok`` run of the study on the dataset, of the paper's m
  (:data:`fglrepro.report.claims.PAPER_SEEDS`); ``partial`` when a seed lacks some trained row or
  client count;
- else a reason (:data:`REASONS`), the first that applies: the dataset's raw files cannot be had offline
  (the package pins no digest for them), a note's reason, all the study's rows are marked
  ``not_reproducible``, the study has no trained rows (not implemented), or "not run yet" (the data is
  there, the runs are not).

A cell not complete on an offline dataset also says what is left: the training jobs of the paper's seeds
without an ``ok`` run and their CPU time at the snapshot's measured medians (:func:`remaining_cost`).

A run whose grid point the study's row no longer has (its ``grid`` changed after the run) does not
count: the cell lists the row under ``rows_stale`` and its jobs as left (:func:`current_runs`).

A note on a complete cell is out of date (:func:`stale_notes`; ``fgl-report coverage`` warns).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from fglrepro.config import ConfigError

#: Why a cell has no run. ``no data offline``: the raw files are not pinned in the package, so no
#: mirror can provide them (PubMed, Flickr, Reddit, ogbn-*, genius); the others as named.
REASONS = ("no data offline", "CPU budget", "not reproducible", "not implemented", "not run yet")
#: The files ``fgl-report coverage`` adds to a results snapshot.
FILES = ("COVERAGE.md", "COVERAGE.csv")
#: Columns of the coverage CSV, one row per (study or paper item, dataset).
COLUMNS = ["paper", "item", "study", "dataset", "status", "seeds_ok", "seeds_complete", "seeds_paper",
           "seeds_study", "rows_run", "rows_trained", "rows_missing", "rows_stale", "clients_run", "clients",
           "jobs_left", "cpu_h_left", "jobs_unknown_cost", "reason", "note"]


@dataclass(frozen=True)
class StudyPlan:
    """What one study file asks for.

    Attributes:
        study: file stem; paper, item: the paper and its ``table`` (``Table 2``, ``Figure 3``).
        datasets: the study's datasets in its order.
        clients: dataset -> client counts.
        seeds: the study's seeds.
        rows: run ids that train (not marked ``not_reproducible``); not_reproducible: the others.
        stats: the reported partition statistics file (``reported_partition_stats``), if any.
        methods: row -> its method (the row's id where the study names none).
        grid_points: row -> training jobs per (dataset, clients, seed): the points of its ``grid`` (1 without).
        point_ids: row -> the ids of its grid points (``tau_s=3.0,tau=0.5``; empty without a grid).
    """

    study: str
    paper: str
    item: str
    datasets: tuple[str, ...]
    clients: Mapping[str, tuple[int, ...]]
    seeds: tuple[int, ...]
    rows: tuple[str, ...]
    not_reproducible: tuple[str, ...] = ()
    stats: str | None = None
    methods: Mapping[str, str] = field(default_factory=dict)
    grid_points: Mapping[str, int] = field(default_factory=dict)
    point_ids: Mapping[str, frozenset[str]] = field(default_factory=dict)


def plan_from_study(name: str, study: Mapping) -> StudyPlan:
    """A :class:`StudyPlan` of the study file ``name`` (its parsed YAML ``study``)."""
    from fglrepro.grid import grid_points, point_id

    datasets = tuple(study["datasets"])
    clients = study.get("clients", [])
    per_dataset = {d: tuple(clients.get(d, ())) if isinstance(clients, Mapping) else tuple(clients) for d in datasets}
    runs = study.get("runs") or {}
    return StudyPlan(
        study=name, paper=study["paper"], item=study["table"], datasets=datasets, clients=per_dataset,
        seeds=tuple(study.get("seeds", ())),
        rows=tuple(r for r, entry in runs.items() if "not_reproducible" not in entry),
        not_reproducible=tuple(r for r, entry in runs.items() if "not_reproducible" in entry),
        stats=study.get("reported_partition_stats"),
        methods={r: entry.get("method", r) for r, entry in runs.items()},
        grid_points={r: math.prod(len(values) for values in (entry.get("grid") or {}).values())
                     for r, entry in runs.items()},
        point_ids={r: frozenset(map(point_id, grid_points(entry["grid"]))) if entry.get("grid") else frozenset()
                   for r, entry in runs.items()},
    )


def plans_from_dir(study_dir: str | Path) -> list[StudyPlan]:
    """Every study file of ``study_dir`` as a :class:`StudyPlan`, in file name order."""
    from fglrepro.io import read_yaml

    return [plan_from_study(path.stem, read_yaml(path)) for path in sorted(Path(study_dir).glob("*.yaml"))]


def offline_datasets(datasets: Mapping, pinned: Mapping[str, str]) -> set[str]:
    """Names of the registry's ``datasets`` whose raw files all have a pinned digest: those a mirror
    (the bundled Planetoid files, ``../shared/datasets``) provides offline, verified."""
    return {name for name, spec in datasets.items() if set(spec.raw_files) <= set(pinned)}


def current_runs(plan: StudyPlan, runs: pd.DataFrame) -> tuple[pd.DataFrame, list[str]]:
    """``(current, stale)``: the runs of ``runs`` (of ``plan``'s study) made at a grid point their row still has
    (no point for a row without a grid), and the rows of ``plan`` with runs that are not (made before the row's
    ``grid`` changed: they stay in the snapshot's tables but no longer count as done)."""
    if "grid_point" not in runs or runs.empty:
        return runs, []
    points = runs["grid_point"].map(lambda v: "" if pd.isna(v) else str(v))
    current = pd.Series([point in plan.point_ids.get(row, frozenset()) if point else not plan.point_ids.get(row)
                         for row, point in zip(runs["run"], points)], index=runs.index, dtype=bool)
    stale = set(runs.loc[~current, "run"])
    return runs[current], [row for row in plan.rows if row in stale]


def complete_seeds(runs: pd.DataFrame, rows: Iterable[str], clients: Iterable[int]) -> list[int]:
    """Seeds of ``runs`` (``ok`` runs of one study and dataset) in which every trained row ran
    ok with every client count."""
    need = {(r, int(k)) for r in rows for k in clients}
    have = runs.groupby("seed").apply(lambda g: set(zip(g["run"], g["clients"].astype(int))), include_groups=False)
    return sorted(int(seed) for seed, cells in have.items() if need <= cells)


def matching_note(notes: list[dict], study: str, dataset: str) -> dict | None:
    """The first note about ``study`` that names ``dataset`` (or no dataset: all of them)."""
    return next((n for n in notes if n["study"] == study and dataset in n.get("datasets", [dataset])), None)


def row_costs(runs: pd.DataFrame) -> dict[tuple, float]:
    """Median CPU seconds (``cpu_s``) of the ``ok`` runs of ``runs`` that recorded them, by ``(run, dataset,
    clients)`` and, with the study first, by ``(study, run, dataset, clients)``; empty without the column."""
    if "cpu_s" not in runs:
        return {}
    timed = runs[(runs["status"] == "ok") & runs["cpu_s"].notna()]
    timed = timed.assign(clients=timed["clients"].astype(int))
    keys = (["run", "dataset", "clients"], ["study", "run", "dataset", "clients"])
    return {key: cost for by in keys for key, cost in timed.groupby(by)["cpu_s"].median().items()}


def remaining_cost(plan: StudyPlan, dataset: str, runs: pd.DataFrame, paper_seeds: int,
                   costs: Mapping[tuple, float]) -> tuple[int, float, int]:
    """``(jobs, seconds, unknown)``: the training jobs ``plan`` still needs on ``dataset`` for the first
    ``paper_seeds`` of its seeds (every trained row, client count and grid point without an ``ok`` run in
    ``runs``, that study's rows of the dataset), the CPU seconds they should take and how many of them have
    no measured run to go by. A job costs the median ``cpu_s`` (:func:`row_costs` of every study's runs) of
    the study's runs of its row with the same client count on the dataset, else of that row's runs in any
    study, else of the runs of the row named after its method (``fedavg`` for FedAvg; a wrapper such as
    ``finetune`` has none); a grid's snapshot row is one point's run, as each point's job."""
    ok = runs[runs["status"] == "ok"]
    have = set(zip(ok["run"], ok["clients"].astype(int), ok["seed"].astype(int)))
    jobs, seconds, unknown = 0, 0.0, 0
    for row in plan.rows:
        points = plan.grid_points.get(row, 1)
        for clients in map(int, plan.clients.get(dataset, ())):
            missing = points * sum((row, clients, int(seed)) not in have for seed in plan.seeds[:paper_seeds])
            cost = next((costs[key] for key in ((plan.study, row, dataset, clients), (row, dataset, clients),
                                                (plan.methods.get(row, row), dataset, clients)) if key in costs), None)
            jobs += missing
            if cost is None:
                unknown += missing
            else:
                seconds += missing * cost
    return jobs, seconds, unknown


def coverage_cell(plan: StudyPlan, dataset: str, runs: pd.DataFrame, offline: set[str], notes: list[dict],
                  paper_seeds: int, costs: Mapping[tuple, float] | None = None) -> dict:
    """One row of the coverage table: ``plan`` on ``dataset`` given ``runs`` (rows of runs.csv or a
    metrics CSV of that study and dataset, any status); what is left to run and its cost
    (:func:`remaining_cost`, ``costs`` from every study's runs, :func:`row_costs`) where the data is offline.
    Runs of a grid point the study no longer has do not count (:func:`current_runs`)."""
    runs, stale = current_runs(plan, runs)
    ok = runs[runs["status"] == "ok"]
    clients = plan.clients.get(dataset, ())
    seeds_ok = sorted(int(s) for s in ok["seed"].unique())
    complete = complete_seeds(ok, plan.rows, clients) if len(ok) else []
    note = matching_note(notes, plan.study, dataset)
    if seeds_ok:
        status, reason = ("complete" if len(complete) >= paper_seeds else "partial"), ""
    elif dataset not in offline:  # whatever a note about the study says: without the data nothing can run
        status, reason = "not run", "no data offline"
    elif note is not None:
        status, reason = "not run", note["tag"]
    elif not plan.rows and plan.not_reproducible:
        status, reason = "not run", "not reproducible"
    elif not plan.rows:
        status, reason = "not run", "not implemented"
    else:
        status, reason = "not run", "not run yet"
    if dataset not in offline:
        jobs, seconds, unknown = None, None, None
    elif status == "complete":
        jobs, seconds, unknown = 0, 0.0, 0
    else:
        jobs, seconds, unknown = remaining_cost(plan, dataset, runs, paper_seeds, costs or {})
    return {"paper": plan.paper, "item": plan.item, "study": plan.study, "dataset": dataset, "status": status,
            "seeds_ok": len(seeds_ok), "seeds_complete": len(complete), "seeds_paper": paper_seeds,
            "seeds_study": len(plan.seeds), "rows_run": int(ok["run"].nunique()), "rows_trained": len(plan.rows),
            "rows_missing": " ".join(r for r in plan.rows if r not in set(ok["run"])) if seeds_ok else "",
            "rows_stale": " ".join(stale),
            "clients_run": " ".join(str(k) for k in sorted(ok["clients"].astype(int).unique())),
            "clients": " ".join(str(k) for k in clients), "jobs_left": jobs,
            "cpu_h_left": None if seconds is None else round(seconds / 3600, 2), "jobs_unknown_cost": unknown,
            "reason": reason,
            "note": "" if note is None else note["reason"]}


def coverage_table(plans: Iterable[StudyPlan], runs: pd.DataFrame, offline: set[str], notes: list[dict],
                   paper_seeds: Mapping[str, int]) -> pd.DataFrame:
    """:func:`coverage_cell` for every study and dataset, ordered by paper, item and study."""
    costs = row_costs(runs)
    rows = [coverage_cell(plan, dataset, runs[(runs["study"] == plan.study) & (runs["dataset"] == dataset)],
                          offline, notes, paper_seeds.get(plan.paper, 3), costs)
            for plan in plans for dataset in plan.datasets]
    table = pd.DataFrame(rows, columns=COLUMNS)
    return table.sort_values(["paper", "item", "study"], key=lambda c: c.map(sort_key), kind="stable",
                             ignore_index=True)


def stats_rows(plans: Iterable[StudyPlan], reported: Mapping[str, pd.DataFrame], snapshot_stats: Mapping[str, set],
               offline: set[str]) -> pd.DataFrame:
    """One row per (reported partition statistics table, dataset it reports): ``stats`` when the
    snapshot holds that study's ``<study>.partition_stats.csv`` rows of the dataset (``snapshot_stats``:
    study -> datasets), else the reason. ``reported``: file name -> its reported CSV."""
    rows = []
    for plan in plans:
        if plan.stats is None or plan.stats not in reported:
            continue
        frame = reported[plan.stats]
        for item, datasets in frame.groupby("table", sort=False)["dataset"]:
            for dataset in [d for d in dict.fromkeys(datasets) if d in plan.datasets]:
                have = dataset in snapshot_stats.get(plan.study, set())
                reason = "" if have else ("no data offline" if dataset not in offline else "not run yet")
                rows.append({"paper": plan.paper, "item": f"{item} (partition statistics)", "study": plan.study,
                             "dataset": dataset, "status": "stats" if have else "not run", "reason": reason})
    return pd.DataFrame(rows, columns=COLUMNS)


def item_rows(items: Iterable[dict], paper_seeds: Mapping[str, int]) -> pd.DataFrame:
    """Rows of the notes' ``items``: tables and figures of a paper that no study file covers."""
    rows = [{"paper": i["paper"], "item": i["item"], "study": "", "dataset": d, "status": "not run",
             "seeds_ok": 0, "seeds_paper": paper_seeds.get(i["paper"], 3), "reason": i["tag"], "note": i["reason"]}
            for i in items for d in i["datasets"]]
    return pd.DataFrame(rows, columns=COLUMNS)


def blank_texts(table: pd.DataFrame) -> pd.DataFrame:
    """``table`` with its missing text fields (a stats or item row's, or read back from CSV) as ``""``."""
    texts = [c for c in ("study", "rows_missing", "rows_stale", "clients_run", "clients", "reason", "note")
             if c in table]
    return table.assign(**{c: table[c].astype(object).where(table[c].notna(), "") for c in texts})


def sort_key(value):
    """Natural order: ``Table 2`` before ``Table 11``, tables before figures."""
    if not isinstance(value, str):
        return value
    kind = 0 if value.startswith("Table") else 1 if value.startswith("Fig") else 2
    return kind, tuple(int(t) if t.isdigit() else t for t in re.split(r"(\d+)", value))


def read_notes(path: str | Path | None) -> tuple[list[dict], list[dict]]:
    """``(cells, items)`` of a coverage notes file (YAML ``cells: [{study, datasets?, tag, reason}]``,
    ``items: [{paper, item, datasets, tag, reason}]``); a missing file has none. A tag outside
    :data:`REASONS` is a :class:`ConfigError` naming it and the valid tags."""
    if path is None or not Path(path).is_file():
        return [], []
    from fglrepro.io import read_yaml

    notes = read_yaml(path) or {}
    cells, items = notes.get("cells", []), notes.get("items", [])
    for entry in (*cells, *items):
        if entry.get("tag") not in REASONS:
            raise ConfigError(f"{path}: tag {entry.get('tag')!r} of {entry} is not one of {list(REASONS)}")
    return cells, items


def cell_text(row: Mapping) -> str:
    """The matrix cell: ``n of m`` (``partial`` when a seed lacks rows or client counts), ``stats``,
    or the reason."""
    if row["status"] in ("complete", "partial"):
        text = f"{int(row['seeds_ok'])} of {int(row['seeds_paper'])}"
        return text + (" (partial)" if row["status"] == "partial" and row["seeds_complete"] < row["seeds_ok"] else "")
    return "stats" if row["status"] == "stats" else row["reason"]


def detail_text(row: Mapping) -> str:
    """What a cell that is not complete lacks, and its note (without the cell's dataset)."""
    if row["status"] == "partial":
        parts = [f"{int(row['seeds_ok'])} of {int(row['seeds_paper'])} seeds ran "
                 f"({int(row['seeds_complete'])} with every row and client count; the study lists "
                 f"{int(row['seeds_study'])})",
                 f"rows {int(row['rows_run'])} of {int(row['rows_trained'])}"
                 + (f" (not run: {row['rows_missing']})" if row["rows_missing"] else ""),
                 f"clients {row['clients_run']} of {row['clients']}"]
    else:
        parts = [row["reason"]]
    if row.get("rows_stale"):
        parts.append(f"runs of an earlier grid of {row['rows_stale']}, not counted")
    left = left_text(row)
    return "; ".join(parts + ([left] if left else [])) + (f". {row['note']}" if row["note"] else "")


def left_text(row: Mapping) -> str:
    """``left: 54 jobs, about 2.1 CPU-h (12 of unknown cost)`` for a cell with jobs left (empty otherwise)."""
    jobs = row.get("jobs_left")
    if jobs is None or jobs != jobs or not int(jobs):
        return ""
    unknown = int(row["jobs_unknown_cost"])
    cost = f", about {row['cpu_h_left']:.1f} CPU-h" if unknown < jobs else ""
    return f"left: {int(jobs)} jobs{cost}" + (f" ({unknown} of unknown cost)" if unknown else "")


def detail_lines(part: pd.DataFrame) -> list[str]:
    """One line per item, study and :func:`detail_text` over the partial cells and those with a
    note, naming the datasets it applies to."""
    rows = [r for r in part.to_dict("records") if r["status"] == "partial" or r["note"]]
    grouped: dict[tuple, list[str]] = {}
    for r in rows:
        grouped.setdefault((r["item"], r["study"], detail_text(r)), []).append(r["dataset"])
    return [f"- {item} x {', '.join(datasets)}" + (f" (`{study}`)" if study else "") + f": {text}"
            for (item, study, text), datasets in grouped.items()]


def coverage_markdown(table: pd.DataFrame, papers: list[str]) -> str:
    """Per paper a matrix (rows: item and study, columns: datasets in first-use order) and the
    details of every cell that is not complete."""
    counts = table["status"].value_counts()
    out = ["# Coverage: what was run, per paper, table or figure and dataset", "",
           "Generated by `fgl-report coverage` from the results snapshot (`runs.csv`, `<study>.partition_stats.csv`),"
           " the study files (`config/studies/`), the reported partition statistics (`config/paper/`) and "
           "`docs/notes/coverage.yaml`; do not edit by hand. A cell reads `n of m`: n seeds with an ok run, of the "
           "paper's m (`partial`: some seed lacks a row or client count); `stats`: our partition statistics are "
           "in the snapshot; else why not: " + ", ".join(f"`{r}`" for r in REASONS) + " (`no data offline`: the "
           "package pins no digest of the raw files, so no mirror provides them; `not run yet`: the data is "
           "available offline). `-`: the dataset is not in that table. `left`: the training jobs an offline cell "
           "still needs for the paper's seeds (grid points counted) and their CPU time at the medians of the "
           "snapshot's runs of the same row, dataset and client count (`cpu_s`, recorded by runs folded since "
           "2026-11-29; else the row's runs in another study, else the plain method's row); unknown where no such "
           "run recorded it.", "",
           "Cells: " + ", ".join(f"{counts.get(s, 0)} {s}" for s in ("complete", "partial", "stats", "not run"))
           + "; not run: " + ", ".join(f"{n} {r}" for r, n in table.loc[table["status"] == "not run", "reason"]
                                       .value_counts().items()) + ".", "", total_left_text(table), ""]
    for paper in [p for p in papers if p in set(table["paper"])] + sorted(set(table["paper"]) - set(papers)):
        out += [f"## {paper}", "", *paper_matrix(table[table["paper"] == paper]), ""]
    return "\n".join(out).rstrip() + "\n"


def total_left_text(table: pd.DataFrame) -> str:
    """One line: the jobs all offline cells still need, their measured-cost estimate and the unknown ones."""
    jobs = table["jobs_left"].fillna(0).astype(int).sum()
    unknown = table["jobs_unknown_cost"].fillna(0).astype(int).sum()
    return (f"Left to run offline: {jobs} training jobs, about {table['cpu_h_left'].fillna(0).sum():.0f} CPU-h "
            f"for the {jobs - unknown} of measured cost and {unknown} of unknown cost (one thread per job).")


def paper_matrix(part: pd.DataFrame) -> list[str]:
    """Lines of one paper's matrix (rows: item and study, columns: datasets in first-use order),
    then one line per cell that is not complete (:func:`detail_text`)."""
    part = blank_texts(part)
    datasets = list(dict.fromkeys(part["dataset"]))
    out = ["| Table / figure | Study | " + " | ".join(datasets) + " |", "|---|---|" + "---|" * len(datasets)]
    for (item, study), group in part.groupby(["item", "study"], sort=False):
        cells = {r["dataset"]: cell_text(r) for r in group.to_dict("records")}
        out.append(f"| {item} | {f'`{study}`' if study else ''} | " + " | ".join(cells.get(d, "-") for d in datasets)
                   + " |")
    details = detail_lines(part)
    return out + (["", *details] if details else [])


def snapshot_coverage(snapshot: str | Path, study_dir: str | Path, paper_dir: str | Path,
                      notes: str | Path | None) -> pd.DataFrame:
    """The coverage table of a results snapshot (``runs.csv``, ``<study>.partition_stats.csv``)."""
    from fglrepro.data.download import pinned_checksums
    from fglrepro.data.registry import DATASETS
    from fglrepro.report.claims import PAPER_SEEDS

    snapshot = Path(snapshot)
    runs_csv = snapshot / "runs.csv"
    runs = pd.read_csv(runs_csv) if runs_csv.is_file() else pd.DataFrame(
        columns=["study", "run", "dataset", "clients", "seed", "status"])
    plans = plans_from_dir(study_dir)
    offline = offline_datasets(DATASETS, pinned_checksums())
    cells, items = read_notes(notes)
    reported = {p.stats: pd.read_csv(Path(paper_dir) / p.stats) for p in plans
                if p.stats and (Path(paper_dir) / p.stats).is_file()}
    ours = {p.study: set(pd.read_csv(path)["dataset"]) for p in plans
            if (path := snapshot / f"{p.study}.partition_stats.csv").is_file()}
    frames = [coverage_table(plans, runs, offline, cells, PAPER_SEEDS), stats_rows(plans, reported, ours, offline),
              item_rows(items, PAPER_SEEDS)]
    table = pd.concat([f for f in frames if len(f)], ignore_index=True)
    table = blank_texts(table)
    return table.sort_values(["paper", "item"], key=lambda c: c.map(sort_key), kind="stable", ignore_index=True)


def stale_notes(table: pd.DataFrame) -> list[str]:
    """``study x dataset`` of the complete cells that still carry a note: notes say why a cell is not
    complete, so once its runs are in the snapshot the note is out of date (remove it from the notes file)."""
    done = table[(table["status"] == "complete") & (table["note"].fillna("") != "")]
    return [f"{r.study} x {r.dataset}" for r in done.itertuples()]


def write_coverage(snapshot: str | Path, study_dir: str | Path, paper_dir: str | Path, notes: str | Path | None,
                   out_prefix: str | Path) -> pd.DataFrame:
    """Write ``<out_prefix>.md`` (:func:`coverage_markdown`) and ``<out_prefix>.csv`` (:data:`COLUMNS`) of
    :func:`snapshot_coverage`; returns the table."""
    from fglrepro.io import atomic_write_text
    from fglrepro.report.reproduction import PAPERS

    table = snapshot_coverage(snapshot, study_dir, paper_dir, notes)
    atomic_write_text(coverage_markdown(table, PAPERS), f"{out_prefix}.md")
    atomic_write_text(table.to_csv(index=False), f"{out_prefix}.csv")
    return table


def run_coverage_html(paper: str, metas: list[dict], results: str | Path) -> str:
    """An HTML section of the report of ``paper``: the coverage of this workflow run (its
    ``metrics/<study>.csv``) for each study in ``metas`` (the report's study metadata)."""
    from fglrepro.report.claims import PAPER_SEEDS
    from fglrepro.report.html import table_html

    frames = []
    for meta in metas:
        metrics = Path(results) / "metrics" / f"{meta['study']}.csv"
        runs = pd.read_csv(metrics) if metrics.is_file() else pd.DataFrame(
            columns=["study", "run", "dataset", "clients", "seed", "status"])
        columns = meta.get("columns", [])
        plan = StudyPlan(study=meta["study"], paper=paper, item=meta["table"],
                         datasets=tuple(dict.fromkeys(d for d, _ in columns)),
                         clients={d: tuple(k for e, k in columns if e == d) for d, _ in columns},
                         seeds=tuple(meta.get("protocol", {}).get("seeds", ())), rows=tuple(meta.get("labels", {})))
        frames.append(coverage_table([plan], runs.assign(study=meta["study"]), set(), [], PAPER_SEEDS))
    if not frames or not sum(len(f) for f in frames):
        return '<h2 id="coverage">Coverage</h2><p class="missing">no table of this run</p>'
    table = pd.concat(frames, ignore_index=True)
    shown = pd.DataFrame({"Table / figure": table["item"], "Study": table["study"], "Dataset": table["dataset"],
                          "Seeds (of the paper's)": [cell_text(r) if r["status"] != "not run" else "not run"
                                                     for r in table.to_dict("records")],
                          "Rows run": [f"{r} of {t}" for r, t in zip(table["rows_run"], table["rows_trained"])],
                          "Clients run": table["clients_run"]})
    return ('<h2 id="coverage">Coverage</h2><p>Seeds with an ok run in this run, of the paper\'s; '
            'docs/results/COVERAGE.md has the whole papers\' matrix with the reasons for cells not run.</p>'
            + table_html(shown))
