"""The papers' claims as data: verdicts on synthetic metrics, and the checks before any job runs."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
import yaml

from fglrepro.report.claims import (
    PAPER_SEEDS,
    check_claims,
    claims_markdown,
    claims_problems,
    evaluate,
    verdict,
)

REPO = Path(__file__).resolve().parents[1]
SCHEMA = REPO / "workflow" / "schemas" / "claims.schema.yaml"
COLUMNS = [["Cora", 5], ["Cora", 10], ["CiteSeer", 5]]


def make_meta(labels, columns=COLUMNS, all_rows=None, study="s"):
    """Study metadata as the workflow passes it (rows trained: ``labels``; every row of the file: ``all_rows``)."""
    return {"study": study, "paper": "P", "table": "Table 1", "title": study, "decimals": 1,
            "labels": {label.lower(): label for label in labels}, "rows": list(labels),
            "all_rows": list(all_rows or labels), "not_reproducible": {}, "columns": columns, "reported": None}


def make_metrics(means, seeds=(0, 1, 2), spread=0.0, study="s", offsets=None, scheme="louvain_x"):
    """Metrics rows: ``means[label][(dataset, clients)]`` = mean accuracy (F1 = accuracy - 10), or a
    status string for a cell whose runs all failed; seed s adds ``(s - 1) * spread``, or ``offsets[s]``."""
    rows = []
    for label, cells in means.items():
        for (dataset, clients), mean in cells.items():
            for seed in seeds:
                ok = not isinstance(mean, str)
                shift = offsets[seed] if offsets is not None else (seed - 1) * spread
                value = mean + shift if ok else float("nan")
                rows.append({"study": study, "run": label.lower(), "label": label, "method": "m", "dataset": dataset,
                             "partition": "louvain", "scheme": scheme, "clients": clients, "seed": seed,
                             "grid_point": None, "status": "ok" if ok else mean, "test_acc": value,
                             "test_f1_macro": value - 10, "best_round": 5, "rounds_run": 10, "wall_s": 1.0,
                             "device": "cpu", "git_commit": "abc123"})
    return pd.DataFrame(rows)


def claim(**keys):
    return {"id": "c", "paper": "P", "study": "s", "source": "Table 1", "statement": "X wins.", **keys}


def run_claims(claims, means, labels=None, metas=None, reported=None, **metric_options):
    labels = labels or list(means)
    metas = metas or {"s": make_meta(labels)}
    return evaluate(claims, metas, {"s": make_metrics(means, **metric_options)}, reported)


def every_cell(value):
    return {tuple(c): value for c in COLUMNS}


@pytest.mark.parametrize("clear_holds, clear_fails, checked, expected", [
    (3, 0, 3, "confirmed"), (1, 0, 3, "partly"), (1, 2, 3, "partly"), (0, 3, 3, "refuted"), (0, 1, 3, "refuted"),
    (0, 0, 3, "inconclusive"), (0, 0, 0, "not run")])
def test_verdict_counts_only_clear_checks(clear_holds, clear_fails, checked, expected):
    assert verdict(clear_holds, clear_fails, checked) == expected


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


def test_a_tie_does_not_beat_and_is_within_noise():
    table, cells = run_claims([claim(kind="beats", row="A")], {"A": every_cell(72.0), "B": every_cell(72.0)})
    assert table.loc[0, ["holds", "clearly_fails", "verdict"]].tolist() == [0, 0, "inconclusive"]
    assert set(cells["evidence"]) == {"within noise"}


@pytest.mark.parametrize("seeds, kind", [((0, 1, 2), "beats"), ((0, 1, 2, 3, 4), "beats"), ((0, 1, 2), "above")])
def test_a_margin_of_003_with_std_2_is_never_confirmed(seeds, kind):
    """The means hold (72.03 > 72.00) but the seeds of A spread by std 2: within noise, not confirmed."""
    centred = [s - (len(seeds) - 1) / 2 for s in seeds]
    unit = (sum(c * c for c in centred) / (len(seeds) - 1)) ** 0.5
    a = make_metrics({"A": every_cell(72.03)}, seeds=seeds, offsets=[2.0 * c / unit for c in centred])  # std 2
    b = make_metrics({"B": every_cell(72.0)}, seeds=seeds, offsets=[0.1 * c / unit for c in centred])
    keys = {"row": "A"} if kind == "beats" else {"pairs": [["A", "B"]]}
    table, cells = evaluate([claim(kind=kind, **keys)], {"s": make_meta(["A", "B"])}, {"s": pd.concat([a, b])})
    assert table.loc[0, ["holds", "clearly_holds", "within_noise", "verdict"]].tolist() == [3, 0, 3, "inconclusive"]
    assert set(cells["test"]) == {"paired"}


def test_one_seed_has_no_interval_whatever_the_margin():
    table, cells = run_claims([claim(kind="beats", row="A")], {"A": every_cell(90.0), "B": every_cell(70.0)},
                              seeds=(0,))
    assert table.loc[0, ["holds", "verdict", "seeds"]].tolist() == [3, "inconclusive", "1"]
    assert set(cells["evidence"]) == {"n=1"} and cells["low"].isna().all()
    assert "+20.0 (n=1)" in table.loc[0, "numbers"]


def test_pairing_by_seed_removes_the_shared_seed_effect_and_welch_does_not():
    """A = B + 1 +- 0.1 on every seed while the seeds move both by +-5: paired, the margin is clear;
    on different partition schemes the rows are not paired and Welch sees the seed spread."""
    offsets = {0: -5.0, 1: 0.0, 2: 5.0}
    b = make_metrics({"B": every_cell(70.0)}, offsets=offsets)
    a = make_metrics({"A": every_cell(71.0)}, offsets={s: o + 0.1 * (s - 1) for s, o in offsets.items()})
    above = [claim(kind="above", pairs=[["A", "B"]])]
    table, cells = evaluate(above, {"s": make_meta(["A", "B"])}, {"s": pd.concat([a, b])})
    assert table.loc[0, "verdict"] == "confirmed" and set(cells["test"]) == {"paired"}
    half = 4.302653 * 0.1 / 3 ** 0.5  # paired t: diffs 0.9, 1.0, 1.1 -> 1 +- t(.975, df 2) * 0.1 / sqrt(3)
    assert cells.loc[0, ["low", "high"]].tolist() == pytest.approx([1 - half, 1 + half])
    a["scheme"] = "other_scheme"
    table, cells = evaluate(above, {"s": make_meta(["A", "B"])}, {"s": pd.concat([a, b])})
    assert table.loc[0, "verdict"] == "inconclusive" and set(cells["test"]) == {"Welch"}


def test_a_clear_failure_refutes_and_clear_holds_with_failures_are_partly():
    means = {"A": {("Cora", 5): 75.0, ("Cora", 10): 65.0, ("CiteSeer", 5): 70.0}, "B": every_cell(70.0)}
    table, _ = run_claims([claim(kind="above", pairs=[["A", "B"]])], means, spread=0.5)
    assert table.loc[0, ["clearly_holds", "clearly_fails", "within_noise", "verdict"]].tolist() == [1, 1, 1, "partly"]
    means["A"][("Cora", 5)] = 70.0
    table, _ = run_claims([claim(kind="above", pairs=[["A", "B"]])], means, spread=0.5)
    assert table.loc[0, "verdict"] == "refuted"


def test_beats_is_clear_only_when_every_rival_is_clearly_below():
    """A clearly above B but within noise of C (C's seeds spread): within noise; D clearly above: fails."""
    a = make_metrics({"A": every_cell(75.0), "B": every_cell(70.0)}, spread=0.2)
    c = make_metrics({"C": every_cell(74.0)}, spread=4.0)
    table, _ = evaluate([claim(kind="beats", row="A")], {"s": make_meta(["A", "B", "C"])}, {"s": pd.concat([a, c])})
    assert table.loc[0, ["holds", "within_noise", "verdict"]].tolist() == [3, 3, "inconclusive"]
    d = make_metrics({"D": every_cell(80.0)}, spread=0.2)
    table, _ = evaluate([claim(kind="beats", row="A", rank=2)], {"s": make_meta(["A", "B", "C", "D"])},
                        {"s": pd.concat([a, c, d])})
    assert table.loc[0, "verdict"] == "inconclusive"  # second place: D clearly above, C within noise
    table, _ = evaluate([claim(kind="beats", row="A")], {"s": make_meta(["A", "B", "C", "D"])},
                        {"s": pd.concat([a, c, d])})
    assert table.loc[0, ["clearly_fails", "verdict"]].tolist() == [3, "refuted"]
    # the closest rival (B) is clearly below, a far noisy one (E) keeps the check within noise: both are shown
    e = make_metrics({"E": every_cell(60.0)}, spread=20.0)
    table, _ = evaluate([claim(kind="beats", row="A")], {"s": make_meta(["A", "B", "E"])}, {"s": pd.concat([a, e])})
    assert table.loc[0, "verdict"] == "inconclusive"
    assert "Cora 5 ✓ 75.0 vs 70.0 B, +5.0 [+5.0, +5.0]; vs E +15.0 [" in table.loc[0, "numbers"]


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
    means["C"] = every_cell(75.0)  # a tie with the third ranks A third, within noise
    table, _ = run_claims([claim(kind="beats", row="A", rank=2)], means)
    assert table.loc[0, ["holds", "verdict"]].tolist() == [0, "inconclusive"] and "rank 3" in table.loc[0, "numbers"]
    means["C"] = every_cell(76.0)
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


def with_rounds(metrics: pd.DataFrame, rounds: dict) -> pd.DataFrame:
    """``metrics`` with a convergence round per row label (``rounds[label]``, seed s adds s)."""
    return metrics.assign(converge_round=[rounds[label] + seed for label, seed in zip(metrics.label, metrics.seed)])


@pytest.mark.parametrize("kind", ["beats", "above"])
def test_fewer_rounds_to_converge_beat_more(kind):
    keys = {"row": "A"} if kind == "beats" else {"pairs": [["A", "B"]]}
    means = {"A": every_cell(70.0), "B": every_cell(75.0)}
    meta = {"s": make_meta(["A", "B"])}
    faster = with_rounds(make_metrics(means), {"A": 12, "B": 30})
    table, cells = evaluate([claim(kind=kind, metrics=["rounds"], **keys)], meta, {"s": faster})
    assert table.loc[0, ["checks", "holds", "clearly_holds", "verdict"]].tolist() == [3, 3, 3, "confirmed"]
    assert set(cells["metric"]) == {"rounds"}
    assert ("13.0 < 31.0" if kind == "above" else "13.0 vs 31.0 B") in table.loc[0, "numbers"]
    slower = with_rounds(make_metrics(means), {"A": 40, "B": 30})
    table, _ = evaluate([claim(kind=kind, metrics=["rounds"], **keys)], meta, {"s": slower})
    assert table.loc[0, ["holds", "clearly_fails", "verdict"]].tolist() == [0, 3, "refuted"]


def test_runs_without_a_convergence_round_leave_a_rounds_check_not_run():
    means = {"A": every_cell(70.0), "B": every_cell(75.0)}
    older = make_metrics(means)  # rows from before the column: no convergence round
    table, _ = evaluate([claim(kind="beats", row="A", metrics=["rounds"])], {"s": make_meta(["A", "B"])}, {"s": older})
    assert table.loc[0, ["checks", "verdict"]].tolist() == [0, "not run"]


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


def test_a_clear_loss_to_the_rivals_that_ran_fails_whatever_the_missing_rivals():
    """B has no run in Cora 5: A's clear loss to C stands there; where A beats C, the check waits for B."""
    means = {"A": every_cell(70.0), "B": {("Cora", 10): 60.0, ("CiteSeer", 5): 60.0},
             "C": {("Cora", 5): 75.0, ("Cora", 10): 65.0, ("CiteSeer", 5): 71.0}}
    table, cells = run_claims([claim(kind="beats", row="A", metrics=["acc"])], means, spread=0.2)
    cora5 = cells[(cells["dataset"] == "Cora") & (cells["clients"] == 5)]
    assert set(cora5["result"]) == {"fails"} and set(cora5["row"]) == {"A", "C"}
    assert "Cora 5 ✗ 70.0 vs 75.0 C, -5.0" in table.loc[0, "numbers"] and "(B not run)" in table.loc[0, "numbers"]
    assert table.loc[0, ["checks", "clearly_fails", "clearly_holds", "verdict"]].tolist() == [3, 2, 1, "partly"]
    means["C"][("Cora", 5)] = 65.0
    table, cells = run_claims([claim(kind="beats", row="A", metrics=["acc"])], means, spread=0.2)
    assert table.loc[0, ["checks", "not_run"]].tolist() == [2, 1]
    assert set(cells.loc[(cells["dataset"] == "Cora") & (cells["clients"] == 5), "reason"]) == {"B: no ok run"}
    means["C"][("Cora", 5)] = 70.5  # a loss within noise (C's seeds spread) could still turn either way: not run
    noisy_c = make_metrics({"C": means.pop("C")}, spread=3.0)
    table, _ = evaluate([claim(kind="beats", row="A", metrics=["acc"])], {"s": make_meta(["A", "B", "C"])},
                        {"s": pd.concat([make_metrics(means, spread=0.2), noisy_c])})
    assert table.loc[0, ["checks", "not_run"]].tolist() == [2, 1]


def test_rows_left_out_of_the_run_are_named_and_checks_needing_them_are_not_run():
    means = {"A": every_cell(75.0), "B": every_cell(70.0)}
    metas = {"s": make_meta(["A", "B"], all_rows=["A", "B", "Skipped"])}
    table, cells = run_claims([claim(kind="beats", row="A")], means, metas=metas)
    assert table.loc[0, ["verdict", "left_out"]].tolist() == ["confirmed", "Skipped"]
    table, cells = run_claims([claim(kind="above", pairs=[["A", "Skipped"]])], means, metas=metas)
    assert table.loc[0, "verdict"] == "not run" and set(cells["reason"]) == {"Skipped: not run here"}


def test_markdown_has_a_section_per_paper_with_verdict_evidence_seeds_and_the_papers_support():
    table, _ = run_claims([claim(kind="beats", row="A", statement="A | wins", table="Table 1")],
                          {"A": every_cell(75.0), "B": every_cell(70.0)}, spread=0.5,
                          reported=reported_table({"A": [69.0, 80.0], "B": [70.0, 70.0]}))
    md = claims_markdown(table)
    assert "## P" in md
    assert ("| c | Table 1 | A \\| wins | **confirmed** | 3 clearly hold (of 3) | n=3 | ⚠ partly (1 of 2 hold, "
            "1 clearly) |") in md


# ---- the paper's own table ---------------------------------------------------------------------------

def reported_table(means, std=0.5, table="Table 1", clients=(5, 10)):
    """A paper's table: ``means[method][i]`` in cell (Cora, clients[i]), accuracy, one std for all."""
    return pd.DataFrame([{"paper": "P", "table": table, "method": m, "dataset": "Cora", "clients": k, "metric": "acc",
                          "mean": v, "std": std} for m, values in means.items() for k, v in zip(clients, values)])


def test_the_papers_table_goes_through_the_same_checks_with_its_stds():
    reported = reported_table({"A": [75.0, 70.5], "B": [70.0, 70.0]})
    table, cells = run_claims([claim(kind="above", pairs=[["A", "B"]], table="Table 1")],
                              {"A": every_cell(75.0), "B": every_cell(70.0)}, reported=reported)
    assert table.loc[0, ["paper_checks", "paper_holds", "paper_clearly_holds", "paper_support"]].tolist() == [
        2, 2, 1, "yes"]
    paper = cells[cells["side"] == "paper"].drop_duplicates("clients").set_index("clients")
    # Welch from mean/std with the paper's seeds: 0.5 +- t(df) * sqrt(2 * 0.25 / n)
    assert PAPER_SEEDS.get("P", 3) == 3 and paper.loc[10, "evidence"] == "within noise"
    assert paper.loc[10, "low"] == pytest.approx(0.5 - 2.776445 * (0.5 / 3) ** 0.5, abs=1e-5)
    table, _ = run_claims([claim(kind="above", pairs=[["B", "A"]], table="Table 1")],
                          {"A": every_cell(75.0), "B": every_cell(70.0)}, reported=reported)
    assert table.loc[0, "paper_support"] == "no"
    table, _ = run_claims([claim(kind="above", pairs=[["A", "B"]])], {"A": every_cell(75.0), "B": every_cell(70.0)},
                          reported=reported)
    assert table.loc[0, ["paper_checks", "paper_support"]].tolist() == [0, "n/a"]  # no table: a figure


def test_the_papers_blank_cells_drop_out_of_beats_and_its_rows_missing_from_the_study_are_named():
    reported = reported_table({"A": [75.0, 75.0], "B": [70.0, 70.0], "Z": [80.0, float("nan")]})
    table, _ = run_claims([claim(kind="beats", row="A", table="Table 1")],
                          {"A": every_cell(75.0), "B": every_cell(70.0)}, reported=reported)
    assert table.loc[0, ["paper_checks", "paper_holds", "paper_support"]].tolist() == [2, 1, "partly"]
    assert table.loc[0, "left_out"] == "Z (not in the study)"


# ---- magnitudes --------------------------------------------------------------------------------------

def magnitude(**keys):
    return claim(kind="magnitude", pairs=[["A", "B"]], table="Table 1", **keys)


def test_a_stated_mean_gain_is_checked_on_the_papers_table_in_points_or_relative():
    reported = reported_table({"A": [75.0, 72.0], "B": [70.0, 70.0]})  # gains 5 and 2 points: mean 3.5
    means = {"A": every_cell(75.0), "B": every_cell(70.0)}
    table, _ = run_claims([magnitude(value=3.5, tolerance=0.01), magnitude(value=4.4, tolerance=0.01),
                           magnitude(value=5.0, unit="relative", tolerance=0.01)], means, reported=reported)
    assert table["paper_support"].tolist() == ["yes", "no", "yes"]  # relative: (7.14 + 2.86) / 2 = 5.0
    assert "mean of 2 gains 3.50 vs 3.5 ± 0.01" in table.loc[0, "paper_numbers"]
    # ours: the mean over the paper's cells; CiteSeer 5 is not in the paper's table
    assert table.loc[0, ["checks", "holds", "verdict"]].tolist() == [1, 0, "refuted"]  # ours: 5 points, clear


def test_a_stated_gain_needs_every_cell_of_the_papers_table():
    reported = reported_table({"A": [75.0, 72.0], "B": [70.0, 70.0]}, clients=(5, 20))
    table, _ = run_claims([magnitude(value=3.5, tolerance=0.01)], {"A": every_cell(75.0), "B": every_cell(70.0)},
                          reported=reported)
    assert table.loc[0, ["verdict", "reason"]].tolist() == [
        "not run", "1 of the 2 gains the statistic needs ran (1 cells missing)"]


def test_the_largest_gain_and_a_bound_on_each_cell():
    reported = reported_table({"A": [61.3, 75.0], "B": [60.9, 74.8]}, std=0.1)  # gains 0.4 and 0.2
    table, _ = run_claims([magnitude(statistic="max", value=0.4, tolerance=0.05),
                           magnitude(statistic="each", relation="below", value=0.4)],
                          {"A": every_cell(75.0), "B": every_cell(74.9)}, reported=reported)
    assert table.loc[0, "paper_support"] == "yes"
    # "a decline of less than 0.4": 61.3 - 60.9 is 0.4, not below it (no float error)
    assert table.loc[1, ["paper_checks", "paper_holds", "paper_support"]].tolist() == [2, 1, "partly"]
    assert table.loc[1, ["checks", "holds", "clearly_holds"]].tolist() == [3, 3, 3]  # ours: 0.1 below 0.4, seeds equal


@pytest.mark.parametrize("keys, message", [
    ({"statistic": "each"}, "statistic each takes relation below (one check per cell), not 'about'"),
    ({}, "relation about needs a tolerance"),
])
def test_bad_magnitude_claims_are_reported(keys, message):
    bad = claim(kind="magnitude", pairs=[["A", "B"]], value=1.0, study="s", **keys)
    problems = check_claims([bad], {"s": {**STUDIES["s"], "runs": {"a": {"label": "A"}, "b": {"label": "B"}}}})
    assert any(message in p for p in problems), problems


# ---- checks before any job -------------------------------------------------------------------------

STUDIES = {"s": {"paper": "P", "table": "Table 1", "datasets": ["Cora", "CiteSeer"], "clients": [5, 10],
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
    ({"table": "Table 2"}, "table: 'Table 2' is not the table of study s, 'Table 1'"),
    ({"kind": "spread", "row": None, "within": 1.0, "metrics": ["rounds"]},
     "metrics ['rounds'] (less is better) need kind above or beats, not spread"),
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
    assert any("kind = 'wins' is not valid; choose one of ['beats', 'between', 'above', 'spread', 'magnitude']" in p
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
    stats = work / "results" / "tables" / "tiny.partition_stats.csv"
    stats.parent.mkdir(parents=True)
    stats.write_text("dataset,partitioner,clients,stat,reported,reproduced\nCora,louvain,3,nodes,,902.7\n")
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
    assert (snapshot / stats.name).read_text() == stats.read_text()
