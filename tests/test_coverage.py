"""The coverage matrix (docs/results/COVERAGE.{md,csv}): seeds run per paper table and dataset, or why not."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
import yaml

from fglrepro.config import ConfigError
from fglrepro.data.download import pinned_checksums
from fglrepro.data.registry import DATASETS
from fglrepro.report.coverage import (
    REASONS,
    StudyPlan,
    cell_text,
    coverage_cell,
    coverage_markdown,
    detail_text,
    left_text,
    offline_datasets,
    plan_from_study,
    read_notes,
    row_costs,
    run_coverage_html,
    snapshot_coverage,
    stale_notes,
)
from fglrepro.report.reproduction import PAPERS, generate

ROOT = Path(__file__).resolve().parents[1]
SNAPSHOT = ROOT / "docs" / "results"
STUDY_DIR, PAPER_DIR, NOTES = ROOT / "config" / "studies", ROOT / "config" / "paper", ROOT / "docs" / "notes"
committed = pytest.mark.skipif(not (SNAPSHOT / "runs.csv").is_file(), reason="no committed snapshot docs/results/")

PLAN = StudyPlan(study="s", paper="P", item="Table 2", datasets=("Cora", "PubMed"),
                 clients={"Cora": (5, 10), "PubMed": (5, 10)}, seeds=(0, 1, 2), rows=("a", "b"))
OFFLINE = {"Cora"}


def runs(cells: list[tuple[str, int, int]], status: str = "ok", dataset: str = "Cora") -> pd.DataFrame:
    """runs.csv rows of study ``s``: one per (run, clients, seed)."""
    return pd.DataFrame([{"study": "s", "run": r, "dataset": dataset, "clients": k, "seed": s, "status": status}
                         for r, k, s in cells], columns=["study", "run", "dataset", "clients", "seed", "status"])


def every(rows=("a", "b"), clients=(5, 10), seeds=(0, 1, 2)) -> list[tuple[str, int, int]]:
    return [(r, k, s) for r in rows for k in clients for s in seeds]


def test_all_rows_and_client_counts_in_the_papers_seeds_make_a_complete_cell():
    cell = coverage_cell(PLAN, "Cora", runs(every()), OFFLINE, [], paper_seeds=3)
    assert (cell["status"], cell["seeds_ok"], cell["seeds_complete"]) == ("complete", 3, 3)
    assert cell_text(cell) == "3 of 3" and cell["rows_missing"] == ""


def test_a_seed_without_a_row_or_a_client_count_makes_the_cell_partial():
    missing_row = [c for c in every() if not (c[0] == "b" and c[2] == 2)]
    cell = coverage_cell(PLAN, "Cora", runs(missing_row), OFFLINE, [], paper_seeds=3)
    assert (cell["status"], cell["seeds_ok"], cell["seeds_complete"]) == ("partial", 3, 2)
    assert cell_text(cell) == "3 of 3 (partial)"
    missing_clients = [c for c in every() if not (c[1] == 10 and c[2] == 0)]
    cell = coverage_cell(PLAN, "Cora", runs(missing_clients), OFFLINE, [], paper_seeds=3)
    assert (cell["seeds_complete"], cell["clients_run"]) == (2, "5 10")
    never = coverage_cell(PLAN, "Cora", runs(every(rows=("a",))), OFFLINE, [], paper_seeds=3)
    assert (never["rows_run"], never["rows_missing"], never["seeds_complete"]) == (1, "b", 0)


def test_only_ok_runs_count_and_fewer_seeds_than_the_paper_are_partial():
    failed = runs(every(seeds=(1, 2)), status="failed")
    cell = coverage_cell(PLAN, "Cora", pd.concat([runs(every(seeds=(0,))), failed]), OFFLINE, [], paper_seeds=3)
    assert (cell["status"], cell["seeds_ok"], cell_text(cell)) == ("partial", 1, "1 of 3")
    assert coverage_cell(PLAN, "Cora", failed, OFFLINE, [], paper_seeds=3)["status"] == "not run"


def test_a_cell_without_runs_says_why():
    none = runs([])
    reason = lambda plan, dataset, notes=(): coverage_cell(plan, dataset, none, OFFLINE, list(notes), 3)["reason"]  # noqa: E731
    assert reason(PLAN, "PubMed") == "no data offline"
    assert reason(PLAN, "Cora") == "not run yet"
    assert reason(StudyPlan("s", "P", "Table 2", ("Cora",), {"Cora": (5,)}, (0,), rows=()), "Cora") == "not implemented"
    not_reproducible = StudyPlan("s", "P", "Table 2", ("Cora",), {"Cora": (5,)}, (0,), rows=(), not_reproducible=("a",))
    assert reason(not_reproducible, "Cora") == "not reproducible"
    note = {"study": "s", "datasets": ["Cora"], "tag": "CPU budget", "reason": "40 min per run"}
    assert reason(PLAN, "Cora", [note]) == "CPU budget"
    assert reason(PLAN, "PubMed", [note]) == "no data offline"  # the note names Cora only
    every_dataset = {"study": "s", "tag": "CPU budget", "reason": "40 min per run"}
    assert reason(PLAN, "Cora", [every_dataset]) == "CPU budget"
    assert reason(PLAN, "PubMed", [every_dataset]) == "no data offline"  # the data, not the CPU, is what lacks


def timed(cells: list[tuple[str, int, int]], cpu_s: float, study: str = "s", method: str | None = None,
          dataset: str = "Cora") -> pd.DataFrame:
    """``runs`` of ``cells`` that recorded ``cpu_s`` CPU seconds each."""
    frame = runs(cells, dataset=dataset).assign(study=study, cpu_s=cpu_s)
    return frame.assign(method=method if method else frame["run"])


def test_the_jobs_left_count_every_missing_row_client_count_seed_and_grid_point_at_measured_costs():
    plan = StudyPlan(study="s", paper="P", item="Table 2", datasets=("Cora", "PubMed"),
                     clients={"Cora": (5, 10), "PubMed": (5,)}, seeds=(0, 1, 2, 3), rows=("a", "b", "c"),
                     methods={"a": "a", "b": "fedavg", "c": "finetune"}, grid_points={"a": 2})
    done = pd.concat([timed([("a", 5, 0)], 10.0), timed([("a", 5, 1)], 30.0), timed([("a", 10, 0)], 50.0),
                      timed([("b", 5, 0)], 7.0, method="fedavg")])
    elsewhere = pd.concat([timed([("fedavg", 10, 0)], 4.0, study="t", method="fedavg"),
                           timed([("b", 10, 0)], 100.0, study="t", dataset="CiteSeer"),
                           timed([("finetune_x", 10, 0)], 1.0, study="t", method="finetune")])
    costs = row_costs(pd.concat([done, elsewhere]))
    cell = coverage_cell(plan, "Cora", done, OFFLINE, [], paper_seeds=3, costs=costs)
    # a: 2 points x (1 seed left at 5 clients + 2 at 10) at the study's medians 20 s and 50 s;
    # b: 2 seeds at 5 clients (7 s), 3 seeds at 10 clients at the plain fedavg row's 4 s (b's CiteSeer runs are
    # another dataset); c: a finetune row never run, 6 jobs of unknown cost (no "finetune" row to go by)
    assert (cell["jobs_left"], cell["jobs_unknown_cost"]) == (6 + 5 + 6, 6)
    assert cell["cpu_h_left"] == round((2 * 20 + 4 * 50 + 2 * 7 + 3 * 4) / 3600, 2)
    assert "left: 17 jobs, about 0.1 CPU-h (6 of unknown cost)" in detail_text({**cell, "status": "partial"})
    assert coverage_cell(plan, "PubMed", runs([]), OFFLINE, [], 3, costs)["jobs_left"] is None  # no data offline
    untimed = done.drop(columns="cpu_s")  # rows folded before cpu_s was recorded: counted, cost unknown
    cell = coverage_cell(plan, "Cora", untimed, OFFLINE, [], 3, row_costs(untimed))
    assert (cell["jobs_left"], cell["jobs_unknown_cost"], cell["cpu_h_left"]) == (17, 17, 0.0)
    assert left_text(cell) == "left: 17 jobs (17 of unknown cost)"
    full = [(r, k, s) for r in ("a", "b", "c") for k in (5, 10) for s in (0, 1, 2)]
    assert coverage_cell(plan, "Cora", runs(full), OFFLINE, [], 3, costs)["jobs_left"] == 0
    other_seeds = [(r, k, s) for r in ("a", "b", "c") for k in (5, 10) for s in (1, 2, 3)]  # complete without seed 0
    assert coverage_cell(plan, "Cora", runs(other_seeds), OFFLINE, [], 3, costs)["jobs_left"] == 0


def test_the_study_file_gives_each_rows_method_and_grid_points():
    grid = {"method": "fedgkd", "grid": {"u": [1, 2], "v": [3, 4, 5]}}
    plan = plan_from_study("x", {"paper": "P", "table": "Table 1", "datasets": ["Cora"], "clients": [5], "seeds": [0],
                                 "runs": {"fedavg": {"method": "fedavg"}, "g": grid, "plain": {}}})
    assert plan.methods == {"fedavg": "fedavg", "g": "fedgkd", "plain": "plain"}
    assert plan.grid_points == {"fedavg": 1, "g": 6, "plain": 1}
    assert plan.point_ids["g"] == {"u=1,v=3", "u=1,v=4", "u=1,v=5", "u=2,v=3", "u=2,v=4", "u=2,v=5"}
    assert plan.point_ids["fedavg"] == frozenset()


def test_runs_of_a_grid_point_the_study_no_longer_has_do_not_count():
    plan = plan_from_study("s", {"paper": "P", "table": "Table 1", "datasets": ["Cora"], "clients": [5, 10],
                                 "seeds": [0, 1, 2], "runs": {"a": {}, "b": {"grid": {"u": [1, 2], "v": [3]}}}})
    points = {"a": [None], "b": ["u=1,v=3", "u=2,v=3"]}
    current = pd.DataFrame([{"study": "s", "run": r, "grid_point": g, "dataset": "Cora", "clients": k, "seed": s,
                             "status": "ok"}
                            for r in ("a", "b") for g in points[r] for k in (5, 10) for s in (0, 1, 2)])
    assert coverage_cell(plan, "Cora", current, OFFLINE, [], 3)["status"] == "complete"
    old_grid = current.assign(grid_point=current["grid_point"].where(current["run"] == "a", "u=1"))  # before v
    cell = coverage_cell(plan, "Cora", old_grid, OFFLINE, [], 3, costs={})
    expected = ("partial", 0, "b", "b")
    assert (cell["status"], cell["seeds_complete"], cell["rows_stale"], cell["rows_missing"]) == expected
    one_seed = pd.concat([old_grid, current[(current["run"] == "b") & (current["seed"] == 0)]])
    cell = coverage_cell(plan, "Cora", one_seed, OFFLINE, [], 3, costs={})
    assert (cell["status"], cell["seeds_complete"], cell["rows_stale"]) == ("partial", 1, "b")
    assert cell["jobs_left"] == 2 * 2 * 2  # b: 2 points x 2 client counts x seeds 1-2
    assert "runs of an earlier grid of b, not counted" in detail_text(cell)
    gridded_now = current.assign(grid_point=current["grid_point"].where(current["run"] == "b", "u=1"))
    assert coverage_cell(plan, "Cora", gridded_now, OFFLINE, [], 3)["rows_stale"] == "a"  # a has no grid


def test_offline_datasets_are_those_whose_raw_files_the_package_pins():
    assert offline_datasets(DATASETS, pinned_checksums()) == {"Cora", "CiteSeer", "Photo", "Computers", "CS",
                                                              "Physics", "Actor"}
    pubmed = DATASETS["PubMed"]  # 7 of its 8 files pinned would still leave ind.pubmed.allx to download
    seven = {f: "0" * 64 for f in pubmed.raw_files[:2] + pubmed.raw_files[3:]}
    assert offline_datasets({"PubMed": pubmed}, seven) == set()


def test_study_file_clients_per_dataset_and_not_reproducible_rows():
    plan = plan_from_study("x", {"paper": "P", "table": "Figure 3", "datasets": ["Cora", "Flickr"],
                                 "clients": {"Cora": [8], "Flickr": [20]}, "seeds": [0, 1],
                                 "runs": {"a": {"method": "fedavg"}, "b": {"method": "x", "not_reproducible": "why"}}})
    assert plan.clients == {"Cora": (8,), "Flickr": (20,)} and plan.rows == ("a",)
    assert plan.not_reproducible == ("b",)


def test_a_note_with_an_unknown_tag_names_it_and_the_valid_ones(tmp_path):
    path = tmp_path / "coverage.yaml"
    path.write_text(yaml.safe_dump({"cells": [{"study": "s", "tag": "too slow", "reason": "r"}]}))
    with pytest.raises(ConfigError, match=r"tag 'too slow' .* is not one of \['no data offline', 'CPU budget'"):
        read_notes(path)


def synthetic_snapshot(tmp_path: Path) -> tuple[Path, Path]:
    snap, studies = tmp_path / "snap", tmp_path / "studies"
    snap.mkdir()
    studies.mkdir()
    (studies / "s.yaml").write_text(yaml.safe_dump({
        "paper": "FedTAD", "table": "Table 2", "datasets": ["Cora", "CiteSeer", "PubMed"], "clients": [5, 10],
        "seeds": [0, 1, 2], "runs": {"a": {"method": "fedavg"}, "b": {"method": "fedprox"}}}))
    (studies / "t.yaml").write_text(yaml.safe_dump({
        "paper": "FedTAD", "table": "Figure 5", "datasets": ["Cora"], "clients": [20], "seeds": [0], "runs": {}}))
    frame = pd.concat([runs(every()), runs(every(seeds=(0,)), dataset="CiteSeer")])
    frame.to_csv(snap / "runs.csv", index=False)
    return snap, studies


def test_the_matrix_has_a_row_per_study_and_a_column_per_dataset(tmp_path):
    snap, studies = synthetic_snapshot(tmp_path)
    table = snapshot_coverage(snap, studies, tmp_path, None)
    text = coverage_markdown(table, PAPERS)
    assert "| Table / figure | Study | Cora | CiteSeer | PubMed |" in text
    assert "| Table 2 | `s` | 3 of 3 | 1 of 3 | no data offline |" in text
    assert "| Figure 5 | `t` | not implemented | - | - |" in text
    assert "- Table 2 x CiteSeer (`s`): 1 of 3 seeds ran (1 with every row and client count" in text


def test_cli_writes_the_matrix_and_reproduction_md_includes_it(tmp_path):
    from fglrepro.cli.report import main

    snap, studies = synthetic_snapshot(tmp_path)
    main(["coverage", "--snapshot", str(snap), "--study-dir", str(studies), "--paper-dir", str(tmp_path),
          "--notes", str(tmp_path / "none.yaml")])
    assert "| Table 2 | `s` | 3 of 3 | 1 of 3 |" in (snap / "COVERAGE.md").read_text()
    assert len(pd.read_csv(snap / "COVERAGE.csv")) == 4
    (tmp_path / "notes").mkdir()
    doc = generate(snap, studies, tmp_path / "notes")
    fedtad = doc[doc.index("## FedTAD"):doc.index("## O-pFGL")]
    assert "### Coverage" in fedtad and "| Figure 5 | `t` | not implemented | - | - |" in fedtad


def test_the_html_section_counts_the_seeds_of_this_workflow_run(tmp_path):
    (tmp_path / "metrics").mkdir()
    runs(every(seeds=(0, 1))).to_csv(tmp_path / "metrics" / "s.csv", index=False)
    meta = {"study": "s", "table": "Table 2", "columns": [["Cora", 5], ["Cora", 10]],
            "labels": {"a": "A", "b": "B"}, "protocol": {"seeds": [0, 1, 2]}}
    html = run_coverage_html("FedTAD", [meta], tmp_path)
    assert "<td>2 of 3</td>" in html and "<td>2 of 2</td>" in html


@committed
def test_committed_coverage_is_what_the_snapshot_and_study_files_give():
    table = snapshot_coverage(SNAPSHOT, STUDY_DIR, PAPER_DIR, NOTES / "coverage.yaml")
    assert (SNAPSHOT / "COVERAGE.md").read_text() == coverage_markdown(table, PAPERS), (
        "docs/results/COVERAGE.md is stale: run `fgl-report coverage` (defaults: docs/results, config/studies)")
    assert (SNAPSHOT / "COVERAGE.csv").read_text() == table.to_csv(index=False)


def test_a_note_on_a_cell_that_became_complete_is_reported_as_stale():
    note = [{"study": "s", "datasets": ["Cora"], "tag": "CPU budget", "reason": "seed 2 left for later"}]
    partial = coverage_cell(PLAN, "Cora", runs(every(seeds=(0, 1))), OFFLINE, note, paper_seeds=3)
    complete = coverage_cell(PLAN, "Cora", runs(every()), OFFLINE, note, paper_seeds=3)
    table = pd.DataFrame([partial, complete])
    assert [c["status"] for c in (partial, complete)] == ["partial", "complete"]
    assert stale_notes(table) == ["s x Cora"]
    assert stale_notes(table.iloc[:1]) == []


@committed
def test_committed_notes_say_nothing_about_complete_cells():
    table = snapshot_coverage(SNAPSHOT, STUDY_DIR, PAPER_DIR, NOTES / "coverage.yaml")
    assert stale_notes(table) == [], "remove these cells' notes from docs/notes/coverage.yaml"


@committed
def test_committed_coverage_counts_the_distinct_ok_seeds_of_runs_csv():
    """Every (study, dataset) of runs.csv with an ok run is a cell with that many seeds; every study file
    has its cells; a cell without runs gives a reason."""
    coverage = pd.read_csv(SNAPSHOT / "COVERAGE.csv").fillna({"reason": ""})
    ran = pd.read_csv(SNAPSHOT / "runs.csv")
    seeds = ran[ran["status"] == "ok"].groupby(["study", "dataset"])["seed"].nunique()
    cells = coverage[coverage["status"].isin(["complete", "partial"])].set_index(["study", "dataset"])["seeds_ok"]
    assert cells.sort_index().to_dict() == seeds.sort_index().to_dict()
    assert {p.stem for p in STUDY_DIR.glob("*.yaml")} <= set(coverage["study"].dropna())
    not_run = coverage[coverage["status"] == "not run"]
    assert not_run["reason"].isin(REASONS).all()
