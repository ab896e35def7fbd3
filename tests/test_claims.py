"""The papers' claims as data: verdicts on synthetic metrics, and the checks before any job runs."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
import yaml

from fglrepro.report.claims import check_claims, claims_markdown, claims_problems, evaluate, verdict
from fglrepro.report.tables import cell_summary

REPO = Path(__file__).resolve().parents[1]
SCHEMA = REPO / "workflow" / "schemas" / "claims.schema.yaml"
COLUMNS = [["Cora", 5], ["Cora", 10], ["CiteSeer", 5]]


def make_meta(labels, columns=COLUMNS, all_rows=None, study="s"):
    """Study metadata as the workflow passes it (rows trained: ``labels``; every row of the file: ``all_rows``)."""
    return {"study": study, "paper": "P", "table": "Table 1", "title": study, "decimals": 1,
            "labels": {label.lower(): label for label in labels}, "rows": list(labels),
            "all_rows": list(all_rows or labels), "not_reproducible": {}, "columns": columns, "reported": None}


def make_metrics(means, seeds=(0, 1, 2), spread=0.0, study="s"):
    """Metrics rows: ``means[label][(dataset, clients)]`` = mean accuracy (F1 = accuracy - 10), or a
    status string for a cell whose runs all failed; seed s adds ``(s - 1) * spread``."""
    rows = []
    for label, cells in means.items():
        for (dataset, clients), mean in cells.items():
            for seed in seeds:
                ok = not isinstance(mean, str)
                value = mean + (seed - 1) * spread if ok else float("nan")
                rows.append({"study": study, "run": label.lower(), "label": label, "method": "m", "dataset": dataset,
                             "partition": "louvain", "scheme": "louvain_x", "clients": clients, "seed": seed,
                             "grid_point": None, "status": "ok" if ok else mean, "test_acc": value,
                             "test_f1_macro": value - 10, "best_round": 5, "rounds_run": 10, "wall_s": 1.0,
                             "device": "cpu", "git_commit": "abc123"})
    return pd.DataFrame(rows)


def claim(**keys):
    return {"id": "c", "paper": "P", "study": "s", "source": "Table 1", "statement": "X wins.", **keys}


def run_claims(claims, means, labels=None, metas=None, **metric_options):
    labels = labels or list(means)
    metas = metas or {"s": make_meta(labels)}
    return evaluate(claims, metas, {"s": cell_summary(make_metrics(means, **metric_options))})


def every_cell(value):
    return {tuple(c): value for c in COLUMNS}


@pytest.mark.parametrize("holds, checked, expected", [
    (3, 3, "confirmed"), (1, 3, "partly"), (0, 3, "refuted"), (0, 0, "not run")])
def test_verdict_of_n_of_m(holds, checked, expected):
    assert verdict(holds, checked) == expected


def test_beats_is_confirmed_partly_or_refuted_cell_by_cell():
    base = {"B": every_cell(70.0), "C": every_cell(72.0)}
    table, _ = run_claims([claim(kind="beats", row="A")], {"A": every_cell(75.0), **base})
    assert table.loc[0, ["checks", "holds", "verdict"]].tolist() == [3, 3, "confirmed"]
    partly = {"A": {("Cora", 5): 75.0, ("Cora", 10): 71.0, ("CiteSeer", 5): 80.0}, **base}
    table, cells = run_claims([claim(kind="beats", row="A")], partly)
    assert table.loc[0, ["checks", "holds", "verdict"]].tolist() == [3, 2, "partly"]
    failed = cells[(cells["dataset"] == "Cora") & (cells["clients"] == 10)]
    assert set(failed["result"]) == {"fails"}
    assert "Cora 10 ✗ 71.0 vs 72.0 C" in table.loc[0, "numbers"]
    table, _ = run_claims([claim(kind="beats", row="A")], {"A": every_cell(60.0), **base})
    assert table.loc[0, ["holds", "verdict"]].tolist() == [0, "refuted"]


def test_a_tie_does_not_beat_and_the_std_is_not_used():
    table, _ = run_claims([claim(kind="beats", row="A")], {"A": every_cell(72.0), "B": every_cell(72.0)})
    assert table.loc[0, "verdict"] == "refuted"
    # A's mean is higher although its seeds spread far beyond B's: A beats B in every cell
    summary = pd.concat([cell_summary(make_metrics({"A": every_cell(72.1)}, spread=9.0)),
                         cell_summary(make_metrics({"B": every_cell(72.0)}))])
    table, _ = evaluate([claim(kind="beats", row="A")], {"s": make_meta(["A", "B"])}, {"s": summary})
    assert table.loc[0, "verdict"] == "confirmed"


def test_beats_compares_against_listed_rows_or_all_but_excluded_ones():
    means = {"A": every_cell(75.0), "B": every_cell(70.0), "A noisy": every_cell(80.0)}
    table, _ = run_claims([claim(kind="beats", row="A")], means)
    assert table.loc[0, "verdict"] == "refuted"
    table, cells = run_claims([claim(kind="beats", row="A", exclude=["A noisy"])], means)
    assert table.loc[0, "verdict"] == "confirmed" and "A noisy" not in set(cells["row"])
    table, _ = run_claims([claim(kind="beats", row="A", against=["B"])], means)
    assert table.loc[0, "verdict"] == "confirmed"


def test_rank_two_holds_for_the_second_best_not_the_third():
    means = {"A": every_cell(75.0), "B": every_cell(80.0), "C": every_cell(70.0)}
    table, _ = run_claims([claim(kind="beats", row="A", rank=2)], means)
    assert table.loc[0, "verdict"] == "confirmed" and "rank 2" in table.loc[0, "numbers"]
    means["C"] = every_cell(75.0)  # a tie with the third ranks A third
    table, _ = run_claims([claim(kind="beats", row="A", rank=2)], means)
    assert table.loc[0, "verdict"] == "refuted"


def test_between_holds_strictly_inside_and_fails_when_the_bounds_swap():
    means = {"GLS": every_cell(75.0), "GNNk": every_cell(70.0), "GNN": every_cell(80.0)}
    between = claim(kind="between", lower="GNNk", row="GLS", upper="GNN")
    table, _ = run_claims([between], means)
    assert table.loc[0, "verdict"] == "confirmed" and "70.0 < 75.0 < 80.0" in table.loc[0, "numbers"]
    means["GLS"] = {("Cora", 5): 81.0, ("Cora", 10): 80.0, ("CiteSeer", 5): 75.0}  # above, tie, inside
    table, _ = run_claims([between], means)
    assert table.loc[0, ["holds", "checks"]].tolist() == [1, 3]
    table, _ = run_claims([claim(kind="between", lower="GNN", row="GLS", upper="GNNk")], means)
    assert table.loc[0, "verdict"] == "refuted"


def test_above_checks_each_pair_in_each_cell_and_each_metric():
    means = {"X+T": every_cell(75.0), "X": every_cell(70.0), "Y+T": every_cell(60.0), "Y": every_cell(65.0)}
    table, cells = run_claims([claim(kind="above", pairs=[["X+T", "X"], ["Y+T", "Y"]], metrics=["acc", "f1_macro"])],
                              means)
    assert table.loc[0, ["checks", "holds", "verdict"]].tolist() == [12, 6, "partly"]
    assert set(cells["metric"]) == {"acc", "f1_macro"} and set(cells["role"]) == {"above", "below"}


def test_spread_holds_below_the_bound():
    means = {"l1": every_cell(75.0), "l2": every_cell(75.9), "l3": every_cell(75.5)}
    table, _ = run_claims([claim(kind="spread", within=1.0)], means)
    assert table.loc[0, "verdict"] == "confirmed"
    means["l3"] = {("Cora", 5): 76.0, ("Cora", 10): 75.5, ("CiteSeer", 5): 75.5}
    table, _ = run_claims([claim(kind="spread", within=1.0)], means)
    assert table.loc[0, ["holds", "checks"]].tolist() == [2, 3]


def test_datasets_and_clients_restrict_the_cells():
    means = {"A": every_cell(75.0), "B": every_cell(70.0)}
    table, cells = run_claims([claim(kind="beats", row="A", datasets=["Cora"], clients=[5])], means)
    assert table.loc[0, "checks"] == 1
    assert set(zip(cells["dataset"], cells["clients"])) == {("Cora", 5)}


def test_a_cell_without_ok_runs_is_not_run_and_a_study_out_of_the_run_is_not_run():
    means = {"A": {("Cora", 5): 75.0, ("Cora", 10): "oom", ("CiteSeer", 5): 75.0}, "B": every_cell(70.0)}
    table, cells = run_claims([claim(kind="beats", row="A")], means)
    assert table.loc[0, ["checks", "holds", "not_run", "verdict"]].tolist() == [2, 2, 1, "confirmed"]
    assert set(cells.loc[cells["clients"] == 10, "reason"]) == {"A: no ok run"}
    # every cell not run: verdict not run
    means = {"A": every_cell("diverged"), "B": every_cell(70.0)}
    table, _ = run_claims([claim(kind="beats", row="A")], means)
    assert table.loc[0, ["checks", "verdict"]].tolist() == [0, "not run"]
    table, _ = evaluate([claim(kind="beats", row="A", study="other")], {"s": make_meta(["A"])}, {})
    assert table.loc[0, ["checks", "verdict", "reason"]].tolist() == [0, "not run", "study other is not in this run"]


def test_rows_left_out_of_the_run_are_named_and_checks_needing_them_are_not_run():
    means = {"A": every_cell(75.0), "B": every_cell(70.0)}
    metas = {"s": make_meta(["A", "B"], all_rows=["A", "B", "Skipped"])}
    table, cells = run_claims([claim(kind="beats", row="A")], means, metas=metas)
    assert table.loc[0, ["verdict", "left_out"]].tolist() == ["confirmed", "Skipped"]
    table, cells = run_claims([claim(kind="above", pairs=[["A", "Skipped"]])], means, metas=metas)
    assert table.loc[0, "verdict"] == "not run" and set(cells["reason"]) == {"Skipped: not run here"}


def test_markdown_has_a_section_per_paper_with_n_of_m_and_verdict():
    table, _ = run_claims([claim(kind="beats", row="A", statement="A | wins")],
                          {"A": every_cell(75.0), "B": every_cell(70.0)})
    md = claims_markdown(table)
    assert "## P" in md and "| c | Table 1 | A \\| wins | 3 of 3 | **confirmed** |" in md


# ---- checks before any job -------------------------------------------------------------------------

STUDIES = {"s": {"paper": "P", "datasets": ["Cora", "CiteSeer"], "clients": [5, 10],
                 "runs": {"a": {"method": "fedavg", "label": "A"}, "b": {"not_reproducible": "why", "label": "B"}}}}


@pytest.mark.parametrize("keys, message", [
    ({"study": "t"}, "study: unknown study 't'; available studies: ['s']"),
    ({"row": "Z"}, "row: study s has no row 'Z'; its rows: ['A', 'B']"),
    ({"against": ["B", "Y"]}, "against[1]: study s has no row 'Y'"),
    ({"datasets": ["PubMed"]}, "datasets[0]: study s has no dataset 'PubMed'; its datasets: ['Cora', 'CiteSeer']"),
    ({"clients": [20]}, "clients[0]: study s has no client count 20; its client counts: [5, 10]"),
    ({"paper": "Q"}, "paper: 'Q' is not the paper of study s, 'P'"),
    ({"lower": "B"}, "kind beats takes no key(s) ['lower']; its keys: ['against', 'exclude', 'rank', 'row']"),
    ({"row": None}, "kind beats needs key(s) ['row']"),
    ({"against": ["B"], "exclude": ["B"]}, "give against (the rows compared) or exclude"),
])
def test_bad_claims_name_the_key_and_the_choices(keys, message):
    bad = {**claim(kind="beats", row="A"), **keys}
    bad = {k: v for k, v in bad.items() if v is not None}
    problems = check_claims([bad], STUDIES, "claims.yaml")
    assert any(message in p for p in problems), problems
    assert all(p.startswith("claims.yaml: claims[0] (c): ") for p in problems)


def test_duplicate_ids_and_schema_errors_are_reported(tmp_path):
    assert check_claims([claim(kind="beats", row="A")] * 2, STUDIES)[0].endswith("id 'c' is used twice")
    path = tmp_path / "claims.yaml"
    path.write_text(yaml.safe_dump({"claims": [claim(kind="wins", row="A")]}))
    (tmp_path / "studies").mkdir()
    problems = claims_problems(path, tmp_path / "studies", SCHEMA)
    assert any("kind = 'wins' is not valid; choose one of ['beats', 'between', 'above', 'spread']" in p
               for p in problems), problems
    assert "not found" in claims_problems(tmp_path / "none.yaml", tmp_path, SCHEMA)[0]


def test_the_papers_claims_file_is_valid_against_the_study_files():
    assert claims_problems(REPO / "config" / "paper" / "claims.yaml", REPO / "config" / "studies", SCHEMA) == []
    claims = yaml.safe_load((REPO / "config" / "paper" / "claims.yaml").read_text())["claims"]
    assert {c["paper"] for c in claims} == {"FedGKD", "FedGKC", "FedGLS", "FedTAD", "O-pFGL"}


def test_cli_writes_claims_tables_from_metrics_csvs(tmp_path):
    from fglrepro.cli.report import main

    make_metrics({"A": every_cell(75.0), "B": every_cell(70.0)}).to_csv(tmp_path / "s.csv", index=False)
    claims = tmp_path / "claims.yaml"
    claims.write_text(yaml.safe_dump({"claims": [claim(kind="beats", row="A"),
                                                 claim(id="d", kind="beats", row="A", study="t")]}))
    main(["claims", "--claims", str(claims), "--meta", json.dumps({"s": make_meta(["A", "B"])}),
          "--out-prefix", str(tmp_path / "claims"), str(tmp_path / "s.csv")])
    table = pd.read_csv(tmp_path / "claims.csv")
    assert table["verdict"].tolist() == ["confirmed", "not run"]
    assert len(pd.read_csv(tmp_path / "claims_cells.csv")) == 3 * 2
    assert "**confirmed**" in (tmp_path / "claims.md").read_text()


@pytest.mark.e2e
def test_workflow_checks_the_claims_of_the_studies_in_the_run(repo, tmp_path):
    """The claims rule reads the metrics CSV of the run's study only (no training: the CSV is
    synthetic and only the claims and snapshot rules may run); a claim about another study is
    "not run"; the snapshot rule writes docs/results/ from the same CSV."""
    import subprocess
    import sys

    from test_workflow import TINY_STUDY, make_workdir

    work = make_workdir(repo, tmp_path, TINY_STUDY)
    config = yaml.safe_load((work / "config" / "config.yaml").read_text())
    (work / "config" / "config.yaml").write_text(yaml.safe_dump({**config, "claims": "claims.yaml"}))
    claims = [claim(study="tiny", kind="beats", row="FedProx"), claim(id="d", study="tiny", kind="beats", row="FedAvg"),
              claim(id="e", study="other", kind="beats", row="FedAvg")]
    claims = [{**c, "paper": "TinyPaper"} for c in claims]
    (work / "config" / "paper" / "claims.yaml").write_text(yaml.safe_dump({"claims": claims}))
    other = {**TINY_STUDY, "runs": {"fedavg": {"method": "fedavg", "label": "FedAvg"}}}
    (work / "config" / "studies" / "other.yaml").write_text(yaml.safe_dump(other))
    (work / "results" / "metrics").mkdir(parents=True)
    means = {"FedProx": {("Cora", 3): 71.0}, "FedAvg": {("Cora", 3): 70.0}}
    make_metrics(means, seeds=(0, 1), study="tiny").to_csv(work / "results" / "metrics" / "tiny.csv", index=False)
    proc = subprocess.run([sys.executable, "-m", "snakemake", "results/tables/claims.csv", "snapshot", "--cores", "1",
                           "--allowed-rules", "claims", "snapshot"], cwd=work, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    table = pd.read_csv(work / "results" / "tables" / "claims.csv")
    assert table["verdict"].tolist() == ["confirmed", "refuted", "not run"]
    assert not (work / "results" / "runs").exists()
    # the snapshot of the same run: its claims are the claims table's, its runs carry their targets
    snapshot = work / "docs" / "results"
    assert pd.read_csv(snapshot / "claims.csv").equals(table)
    runs = pd.read_csv(snapshot / "runs.csv")
    assert runs["target"].iloc[0] == "results/runs/tiny/fedprox/Cora/louvain_x/k3/seed0.json"
    assert {"tiny.md", "tiny.comparison.md", "README.md"} <= {p.name for p in snapshot.iterdir()}
