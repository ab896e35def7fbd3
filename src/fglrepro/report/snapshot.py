"""A committed snapshot of reproduced results (docs/results/): the runs, and everything derived from them.

``runs.csv`` holds one row per run of the snapshot's studies (ids to re-run it, status, test metrics,
provenance), ``studies.json`` what the tables need to know about each study and
``<study>.partition_stats.csv`` each study's partition statistics next to the paper's. Every other file
(the studies' tables, the comparisons with the papers, the claims) is rendered from those two, the
claims file and the reported values by :func:`render`, so that a test can render them again and
compare with the committed files.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

import pandas as pd

#: columns of runs.csv: what a reader needs to see a run's result and to re-run it.
RUN_COLUMNS = ["study", "run", "grid_point", "label", "method", "dataset", "partition", "scheme", "clients", "seed",
               "status", "test_acc", "test_f1_macro", "best_round", "rounds_run", "converge_round", "wall_s",
               "cpu_s", "peak_memory_mb", "upload_mb", "download_mb", "device", "git_commit", "target"]
RUNS, STUDIES = "runs.csv", "studies.json"
#: one run of a snapshot: a newer run with the same key replaces it when runs are merged in
RUN_KEY = ["study", "run", "dataset", "clients", "seed"]
CELL_KEY = RUN_KEY[:-1]  # a table cell: its runs are the seeds
#: name ending of a study's partition statistics (ours next to the paper's), kept as made by the workflow
PARTITION_STATS = ".partition_stats.csv"


def cost_seconds(runs: pd.DataFrame) -> pd.Series:
    """What each run of ``runs`` (rows of runs.csv) cost: its CPU seconds (``cpu_s``, recorded by runs
    folded since 2026-11-29) or else its wall seconds (``wall_s``: one thread per job, so about its CPU
    seconds on an idle core and more under load)."""
    wall = runs["wall_s"] if "wall_s" in runs else pd.Series(float("nan"), index=runs.index)
    return runs["cpu_s"].fillna(wall) if "cpu_s" in runs else wall


def run_target(row: Mapping, results_dir: str = "results") -> str:
    """The Snakemake target (run JSON) that re-runs one run: ``results/runs/<study>/<run>[@<point>]/...``."""
    from fglrepro.grid import SEPARATOR

    run = row["run"] if pd.isna(row.get("grid_point")) else f"{row['run']}{SEPARATOR}{row['grid_point']}"
    return (f"{results_dir}/runs/{row['study']}/{run}/{row['dataset']}/{row['scheme']}/k{row['clients']}"
            f"/seed{row['seed']}.json")


def dirty_runs(metrics: pd.DataFrame, results_dir: str = "results") -> list[str]:
    """The run JSONs (targets) of the rows of ``metrics`` whose run recorded a dirty source tree
    (``git_dirty`` true: uncommitted changes outside results/ and data/, :mod:`fglrepro.provenance`);
    rows without the column or with an empty value (runs older than the flag) are not counted."""
    if "git_dirty" not in metrics:
        return []
    dirty = metrics["git_dirty"].map(lambda v: v is True or str(v).lower() == "true")
    return [run_target(row, results_dir) for row in metrics[dirty].to_dict("records")]


def check_clean(metrics: pd.DataFrame, results_dir: str = "results") -> None:
    """Refuse (:class:`~fglrepro.config.ConfigError`) runs made from a dirty tree: their
    ``git_commit`` does not name the code that made them, so nobody could re-run them."""
    from fglrepro.config import ConfigError

    dirty = dirty_runs(metrics, results_dir)
    if dirty:
        raise ConfigError(
            f"{len(dirty)} run(s) were made from a source tree with uncommitted changes (git_dirty in the run "
            f"JSON), e.g. {dirty[0]}; commit the code, rerun them (snakemake --forcerun train -- <run JSON>) and "
            f"write the snapshot again, or pass --allow-dirty for a draft snapshot not to be committed: "
            + ", ".join(dirty[:5]) + (" ..." if len(dirty) > 5 else ""))


def snapshot_runs(metrics: list[pd.DataFrame], results_dir: str = "results", allow_dirty: bool = False
                  ) -> pd.DataFrame:
    """The rows of runs.csv from the studies' metrics CSVs (:func:`fglrepro.report.collect.collect`),
    in study order; runs made from a dirty tree are refused (:func:`check_clean`) unless
    ``allow_dirty``."""
    frame = pd.concat(metrics, ignore_index=True)
    if not allow_dirty:
        check_clean(frame, results_dir)
    frame = frame.reindex(columns=RUN_COLUMNS)
    frame["target"] = [run_target(row, results_dir) for row in frame.to_dict("records")]
    return frame


def read_runs(path: str | Path) -> pd.DataFrame:
    """runs.csv, read as :func:`render` reads it."""
    return pd.read_csv(path)


def load_claims(path: str | Path) -> list[dict]:
    """The claims of a claims file (checked by the workflow before any job runs)."""
    from fglrepro.io import read_yaml

    return read_yaml(path)["claims"]


def render(runs: pd.DataFrame, metas: Mapping[str, dict], claims: list[dict], paper_dir: str | Path
           ) -> dict[str, str]:
    """Every derived file of a snapshot, name -> text: ``<study>.md`` (the table), ``<study>.comparison.
    {csv,md}`` (studies with reported values in ``paper_dir``), ``claims.{csv,md}``, ``claims_cells.csv``
    and ``README.md``."""
    from fglrepro.report.claims import claims_markdown, evaluate, read_reported
    from fglrepro.report.tables import (
        cell_summary,
        communication_markdown,
        comparison,
        comparison_texts,
        study_table_texts,
    )

    files, summaries = {}, {}
    for study, meta in metas.items():
        part = runs[runs["study"] == study]
        if part.empty:
            continue
        summaries[study] = summary = cell_summary(part)
        files[f"{study}.md"] = study_table_texts(summary, meta)["md"] + communication_markdown(part, meta)
        if meta.get("reported"):
            table = comparison(summary, pd.read_csv(Path(paper_dir) / meta["reported"]), meta)
            for ext, text in comparison_texts(table, meta).items():
                files[f"{study}.comparison.{ext}"] = text
    table, cells = evaluate(claims, metas, {s: runs[runs["study"] == s] for s in summaries}, read_reported(paper_dir))
    files["claims.csv"] = table.to_csv(index=False)
    files["claims_cells.csv"] = cells.to_csv(index=False)
    files["claims.md"] = claims_markdown(table)
    files["README.md"] = index_markdown(runs, metas, table)
    return files


def mixed_commit_cells(runs: pd.DataFrame) -> tuple[int, int]:
    """``(mixed, cells)``: of the cells (study, run, dataset, clients) with ok runs, how many have ok runs
    made at more than one recorded commit."""
    ok = runs[(runs["status"] == "ok") & runs["git_commit"].notna()]
    commits = ok.groupby(CELL_KEY)["git_commit"].nunique()
    return int((commits > 1).sum()), len(commits)


def commit_mix_sentence(runs: pd.DataFrame) -> str:
    """Says how many cells mix commits, and what that means for reading a mean over seeds."""
    mixed, cells = mixed_commit_cells(runs)
    return (f"The seeds of a cell (study, run, dataset, clients) may come from different commits: {mixed} of {cells} "
            "cells with ok runs mix commits. A later commit can round a method's floats differently (e.g. a speed-up "
            "that reorders a sum), and a seed rerun there then gives other numbers; `fgl-report verify --at-head` "
            "rebuilds rows by the current code and says which still give the same.")


def index_markdown(runs: pd.DataFrame, metas: Mapping[str, dict], claims: pd.DataFrame) -> str:
    """The snapshot's README: what is here, the studies with their run counts, the claims' verdicts,
    how to re-run a cell and how to regenerate the snapshot."""
    from fglrepro.report.claims import VERDICTS

    commits = sorted(set(runs["git_commit"].dropna().astype(str)))
    lines = ["# Reproduced results: snapshot", "",
             "Written by `snakemake snapshot --cores 1` from `results/`; do not edit by hand. `runs.csv` has one "
             "row per run (a grid run: its point picked by validation accuracy); every other file is rendered "
             "from it, `studies.json`, `config/paper/claims.yaml` and the reported values in `config/paper/`, "
             "and a test renders them again and compares (`tests/test_snapshot.py`).", "",
             f"{len(runs)} runs, {int((runs['status'] == 'ok').sum())} ok; code commit(s): "
             + (", ".join(f"`{c[:10]}`" for c in commits) or "not recorded") + ".", "",
             commit_mix_sentence(runs), "",
             "| Study | Paper | Table | Runs (ok) | Table file | Comparison |", "|---|---|---|---:|---|---|"]
    for study, meta in metas.items():
        part = runs[runs["study"] == study]
        comparison = f"[{study}.comparison.md]({study}.comparison.md)" if meta.get("reported") and len(part) else ""
        table = f"[{study}.md]({study}.md)" if len(part) else ""
        lines.append(f"| {study} | {meta['paper']} | {meta['table']} | {len(part)} "
                     f"({int((part['status'] == 'ok').sum())}) | {table} | {comparison} |")
    counts = claims["verdict"].value_counts()
    lines += ["", "Claims ([claims.md](claims.md), cell by cell in `claims_cells.csv`): "
              + ", ".join(f"{counts.get(v, 0)} {v}" for v in VERDICTS) + " (verdicts weigh each margin against seed "
              "noise; beside them, whether the paper's own table supports the claim).",
              "", "Coverage ([COVERAGE.md](COVERAGE.md), `COVERAGE.csv`; `fgl-report coverage`, run by the snapshot "
              "rule): per paper, table or figure and dataset, how many of the paper's seeds ran, or why not.",
              "", "Columns of `runs.csv` beyond the ids: `test_acc` / `test_f1_macro` at `best_round` (the round of "
              "best validation accuracy) in percent, `rounds_run`, `converge_round` (the first round reaching 99 % of "
              "the run's highest test accuracy; empty for rows folded before the column existed), `wall_s`, "
              "`cpu_s` and `peak_memory_mb` (MiB; both empty for rows folded before 2026-11-29), "
              "`upload_mb` / `download_mb` (per client over the run), `device` and `git_commit`.",
              "", "## Re-run a cell", "",
              "Each row of `runs.csv` names its Snakemake target (`target`, the run JSON); e.g.", "", "```",
              "snakemake --cores 1 --config studies=[<study>] only_datasets=all -- <target>", "```", "",
              "`fgl-report verify --sample 10 [--study S] [--method M] [--seed X]` rebuilds a seeded sample of rows "
              "(cheapest first), each by the code of its own commit, in a scratch folder and prints, per metric, "
              "equal / within 0.05 points / differs, "
              "with the machine's CPU, BLAS and torch build. The same code, seed and torch build give the same "
              "numbers to the last digit where the BLAS rounds the training's products alike; see the README's "
              "reproducibility section for other machines. Runs made from a tree with uncommitted changes are not "
              "admitted to the snapshot.", "",
              "Regenerate the snapshot from `results/` with `snakemake snapshot --cores 1 --forcerun snapshot --config "
              "studies=[...]`, or re-render its tables and claims from `runs.csv` alone (after editing "
              "`config/paper/claims.yaml` or the reported values) with `fgl-report snapshot --rerender --out "
              "docs/results`.", ""]
    return "\n".join(lines)


def write_files(files: Mapping[str, str], out_dir: str | Path) -> None:
    from fglrepro.io import atomic_write_text

    for name, text in files.items():
        atomic_write_text(text, Path(out_dir) / name)


def merge_runs(old: pd.DataFrame, new: pd.DataFrame) -> pd.DataFrame:
    """``old``'s rows with ``new``'s in place of those with the same :data:`RUN_KEY` (a rerun of a
    cell replaces it; a run whose study file dropped it stays until the study is written anew), grouped
    by study in sorted order, old rows before new ones within a study."""
    replaced = old.set_index(RUN_KEY).index.isin(new.set_index(RUN_KEY).index)
    merged = pd.concat([old[~replaced], new], ignore_index=True)
    return merged.sort_values("study", kind="stable").reset_index(drop=True)


def merge_meta(old: Mapping, new: Mapping, ran: set[str]) -> dict:
    """A study's meta after a merge: ``new``'s, with the rows and columns of the runs the snapshot keeps
    (a run restricted by ``skip_runs`` or ``only_datasets`` does not hide the study's other runs); rows
    in the order of the study file (``all_rows``), the old columns first. Only runs named in ``ran`` (the
    study's runs in the merged runs.csv) keep a row, with the ``not_reproducible`` ones: a label with no
    run would make the study's claims read "not run" instead of naming the row as left out."""
    labels = {run: label for run, label in {**old.get("labels", {}), **new["labels"]}.items() if run in ran}
    shown = set(labels.values()) | set(new.get("not_reproducible", {}))
    rows = [label for label in new.get("all_rows", new["rows"]) if label in shown]
    columns = [list(c) for c in old.get("columns", [])]
    columns += [list(c) for c in new["columns"] if list(c) not in columns]
    return {**new, "labels": labels, "rows": rows, "columns": columns}


def write_snapshot(metrics: list[pd.DataFrame], metas: Mapping[str, dict], claims: list[dict],
                   paper_dir: str | Path, out_dir: str | Path, results_dir: str = "results",
                   allow_dirty: bool = False, merge: bool = False) -> dict[str, str]:
    """Write runs.csv and studies.json to ``out_dir`` (files of a previous snapshot are removed),
    then the files :func:`render` derives from them as read back; returns the rendered files.
    ``merge`` keeps the previous snapshot's runs and studies and folds these in (:func:`merge_runs`,
    :func:`merge_meta`), so that a snapshot grows run by run.
    Runs made from a dirty tree are refused before anything is written, unless ``allow_dirty``."""
    from fglrepro.io import atomic_write_text

    runs = snapshot_runs(metrics, results_dir, allow_dirty)
    out = Path(out_dir)
    if merge and (out / RUNS).is_file():
        runs = merge_runs(read_runs(out / RUNS), runs).reindex(columns=RUN_COLUMNS)
        previous = json.loads((out / STUDIES).read_text())
        ran = runs.groupby("study")["run"].agg(set).to_dict()
        metas = {**previous, **{study: merge_meta(previous.get(study, {}), meta, ran.get(study, set()))
                                for study, meta in metas.items()}}
    out.mkdir(parents=True, exist_ok=True)
    for old in out.iterdir():
        if old.is_file() and not old.name.endswith(PARTITION_STATS):
            old.unlink()
    atomic_write_text(runs.to_csv(index=False), out / RUNS)
    atomic_write_text(json.dumps(dict(metas), indent=1, sort_keys=True) + "\n", out / STUDIES)
    return rerender(out, claims, paper_dir)


#: A partition statistics row's cell: its statistics over the seeds in its ``seeds`` column.
STATS_CELL = ["dataset", "partitioner", "clients"]


def merge_partition_stats(old: pd.DataFrame, new: pd.DataFrame) -> pd.DataFrame:
    """A study's partition statistics after a merge: per cell (:data:`STATS_CELL`), ``new``'s rows unless
    ``old``'s cover more seeds (a run restricted by ``only_seeds`` or ``only_datasets`` does not shrink the
    snapshot's table); cells in ``old``'s order, then ``new``'s other cells."""
    chosen = []
    new_cells = dict(list(new.groupby(STATS_CELL, sort=False, dropna=False)))
    for cell, rows in old.groupby(STATS_CELL, sort=False, dropna=False):
        fresh = new_cells.pop(cell, None)
        chosen.append(rows if fresh is None or rows["seeds"].max() > fresh["seeds"].max() else fresh)
    return pd.concat(chosen + list(new_cells.values()), ignore_index=True)


def add_partition_stats(paths: list[str | Path], out_dir: str | Path, merge: bool = False) -> None:
    """Copy the workflow's ``results/tables/<study>.partition_stats.csv`` files into the snapshot, where
    ``fgl-report coverage`` reads them: a rerun's file replaces the study's old one, or with ``merge``
    is merged into it (:func:`merge_partition_stats`)."""
    from fglrepro.io import atomic_write_text

    for path in map(Path, paths):
        if not path.name.endswith(PARTITION_STATS):
            raise ValueError(f"{path}: not a partition statistics table (expected <study>{PARTITION_STATS})")
        target = Path(out_dir) / path.name
        if merge and target.is_file():
            merged = merge_partition_stats(pd.read_csv(target), pd.read_csv(path))
            atomic_write_text(merged.to_csv(index=False), target)
        else:
            atomic_write_text(path.read_text(), target)


def rerender(out_dir: str | Path, claims: list[dict], paper_dir: str | Path) -> dict[str, str]:
    """Render a snapshot's derived files again from its runs.csv and studies.json and write them."""
    files = render(read_runs(Path(out_dir) / RUNS), json.loads((Path(out_dir) / STUDIES).read_text()), claims,
                   paper_dir)
    write_files(files, out_dir)
    return files
