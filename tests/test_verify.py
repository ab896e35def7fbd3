"""``fgl-report verify``: the seeded, cheapest-first choice of snapshot rows, the comparison of
rebuilt metrics with committed ones, its CLI errors, and one real rebuild through the workflow."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from fglrepro.config import ConfigError
from fglrepro.report.snapshot import run_target
from fglrepro.report.verify import (
    TOLERANCE,
    candidate_rows,
    classify,
    compare,
    compare_results,
    comparison_summary,
    grid_targets,
    input_paths,
    read_record,
    rebuilt_metrics,
    select_runs,
    selected_point,
    snakemake_command,
)

REPO = Path(__file__).resolve().parents[1]


def runs_table(n: int = 40) -> pd.DataFrame:
    """runs.csv-like rows: methods a..d with wall times rising with the row, one failed row and
    one FedSage+ row (the cheapest of all)."""
    rows = [{"study": "s" if i % 2 else "t", "run": f"m{i % 4}", "grid_point": None, "method": "abcd"[i % 4],
             "dataset": "Cora", "scheme": "louvain_x", "clients": 5, "seed": i, "status": "ok",
             "test_acc": 80.0 + i, "test_f1_macro": 70.0 + i, "best_round": 10, "rounds_run": 20,
             "wall_s": float(i + 1)} for i in range(n)]
    rows[3]["status"] = "diverged"
    rows.append({**rows[0], "run": "fedsage_plus", "method": "fedsage_plus", "wall_s": 0.5})
    return pd.DataFrame(rows)


def test_selection_is_deterministic_per_seed_and_runs_cheapest_first():
    runs = runs_table()
    first, again, other = (select_runs(runs, 6, seed) for seed in (0, 0, 1))
    assert first.index.tolist() == again.index.tolist()
    assert set(first.index) != set(other.index)
    assert first["wall_s"].is_monotonic_increasing and len(first) == 6
    assert set(first["status"]) == {"ok"}


def test_selection_skips_expensive_rows_and_fedsage_plus_unless_asked():
    runs = runs_table()
    cheap = candidate_rows(runs, max_seconds=10)
    assert cheap["wall_s"].max() <= 10 and "fedsage_plus" not in set(cheap["method"])
    assert len(candidate_rows(runs)) == 39  # 40 ok rows but one failed, FedSage+ left out
    named = select_runs(runs, 3, methods=["fedsage_plus"])
    assert named["method"].tolist() == ["fedsage_plus"]
    only = select_runs(runs, 100, studies=["s"], methods=["b"], max_seconds=None)
    assert set(only["study"]) == {"s"} and set(only["method"]) == {"b"} and len(only) == 10


def test_a_rebuild_draws_only_runs_made_on_its_kind_of_device():
    runs = runs_table().assign(device="cpu")
    runs.loc[[0, 1, 2], "device"] = ["cuda", "cuda:0", None]
    on_cpu = candidate_rows(runs)
    assert {0, 1}.isdisjoint(on_cpu.index) and 2 in on_cpu.index and len(on_cpu) == 37
    assert candidate_rows(runs, device="cuda").index.tolist() == [0, 1]


def test_unknown_study_or_method_lists_the_valid_ones():
    with pytest.raises(ConfigError, match=r"unknown study \['nope'\]; valid: \['s', 't'\]"):
        candidate_rows(runs_table(), studies=["nope"])
    with pytest.raises(ConfigError, match=r"unknown method \['z'\]; valid: \['a', 'b', 'c', 'd', 'fedsage_plus'\]"):
        candidate_rows(runs_table(), methods=["z"])


@pytest.mark.parametrize("rebuilt, verdict", [
    (80.0, "equal"), (80.0 + TOLERANCE * 0.9, "within"), (80.0 - TOLERANCE, "within"),
    (80.0 + TOLERANCE * 1.1, "differs"), (79.0, "differs"), (None, "failed"), (float("nan"), "failed"),
])
def test_classify(rebuilt, verdict):
    assert classify(80.0, rebuilt) == verdict


def record(acc: float, f1: float, best: int = 10, final: int = 20, val: float = 0.5) -> dict:
    return {"status": "ok", "metrics": {"best": {"test_acc": acc / 100, "test_f1_macro": f1 / 100, "round": best,
                                                 "val_acc": val}, "final": {"round": final}}}


def test_compare_classifies_every_metric_and_takes_the_worst():
    row = runs_table().iloc[0].to_dict()
    equal = compare(row, record(row["test_acc"], row["test_f1_macro"]))
    assert equal["verdict"] == "equal"
    assert {equal[f"{k}_verdict"] for k in ("test_acc", "test_f1_macro", "best_round", "rounds_run")} == {"equal"}
    near = compare(row, record(row["test_acc"] + 0.01, row["test_f1_macro"]))
    assert near["test_acc_verdict"] == "within" and near["verdict"] == "within"
    assert near["test_acc_rebuilt"] == pytest.approx(row["test_acc"] + 0.01)
    far = compare(row, record(row["test_acc"], row["test_f1_macro"] + 1.0))
    assert far["test_f1_macro_verdict"] == "differs" and far["verdict"] == "differs"
    moved = compare(row, record(row["test_acc"], row["test_f1_macro"], best=11))
    assert moved["best_round_verdict"] == "differs" and moved["verdict"] == "differs"
    assert compare(row, None)["verdict"] == "failed"
    assert compare(row, {"status": "diverged"})["verdict"] == "failed"


def results_folder(runs: pd.DataFrame, folder: Path) -> Path:
    """A results folder beside ``runs`` (runs_table with commits): row 0's run reproduced exactly, row 1's
    0.01 points off, row 2's a point off, row 4's run diverged; a JSON for row 3 (not ``ok`` in the
    snapshot) and one for a grid point no row names."""
    values = {0: record(80.0, 70.0), 1: record(81.01, 71.0), 2: record(83.0, 72.0), 3: record(83.0, 73.0),
              4: {"status": "diverged", "git_commit": "f" * 40}}
    for i, made in values.items():
        path = Path(run_target(runs.iloc[i], str(folder)))
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({**made, "git_commit": "e" * 40}))
    extra = Path(run_target({**runs.iloc[0], "grid_point": "tau=1.0"}, str(folder)))
    extra.parent.mkdir(parents=True)
    extra.write_text(json.dumps(record(1.0, 1.0)))
    return folder


def commits_table() -> pd.DataFrame:
    return runs_table().assign(git_commit=["a" * 40, "a" * 40, "b" * 40, "b" * 40] + ["c" * 40] * 37)


def test_compare_results_pairs_each_ok_row_with_its_run_json_and_lists_the_others(tmp_path):
    runs = commits_table()
    compared, others = compare_results(runs, results_folder(runs, tmp_path / "results"))
    assert compared["verdict"].tolist() == ["equal", "within", "differs", "failed"]
    assert compared["seed"].tolist() == [0, 1, 2, 4] and set(compared["made_at"]) == {"e" * 40}
    assert others == sorted([run_target(runs.iloc[3], str(tmp_path / "results")),
                             run_target({**runs.iloc[0], "grid_point": "tau=1.0"}, str(tmp_path / "results"))])
    assert compare_results(runs, tmp_path / "results", tolerance=2.0)[0]["verdict"].tolist()[:3] == ["equal"] + \
        ["within"] * 2
    only_s, others_s = compare_results(runs, tmp_path / "results", studies=["s"])
    assert only_s["seed"].tolist() == [1] and others_s == [run_target(runs.iloc[3], str(tmp_path / "results"))]
    with pytest.raises(ConfigError, match=r"unknown study \['u'\]; valid: \['s', 't'\]"):
        compare_results(runs, tmp_path / "results", studies=["u"])


def test_comparison_summary_counts_verdicts_and_differences_per_run_and_commit(tmp_path):
    runs = commits_table()
    summary = comparison_summary(compare_results(runs, results_folder(runs, tmp_path / "results"))[0])
    assert summary[["run", "commit", "runs", "equal", "within", "differs", "failed"]].values.tolist() == [
        ["m1", "aaaaaaa", 1, 0, 1, 0, 0], ["m0", "aaaaaaa", 1, 1, 0, 0, 0], ["m0", "ccccccc", 1, 0, 0, 0, 1],
        ["m2", "bbbbbbb", 1, 0, 0, 1, 0]]  # study s before t
    assert summary["max_abs_diff"].tolist()[:2] == pytest.approx([0.01, 0.0]) and \
        summary["mean_diff"].iloc[3] == pytest.approx(1.0) and pd.isna(summary["max_abs_diff"].iloc[2])


def test_grid_targets_and_the_selected_point():
    row = {"study": "s", "run": "fedgkd", "grid_point": "tau_s=3.0", "dataset": "Cora", "scheme": "metis_x",
           "clients": 10, "seed": 0}
    targets = grid_targets(row, {"tau_s": [3.0, 9.0]}, "/tmp/r")
    assert targets == {"tau_s=3.0": "/tmp/r/runs/s/fedgkd@tau_s=3.0/Cora/metis_x/k10/seed0.json",
                       "tau_s=9.0": "/tmp/r/runs/s/fedgkd@tau_s=9.0/Cora/metis_x/k10/seed0.json"}
    points = list(targets)
    assert selected_point([record(1, 1, val=0.6), record(1, 1, val=0.7)], points) == "tau_s=9.0"
    assert selected_point([record(1, 1, val=0.7), record(1, 1, val=0.7)], points) == "tau_s=3.0"  # first on ties
    assert selected_point([None, record(1, 1, val=0.1)], points) == "tau_s=9.0"
    assert selected_point([None, None], points) is None


def test_snakemake_command_names_the_studies_and_scratch_folders():
    command = snakemake_command(["/r/runs/t/a.json", "/r/runs/s/b.json"], ["t", "s", "t"], "/r", "/d")
    assert command[1:3] == ["-m", "snakemake"]
    assert command[command.index("--config") + 1:] == ["studies=[s,t]", "only_datasets=all", "results_dir=/r",
                                                       "data_dir=/d", "--", "/r/runs/t/a.json", "/r/runs/s/b.json"]


def test_an_exported_tree_reads_the_checkout_s_mirrors_by_absolute_path_and_only_keys_it_knows(tmp_path):
    """A rebuild runs in a scratch copy of an old commit, where ``../shared/datasets`` does not exist: the
    checkout's mirror folders are passed absolute; a key the old commit's config lacks is not passed."""
    checkout, source = tmp_path / "repo", tmp_path / "scratch" / "abc" / "source"
    here = "mirror: [resources/datasets, ../shared/datasets]\npartition_dir: ../shared/authors\n"
    for tree, text in ((checkout, here), (source, "mirror: [resources/datasets]\n")):
        (tree / "config").mkdir(parents=True)
        (tree / "config" / "config.yaml").write_text(text)
    mirrors = f"{checkout / 'resources/datasets'},{tmp_path / 'shared/datasets'}"
    assert input_paths(source, checkout) == [f"mirror=[{mirrors}]"]
    (source / "config" / "config.yaml").write_text("mirror: []\npartition_dir: x\n")
    assert input_paths(source, checkout)[1] == f"partition_dir={tmp_path / 'shared/authors'}"
    command = snakemake_command(["/r/a.json"], ["s"], "/r", "/d", settings=input_paths(source, checkout))
    assert command[command.index("data_dir=/d") + 1].startswith("mirror=[") and command[-2:] == ["--", "/r/a.json"]
    assert input_paths(source, tmp_path / "elsewhere") == []
    (checkout / "config" / "config.yaml").write_text("mirror: null\n")
    assert input_paths(source, checkout) == ["mirror=[]"]


def fgl_report(*args, cwd=REPO):
    return subprocess.run([sys.executable, "-m", "fglrepro.cli.report", *args], cwd=cwd, capture_output=True,
                          text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})


def test_cli_bad_study_name_lists_the_valid_ones():
    proc = fgl_report("verify", "--sample", "1", "--study", "fedgkd_tabel1")
    assert proc.returncode == 2
    assert "unknown study ['fedgkd_tabel1']" in proc.stderr and "'fedgkd_table1'" in proc.stderr


def test_cli_compare_results_exit_status_follows_the_worst_verdict(tmp_path):
    runs = commits_table()
    snapshot = tmp_path / "snap"
    snapshot.mkdir()
    runs.to_csv(snapshot / "runs.csv", index=False)
    results = results_folder(runs, tmp_path / "results")
    proc = fgl_report("compare-results", "--results", str(results), "--snapshot", str(snapshot), "--out",
                      str(tmp_path / "c.csv"))
    assert proc.returncode == 1, proc.stderr
    assert "4 runs: 1 equal, 1 within, 1 differs, 1 failed" in proc.stdout and "2 run JSONs" in proc.stdout
    assert len(pd.read_csv(tmp_path / "c.csv")) == 4
    proc = fgl_report("compare-results", "--results", str(results), "--snapshot", str(snapshot), "--study", "s",
                      "--tolerance", "0.001")
    assert proc.returncode == 1 and "1 runs: 0 equal, 0 within, 1 differs" in proc.stdout
    proc = fgl_report("compare-results", "--results", str(results), "--snapshot", str(snapshot), "--study", "t",
                      "--tolerance", "3")
    assert proc.returncode == 1 and "3 runs: 1 equal, 1 within, 0 differs, 1 failed" in proc.stdout
    (results / "runs" / "t" / "m0" / "Cora" / "louvain_x" / "k5" / "seed4.json").unlink()
    proc = fgl_report("compare-results", "--results", str(results), "--snapshot", str(snapshot), "--study", "t",
                      "--tolerance", "3")
    assert proc.returncode == 0 and "2 runs: 1 equal, 1 within, 0 differs, 0 failed" in proc.stdout
    empty = fgl_report("compare-results", "--results", str(tmp_path / "nothing"), "--snapshot", str(snapshot))
    assert empty.returncode == 2 and f"no run JSON under {tmp_path / 'nothing'}/runs" in empty.stderr


#: a cheap committed row (FedGKD Table 1's FedAvg, Cora, 10 clients, seed 0: 4.7 CPU-s at 49e56e3).
FIXED_ROW = {"study": "fedgkd_table1", "run": "fedavg", "dataset": "Cora", "clients": 10, "seed": 0}


def one_row_snapshot(row: pd.Series, folder: Path) -> Path:
    """A snapshot folder whose runs.csv holds ``row`` only."""
    folder.mkdir()
    pd.DataFrame([row]).to_csv(folder / "runs.csv", index=False)
    return folder


@pytest.mark.e2e
def test_verify_rebuilds_a_committed_run_at_its_commit_and_then_bit_for_bit(tmp_path):
    """A committed row rebuilt from scratch at its own commit (source exported, data prepared,
    partitioned, trained) lands near its numbers on any machine (another CPU's kernels may move the
    last digits: seed noise, not a code change); a second rebuild compared with the first one's
    numbers, same code on the same machine, is ``equal`` in every metric."""
    runs = pd.read_csv(REPO / "docs" / "results" / "runs.csv")
    row = runs[(runs[list(FIXED_ROW)] == pd.Series(FIXED_ROW)).all(axis=1)].iloc[0]
    commit = row["git_commit"][:10]
    first = fgl_report("verify", "--sample", "1", "--snapshot", str(one_row_snapshot(row, tmp_path / "snap1")),
                       "--results-dir", str(tmp_path / "r1"))
    assert f"rebuilt at {commit}" in first.stdout, first.stdout[-3000:] + first.stderr[-3000:]
    assert "machine: " in first.stdout and "BLAS_INFO" in first.stdout and ", 0 failed" in first.stdout
    assert (tmp_path / "r1" / commit / "source" / "Snakefile").is_file()
    rebuilt = rebuilt_metrics(read_record(run_target(row, str(tmp_path / "r1" / commit / "results"))))
    assert all(abs(rebuilt[key] - row[key]) < 2.0 for key in ("test_acc", "test_f1_macro"))  # within seed noise
    second = fgl_report("verify", "--sample", "1", "--snapshot",
                        str(one_row_snapshot(pd.Series({**row, **rebuilt}), tmp_path / "snap2")),
                        "--results-dir", str(tmp_path / "r2"), "--data-dir", str(tmp_path / "r1" / commit / "data"))
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
    assert "1 runs: 1 equal, 0 within, 0 differs, 0 failed" in second.stdout


def test_a_difference_of_exactly_the_tolerance_is_within():
    assert classify(80.0, 80.25, tolerance=0.25) == "within" and classify(80.0, 79.75, tolerance=0.25) == "within"
    assert classify(80.0, 80.5, tolerance=0.25) == "differs"
