"""Result tables: cell summaries, the papers' layouts and the comparison with reported values."""

from __future__ import annotations

import pandas as pd
import pytest

from fglrepro.report.tables import cell_summary, comparison, comparison_grid_markdown, side_by_side, to_markdown

META = {"rows": ["B", "A"], "columns": [["Cora", 10], ["CiteSeer", 10]], "decimals": 1,
        "paper": "P", "table": "Table 1"}


@pytest.fixture
def summary():
    rows = [{"label": label, "dataset": d, "clients": 10, "seed": s, "status": "ok",
             "test_acc": acc + s, "test_f1_macro": f1 + s}
            for label, d, acc, f1 in [("A", "Cora", 70, 40), ("B", "Cora", 60, 50), ("A", "CiteSeer", 65, 30),
                                      ("B", "CiteSeer", 66, 20)]
            for s in (0, 1, 2)]
    return cell_summary(pd.DataFrame(rows))


def test_side_by_side_puts_accuracy_and_f1_of_each_dataset_next_to_each_other(summary):
    text, best = side_by_side(summary, META)
    assert list(text.columns) == [("Cora", 10, "acc"), ("Cora", 10, "f1_macro"),
                                  ("CiteSeer", 10, "acc"), ("CiteSeer", 10, "f1_macro")]
    assert list(text.index) == ["B", "A"]
    assert text.loc["A", ("Cora", 10, "acc")] == "71.0 ± 1.0"  # sample std of 70, 71, 72 (ddof=1) is 1.0
    assert text.loc["B", ("Cora", 10, "f1_macro")] == "51.0 ± 1.0"
    # the best of each column is marked separately per metric
    assert best.loc["A", ("Cora", 10, "acc")] and best.loc["B", ("Cora", 10, "f1_macro")]
    header = to_markdown(text, best, "t").splitlines()[2]
    assert header == "| Method | Cora (10) Acc | Cora (10) F1 | CiteSeer (10) Acc | CiteSeer (10) F1 |"


def test_comparison_gives_delta_to_the_reported_value_and_keeps_unreported_cells(summary):
    reported = pd.DataFrame([{"paper": "P", "table": "Table 1", "method": "A", "dataset": "Cora", "clients": 10,
                              "metric": "acc", "mean": 70.5, "std": 0.1}])
    table = comparison(summary, reported, META)
    row = table[(table.method == "A") & (table.dataset == "Cora") & (table.metric == "acc")].iloc[0]
    assert row.delta == pytest.approx(0.5)
    assert table["reported_mean"].isna().sum() == len(table) - 1


def test_comparison_grid_shows_ours_with_the_paper_value_and_delta(summary):
    reported = pd.DataFrame([{"paper": "P", "table": "Table 1", "method": "A", "dataset": "Cora", "clients": 10,
                              "metric": m, "mean": v, "std": 0.1} for m, v in (("acc", 70.5), ("f1_macro", 45.0))])
    lines = comparison_grid_markdown(comparison(summary, reported, META), META, "t").splitlines()
    assert lines[2] == "| Method | Cora (10) Acc | Cora (10) F1 | CiteSeer (10) Acc | CiteSeer (10) F1 |"
    assert lines[4] == "| B | 61.0 | 51.0 | 67.0 | 21.0 |"
    assert lines[5] == "| A | 71.0 (70.5, +0.5) | 41.0 (45.0, -4.0) | 66.0 | 31.0 |"


def test_a_row_marked_not_reproducible_shows_its_reason_and_the_papers_values(summary):
    meta = {**META, "rows": ["B", "T", "A"], "not_reproducible": {"T": "not reproducible: no description or code"}}
    reported = pd.DataFrame([{"paper": "P", "table": "Table 1", "method": "T", "dataset": d, "clients": 10,
                              "metric": "acc", "mean": v, "std": 0.1} for d, v in (("Cora", 79.9), ("PubMed", 85.0))])
    text, best = side_by_side(summary, meta)
    assert list(text.index) == ["B", "T", "A"]
    assert set(text.loc["T"]) == {"not reproducible: no description or code"} and not best.loc["T"].any()
    table = comparison(summary, reported, meta)
    row = table[table.method == "T"]
    assert len(row) == 1 and row.iloc[0].n_runs == 0 and row.iloc[0].reported_mean == 79.9  # PubMed is no column
    lines = comparison_grid_markdown(table, meta, "t").splitlines()
    assert lines[5] == "| T | not reproducible: no description or code (79.9) |  |"  # only acc is reported


def test_one_seed_prints_the_bare_mean_and_no_zero_std():
    one = cell_summary(pd.DataFrame([{"label": "A", "dataset": "Cora", "clients": 10, "seed": 0, "status": "ok",
                                      "test_acc": 70.0, "test_f1_macro": 40.0}]))
    assert one["std"].isna().all()
    text, _ = side_by_side(one, {**META, "rows": ["A"], "columns": [["Cora", 10]]})
    assert text.loc["A", ("Cora", 10, "acc")] == "70.0 (n=1)"


def test_a_cell_with_a_run_that_did_not_learn_is_marked_with_a_legend():
    from fglrepro.report.tables import NOT_LEARNING_MARK, comparison_texts, study_table_texts

    rows = [{"label": label, "dataset": "Cora", "clients": 10, "seed": s, "status": "ok", "test_acc": 70.0 + s,
             "test_f1_macro": 40.0, "learning": "not learning: loss grew" if (label, s) == ("A", 1) else None}
            for label in ("A", "B") for s in (0, 1)]
    summary = cell_summary(pd.DataFrame(rows))
    assert list(summary.loc[summary.metric == "acc", "not_learning"]) == [1, 0]
    meta = {**META, "rows": ["A", "B"], "columns": [["Cora", 10]], "study": "s"}
    text, _ = side_by_side(summary, meta)
    assert text.loc["A", ("Cora", 10, "acc")] == f"70.5 ± 0.7 {NOT_LEARNING_MARK}"
    assert NOT_LEARNING_MARK not in text.loc["B", ("Cora", 10, "acc")]
    files = study_table_texts(summary, meta)
    assert f"{NOT_LEARNING_MARK} not learning" in files["md"] and r"$^\dagger$" in files["tex"]
    reported = pd.DataFrame([{"paper": "P", "table": "Table 1", "method": "A", "dataset": "Cora", "clients": 10,
                              "metric": "acc", "mean": 71.0, "std": 0.5}])
    table = comparison(summary, reported, meta)
    md = comparison_texts(table, meta)["md"]
    assert f"| 70.5 {NOT_LEARNING_MARK} (71.0, -0.5) |" in md and f"{NOT_LEARNING_MARK} not learning" in md
    # without a learning column (the snapshot's runs.csv): no column, no mark, no legend
    plain = cell_summary(pd.DataFrame(rows).drop(columns="learning"))
    assert "not_learning" not in plain.columns and "not learning" not in study_table_texts(plain, meta)["md"]
