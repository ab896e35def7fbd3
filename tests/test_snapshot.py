"""The committed results snapshot (docs/results/): round trip, and its tables and claims consistent with its runs."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pandas as pd
import pytest
import yaml
from test_claims import claim, every_cell, make_meta, make_metrics

from fglrepro.report.coverage import FILES as COVERAGE_FILES
from fglrepro.report.snapshot import (
    PARTITION_STATS,
    RUN_COLUMNS,
    RUNS,
    STUDIES,
    commit_mix_sentence,
    load_claims,
    mixed_commit_cells,
    read_runs,
    render,
    write_snapshot,
)

REPO = Path(__file__).resolve().parents[1]
SNAPSHOT = REPO / "docs" / "results"
PAPER_DIR = REPO / "config" / "paper"
CLAIMS = PAPER_DIR / "claims.yaml"


def differences(snapshot: Path, claims: list[dict], paper_dir: Path) -> list[str]:
    """Files of a snapshot that differ from what its runs.csv and studies.json render to."""
    files = render(read_runs(snapshot / RUNS), json.loads((snapshot / STUDIES).read_text()), claims, paper_dir)
    marker = ".snakemake_timestamp"  # written by Snakemake into a directory() output
    on_disk = {p.name for p in snapshot.iterdir() if not p.name.endswith(PARTITION_STATS)} - {
        RUNS, STUDIES, marker, *COVERAGE_FILES}  # tests/test_coverage.py
    changed = [name for name, text in files.items() if not (snapshot / name).is_file()
               or (snapshot / name).read_text() != text]
    return sorted(changed + sorted(on_disk - set(files)))


@pytest.fixture
def snapshot(tmp_path):
    """A snapshot of two synthetic studies (one with reported values) written to tmp."""
    paper = tmp_path / "paper"
    paper.mkdir()
    pd.DataFrame([{"paper": "P", "table": "Table 1", "method": "A", "dataset": "Cora", "clients": 5, "metric": "acc",
                   "mean": 74.0, "std": 0.5}]).to_csv(paper / "reported.csv", index=False)
    metas = {"s": {**make_meta(["A", "B"]), "reported": "reported.csv"}, "t": make_meta(["C", "D"], study="t")}
    metrics = [make_metrics({"A": every_cell(75.0), "B": every_cell(70.0)}),
               make_metrics({"C": every_cell(60.0), "D": every_cell(65.0)}, study="t")]
    metrics[0].loc[0, "grid_point"] = "lr=0.1"
    claims = [claim(kind="beats", row="A"), claim(id="d", study="t", kind="beats", row="C"),
              claim(id="e", study="u", kind="beats", row="X")]
    out = tmp_path / "results"
    write_snapshot(metrics, metas, claims, paper, out)
    return out, claims, paper


def test_snapshot_holds_runs_with_their_targets_and_the_rendered_tables(snapshot):
    out, claims, paper = snapshot
    runs = read_runs(out / RUNS)
    assert list(runs.columns) == RUN_COLUMNS and len(runs) == 2 * 2 * 3 * 3
    first = runs.iloc[0]
    assert first["target"] == "results/runs/s/a@lr=0.1/Cora/louvain_x/k5/seed0.json"
    assert runs.iloc[1]["target"] == "results/runs/s/a/Cora/louvain_x/k5/seed1.json"
    assert set(runs["git_commit"]) == {"abc123"}
    names = {p.name for p in out.iterdir()}
    assert names == {"runs.csv", "studies.json", "s.md", "t.md", "s.comparison.csv", "s.comparison.md", "claims.csv",
                     "claims_cells.csv", "claims.md", "README.md"}
    assert pd.read_csv(out / "claims.csv")["verdict"].tolist() == ["confirmed", "refuted", "not run"]
    comparison = pd.read_csv(out / "s.comparison.csv")
    assert comparison.loc[comparison["reported_mean"].notna(), "delta"].tolist() == [pytest.approx(1.0)]
    readme = (out / "README.md").read_text()
    assert "36 runs, 36 ok" in readme and "1 confirmed, 0 partly, 1 refuted, 0 inconclusive, 1 not run" in readme


def test_rendering_again_from_runs_csv_gives_the_same_files(snapshot):
    out, claims, paper = snapshot
    assert differences(out, claims, paper) == []


@pytest.mark.parametrize("name, old, new", [
    ("s.md", "75.0 ± 0.0", "75.1 ± 0.0"),
    ("claims.csv", "confirmed", "refuted"),
    ("claims.md", "3 clearly hold (of 3)", "2 clearly hold (of 3)"),
    ("s.comparison.md", "+1.0", "+1.1"),
])
def test_an_edited_number_in_a_committed_table_is_detected(snapshot, tmp_path, name, old, new):
    out, claims, paper = snapshot
    copy = tmp_path / "copy"
    shutil.copytree(out, copy)
    text = (copy / name).read_text()
    assert old in text
    (copy / name).write_text(text.replace(old, new, 1))
    assert differences(copy, claims, paper) == [name]


def test_an_edited_run_changes_the_tables_rendered_from_it(snapshot):
    out, claims, paper = snapshot
    runs = read_runs(out / RUNS)
    runs.loc[runs["label"] == "A", "test_acc"] = 60.0
    runs.to_csv(out / RUNS, index=False)
    assert {"s.md", "claims.csv", "claims.md", "claims_cells.csv", "s.comparison.md"} <= set(
        differences(out, claims, paper))


def test_a_stale_file_in_the_snapshot_is_detected(snapshot):
    out, claims, paper = snapshot
    (out / "old_study.md").write_text("stale")
    assert differences(out, claims, paper) == ["old_study.md"]


def test_cli_rerender_rewrites_the_derived_files(snapshot):
    from fglrepro.cli.report import main

    out, claims, paper = snapshot
    (out / "claims.md").write_text("edited")
    claims_file = out.parent / "claims.yaml"
    claims_file.write_text(yaml.safe_dump({"claims": claims}))
    main(["snapshot", "--rerender", "--claims", str(claims_file), "--paper-dir", str(paper), "--out", str(out)])
    assert differences(out, claims, paper) == []


def test_partition_stats_enter_the_snapshot_and_survive_a_rewrite(snapshot, tmp_path):
    from fglrepro.cli.report import main

    out, claims, paper = snapshot
    stats = tmp_path / "tables" / f"s{PARTITION_STATS}"
    stats.parent.mkdir()
    stats.write_text("dataset,stat,reproduced\nCora,nodes,541.6\n")
    main(["snapshot", "--rerender", "--paper-dir", str(paper), "--out", str(out), "--partition-stats", str(stats)])
    assert (out / stats.name).read_text() == stats.read_text()
    write_snapshot([read_runs(out / RUNS)], json.loads((out / STUDIES).read_text()), claims, paper, out)
    assert (out / stats.name).is_file() and differences(out, claims, paper) == []
    wrong = tmp_path / "tables" / "s.comparison.csv"
    wrong.write_text("x\n")
    with pytest.raises(ValueError, match="not a partition statistics table"):
        main(["snapshot", "--rerender", "--out", str(out), "--partition-stats", str(wrong)])


def test_a_merged_rerun_with_fewer_seeds_or_datasets_keeps_the_snapshot_s_partition_statistics(snapshot, tmp_path):
    """`--merge` (the workflow's `snapshot_merge: true`): per (dataset, partitioner, clients), a rerun's rows
    replace the snapshot's unless those cover more seeds; cells the rerun lacks stay; without --merge the
    rerun's file replaces the snapshot's."""
    from fglrepro.cli.report import main

    out, claims, paper = snapshot
    header = "dataset,partitioner,clients,stat,reproduced,seeds\n"
    stored = (header + "Cora,louvain,5,nodes,541.6,3\nCora,louvain,10,nodes,270.8,3\n"
              "Photo,louvain,10,nodes,765.0,3\nCiteSeer,louvain,10,nodes,332.7,1\n")
    (out / f"s{PARTITION_STATS}").write_text(stored)
    rerun = tmp_path / "tables" / f"s{PARTITION_STATS}"
    rerun.parent.mkdir()
    rerun.write_text(header + "Cora,louvain,5,nodes,541.0,1\nCora,louvain,10,nodes,271.0,3\n"
                     "CiteSeer,louvain,10,nodes,333.0,3\nCS,louvain,10,nodes,1833.3,1\n")
    args = ["snapshot", "--rerender", "--paper-dir", str(paper), "--out", str(out), "--partition-stats", str(rerun)]
    main(args + ["--merge"])
    merged = pd.read_csv(out / rerun.name)
    assert merged[["dataset", "clients", "reproduced", "seeds"]].values.tolist() == [
        ["Cora", 5, 541.6, 3], ["Cora", 10, 271.0, 3], ["Photo", 10, 765.0, 3], ["CiteSeer", 10, 333.0, 3],
        ["CS", 10, 1833.3, 1]]
    main(args)
    assert (out / rerun.name).read_text() == rerun.read_text()


@pytest.mark.skipif(not SNAPSHOT.is_dir(), reason="docs/results/ is not committed yet: the lead writes it from real "
                                                  "runs with `snakemake snapshot --cores 1`")
def test_committed_snapshot_tables_and_claims_are_consistent_with_its_runs():
    changed = differences(SNAPSHOT, load_claims(CLAIMS), PAPER_DIR)
    assert not changed, (f"docs/results/ files {changed} differ from what runs.csv renders to; render them again "
                         "with `fgl-report snapshot --rerender --claims config/paper/claims.yaml --out docs/results` "
                         "(never edit them by hand)")


@pytest.mark.skipif(not SNAPSHOT.is_dir(), reason="docs/results/ is not committed yet")
def test_committed_snapshot_s_study_metadata_agrees_with_the_study_files():
    """studies.json keeps each study's rows, labels and not-reproducible reasons as folded; a study file edited
    since (a relabel, a new reason) must reach it, or the tables and claims render the old text."""
    stale = []
    for study, meta in json.loads((SNAPSHOT / STUDIES).read_text()).items():
        raw = yaml.safe_load((REPO / "config" / "studies" / f"{study}.yaml").read_text())
        labels = {run: entry.get("label", run) for run, entry in raw["runs"].items()}
        expected = {"paper": raw["paper"], "table": raw["table"], "title": raw.get("title", study),
                    "reported": raw.get("reported"), "all_rows": list(labels.values()),
                    "not_reproducible": {labels[run]: entry["not_reproducible"] for run, entry in raw["runs"].items()
                                         if "not_reproducible" in entry},
                    "labels": {run: labels.get(run) for run in meta["labels"]}}
        stale += [f"{study}.{key}" for key, value in expected.items() if meta.get(key) != value]
    assert not stale, (f"docs/results/studies.json differs from config/studies/ in {stale}: fold a run of the study "
                       "again, or edit its entry there and re-render with `fgl-report snapshot --rerender`")


def dirty_metrics(flags: list) -> list[pd.DataFrame]:
    metrics = make_metrics({"A": every_cell(75.0)})
    metrics["git_dirty"] = (flags * len(metrics))[:len(metrics)]
    return [metrics]


def test_a_run_from_a_dirty_tree_is_refused_naming_its_run_json(tmp_path):
    from fglrepro.config import ConfigError

    out = tmp_path / "results"
    with pytest.raises(ConfigError, match=r"3 run\(s\) were made from a source tree with uncommitted changes.*"
                                          r"results/runs/s/a/Cora/louvain_x/k5/seed1\.json; commit the code, rerun"):
        write_snapshot(dirty_metrics([False, True, None]), {"s": make_meta(["A"])}, [], tmp_path, out)
    assert not out.exists()  # refused before anything is written


def test_a_dirty_run_read_back_from_csv_is_refused_and_allow_dirty_accepts_it(tmp_path):
    from fglrepro.cli.report import main

    csv = tmp_path / "m.csv"
    dirty_metrics([True, False])[0].to_csv(csv, index=False)
    args = ["snapshot", "--meta", json.dumps({"s": make_meta(["A"])}), "--paper-dir", str(tmp_path), "--out",
            str(tmp_path / "out"), str(csv)]
    with pytest.raises(SystemExit) as stop:
        main(args)
    assert stop.value.code == 2
    main([*args, "--allow-dirty"])
    assert len(read_runs(tmp_path / "out" / RUNS)) == len(pd.read_csv(csv))


def test_runs_without_the_flag_or_clean_are_accepted(tmp_path):
    runs = read_runs(write_snapshot_dir(tmp_path, dirty_metrics([False, None])))
    assert "git_dirty" not in runs.columns and list(runs.columns) == RUN_COLUMNS


def write_snapshot_dir(tmp_path, metrics) -> Path:
    write_snapshot(metrics, {"s": make_meta(["A"])}, [], tmp_path, tmp_path / "out")
    return tmp_path / "out" / RUNS


def test_merging_replaces_the_rerun_cells_and_keeps_every_other_run(snapshot):
    out, claims, paper = snapshot
    before = read_runs(out / RUNS)
    rerun = make_metrics({"C": every_cell(61.0)}, study="t")
    rerun = rerun[rerun["seed"] == 0]
    new_study = make_metrics({"E": every_cell(50.0)}, study="u")
    write_snapshot([rerun, new_study], {"u": make_meta(["E"], study="u")}, claims, paper, out, merge=True)
    after = read_runs(out / RUNS)
    key = ["study", "run", "dataset", "clients", "seed"]
    assert not after.duplicated(key).any()
    assert len(after) == len(before) + len(new_study)
    c_rows = after[(after["study"] == "t") & (after["label"] == "C")]
    assert sorted(c_rows.loc[c_rows["seed"] == 0, "test_acc"].unique()) == [61.0]
    assert sorted(c_rows.loc[c_rows["seed"] != 0, "test_acc"].unique()) == [60.0]
    assert set(json.loads((out / STUDIES).read_text())) == {"s", "t", "u"}
    assert (out / "u.md").is_file() and (out / "s.comparison.md").is_file()
    assert not differences(out, claims, paper)


def test_a_merged_run_restricted_to_some_rows_and_columns_hides_none_of_the_others(snapshot):
    out, claims, paper = snapshot
    table_before = (out / "t.md").read_text()
    one_cell = make_metrics({"C": {("Cora", 5): 60.0}}, study="t")
    narrow = {**make_meta(["C"], columns=[["Cora", 5]], study="t"), "all_rows": ["C", "D"]}
    write_snapshot([one_cell], {"t": narrow}, claims, paper, out, merge=True)
    meta = json.loads((out / STUDIES).read_text())["t"]
    assert meta["rows"] == ["C", "D"] and len(meta["columns"]) == len(make_meta(["C"])["columns"])
    assert (out / "t.md").read_text() == table_before


def test_a_merged_meta_keeps_only_the_rows_that_have_runs(snapshot):
    """A fold whose meta labels a row of the study that has no run (here E) lists no row for it; rows of
    the previous snapshot with runs (C, D) stay."""
    out, claims, paper = snapshot
    rerun = make_metrics({"C": every_cell(61.0)}, study="t")
    write_snapshot([rerun], {"t": make_meta(["C", "E"], all_rows=["C", "D", "E"], study="t")}, claims, paper, out,
                   merge=True)
    meta = json.loads((out / STUDIES).read_text())["t"]
    assert meta["rows"] == ["C", "D"] and set(meta["labels"]) == {"c", "d"}
    assert "| E " not in (out / "t.md").read_text()


def test_writing_without_merge_keeps_only_the_given_runs(snapshot):
    out, claims, paper = snapshot
    write_snapshot([make_metrics({"E": every_cell(50.0)}, study="u")], {"u": make_meta(["E"], study="u")}, claims,
                   paper, out)
    assert set(read_runs(out / RUNS)["study"]) == {"u"} and not (out / "s.md").exists()


def test_the_readme_counts_the_cells_whose_seeds_come_from_more_than_one_commit():
    runs = pd.DataFrame([
        # cell (s, A, Cora, 5): seeds at two commits; (s, A, Cora, 10): one commit; (s, B, Cora, 5): one ok run
        # at a third commit beside a failed run at another (a failed run does not count)
        *[{"study": "s", "run": "A", "dataset": "Cora", "clients": 5, "seed": seed, "status": "ok",
           "git_commit": commit} for seed, commit in [(0, "aaa"), (1, "bbb"), (2, "aaa")]],
        *[{"study": "s", "run": "A", "dataset": "Cora", "clients": 10, "seed": seed, "status": "ok",
           "git_commit": "aaa"} for seed in (0, 1)],
        {"study": "s", "run": "B", "dataset": "Cora", "clients": 5, "seed": 0, "status": "ok", "git_commit": "ccc"},
        {"study": "s", "run": "B", "dataset": "Cora", "clients": 5, "seed": 1, "status": "failed", "git_commit": "ddd"},
    ])
    assert mixed_commit_cells(runs) == (1, 3)
    assert "1 of 3 cells with ok runs mix commits" in commit_mix_sentence(runs)
    runs.loc[runs["git_commit"] == "bbb", "git_commit"] = "aaa"
    assert mixed_commit_cells(runs) == (0, 3)
