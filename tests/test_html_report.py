"""The per-paper HTML report on synthetic results: tables, claims, figures embedded, captions
with the protocol and what is not run; rendered in a real headless Chromium."""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import pytest  # noqa: E402

from fglrepro.cli.report import main as report_main  # noqa: E402
from fglrepro.report.html import delta_class, paper_report  # noqa: E402
from fglrepro.report.tables import cell_summary, comparison  # noqa: E402

LABELS = {"fedavg": "FedAvg", "fedtad": "FedTAD", "broken": "Broken", "flaky": "Flaky"}
PROTOCOL = {
    "partition": {"partitioner": "louvain", "options": {"delta": 20}, "graphless_ratio": 0.0,
                  "split": {"mode": "stratified", "train": 0.2, "val": 0.4}},
    "data": {"largest_component": False, "normalize_features": False},
    "model": {"arch": "gcn", "hidden": 64, "layers": 2, "dropout": 0.5},
    "train": {"rounds": 100, "local_epochs": 3, "optimizer": "adam", "lr": 0.01},
    "evaluation": {"model": "global", "average": "weighted", "patience": None},
    "seeds": [0, 1, 2],
}


def study_meta(study: str = "synth_table2") -> dict:
    return {"study": study, "paper": "SynthPaper", "table": "Table 2", "title": "synthetic accuracy table",
            "labels": LABELS, "rows": [*LABELS.values(), "Ghost"], "not_reproducible": {"Ghost": "code not public"},
            "datasets": ["Cora"], "columns": [["Cora", 5], ["Cora", 10]], "decimals": 1,
            "figures": ["convergence"], "protocol": PROTOCOL,
            "dropped": {"datasets": ["PubMed"], "runs": ["FedSage+"], "seeds": []}}


def accuracy(run: str, clients: int, seed: int) -> float:
    return 70.0 + 2 * list(LABELS).index(run) + clients / 5 + seed


def png(path: Path, colour: str) -> None:
    fig, ax = plt.subplots(figsize=(2, 1.5))
    ax.plot([0, 1, 2], [0, 1, 0], color=colour)
    fig.savefig(path, dpi=50)
    plt.close(fig)


@pytest.fixture
def results(tmp_path):
    """results/ of one study: comparison table, partition statistics, a figure, two heat maps."""
    rows = []
    for run, label in LABELS.items():
        for clients in (5, 10):
            for seed in (0, 1, 2):
                failed = run == "broken" or (run == "flaky" and clients == 10 and seed > 0)
                rows.append({"label": label, "dataset": "Cora", "clients": clients, "seed": seed,
                             "status": "diverged" if failed else "ok",
                             "test_acc": np.nan if failed else accuracy(run, clients, seed),
                             "test_f1_macro": np.nan if failed else accuracy(run, clients, seed) - 20})
    reported = pd.DataFrame([
        {"paper": "SynthPaper", "table": "Table 2", "method": m, "dataset": "Cora", "clients": k, "metric": "acc",
         "mean": mean, "std": 0.3}
        for m, k, mean in [("FedAvg", 5, 80.6), ("FedAvg", 10, 73.2), ("FedTAD", 5, 85.1), ("Ghost", 5, 81.0)]])
    meta = study_meta()
    res = tmp_path / "results"
    (res / "tables").mkdir(parents=True)
    (res / "figures" / "synth_table2_partitions").mkdir(parents=True)
    comparison(cell_summary(pd.DataFrame(rows)), reported, meta).to_csv(
        res / "tables" / "synth_table2.comparison.csv", index=False)
    pd.DataFrame({"dataset": ["Cora"] * 2, "partitioner": ["louvain"] * 2, "clients": [5] * 2,
                  "stat": ["nodes", "heterogeneity"], "reported": [548.3, 0.61], "reproduced": [541.6166666666667, 0.6],
                  "rel_diff_pct": [-1.2369791666666667, -1.639344262295082], "seeds": [3, 3]}).to_csv(
        res / "tables" / "synth_table2.partition_stats.csv", index=False)
    png(res / "figures" / "synth_table2_convergence.png", "tab:blue")
    for name, colour in (("Cora_louvain_k5_seed0", "tab:red"), ("Cora_louvain_k10_seed0", "tab:green")):
        png(res / "figures" / "synth_table2_partitions" / f"{name}.png", colour)
    return res


CLAIMS = pd.DataFrame({
    "claim": ["synth-beats-all", "synth-noise", "other-claim"],
    "paper": ["SynthPaper", "SynthPaper", "OtherPaper"], "source": ["Table 1"] * 3,
    "statement": ["FedTAD beats every baseline", "noise costs under 1 point", "not this paper"],
    "checks": [2, 2, 1], "holds": [1, 2, 0], "clearly_holds": [1, 2, 0], "clearly_fails": [0, 0, 1],
    "within_noise": [1, 0, 0], "not_run": [0, 0, 0], "seeds": ["3", "1-3", "3"],
    "verdict": ["partly", "confirmed", "refuted"], "paper_checks": [2, 0, 1], "paper_holds": [0, 0, 1],
    "paper_clearly_holds": [0, 0, 1], "paper_clearly_fails": [1, 0, 0], "paper_support": ["no", "n/a", "yes"],
    "left_out": ["", "", ""],
    "reason": ["", "", ""], "numbers": ["Cora-5 74.0 vs 75.2", "", ""], "paper_numbers": ["", "", ""]})


def test_report_embeds_every_figure_and_nothing_external(results):
    page = paper_report("SynthPaper", [study_meta()], results, None)
    sources = re.findall(r'src="([^"]+)"', page)
    pngs = [results / "figures" / "synth_table2_convergence.png",
            *sorted((results / "figures" / "synth_table2_partitions").glob("*.png"))]
    assert len(sources) == len(pngs) + 1 == 4  # the reproduced-vs-reported scatter first
    assert base64.b64decode(sources[0].split(",", 1)[1]).startswith(b"\x89PNG")
    assert [base64.b64decode(s.split(",", 1)[1]) for s in sources[1:]] == [p.read_bytes() for p in pngs]
    assert "http" not in page.replace("<!DOCTYPE html>", "") and "<link" not in page and "<script" not in page


def grid_cell(page: str, text: str) -> re.Match:
    """The comparison-grid cell whose text is ``text``: its class and tooltip."""
    found = re.search(r'<td class="num ?([\w-]*)" title="([^"]*)">' + re.escape(text) + "</td>", page)
    assert found, text
    return found


def test_comparison_grid_shows_ours_paper_and_delta_coloured_by_the_papers_std(results):
    page = paper_report("SynthPaper", [study_meta()], results, None)
    fedavg5 = np.mean([accuracy("fedavg", 5, s) for s in (0, 1, 2)])
    assert grid_cell(page, f"{fedavg5:.1f} (80.6, {fedavg5 - 80.6:+.1f})").group(1) == "d3"  # 8.6 points, std 0.3
    fedavg10 = np.mean([accuracy("fedavg", 10, s) for s in (0, 1, 2)])
    assert grid_cell(page, f"{fedavg10:.1f} (73.2, {fedavg10 - 73.2:+.1f})").group(1) == "d1"  # 0.2 points
    assert "<th>Cora (5) Acc</th>" in page and "<th>Cora (10) Acc</th>" in page
    assert "<td>code not public (81.0)</td>" in page  # the not-reproducible row keeps the paper's value
    assert "≤ 1σ" in page and "&gt; 2σ" in page


def test_delta_classes_by_multiples_of_the_papers_std():
    assert [delta_class(d, 0.5) for d in (0.5, -0.51, 1.0, 1.01, -3.0)] == ["d1", "d2", "d2", "d3", "d3"]
    assert delta_class(1.0, np.nan) == delta_class(1.0, 0.0) == "nostd" and delta_class(np.nan, 1.0) == ""


def test_cells_with_fewer_seeds_say_how_many(results):
    page = paper_report("SynthPaper", [study_meta()], results, None)
    assert "mean over n=3 seeds (n=... on a cell with fewer ok seeds)" in page
    flaky10 = accuracy("flaky", 10, 0)  # 1 of 3 seeds ok
    assert grid_cell(page, f"{flaky10:.1f} <small>n=1</small>")
    fedavg5 = np.mean([accuracy("fedavg", 5, s) for s in (0, 1, 2)])
    assert "n=3" not in grid_cell(page, f"{fedavg5:.1f} (80.6, {fedavg5 - 80.6:+.1f})").group(0)[:-40]


def test_summary_counts_close_cells_and_claims_by_verdict(results):
    page = paper_report("SynthPaper", [study_meta()], results, CLAIMS)
    summary = page[page.index('<div class="summary">'):page.index("</div>")]
    # reported: FedAvg 5 and 10, FedTAD 5 (ran) and Ghost 5 (not run); only FedAvg 10 is within 0.6 points
    assert "3 of the paper's 4 reported cells reproduced; 1 of 3 within 2 points, 1 of 3 with a reported std" in summary
    assert "1 confirmed, 1 partly, 0 refuted, 0 inconclusive, 0 not run (of 2)" in summary
    assert "Claims: not evaluated" in paper_report("SynthPaper", [study_meta()], results, None)


def test_partition_statistics_are_rounded(results):
    page = paper_report("SynthPaper", [study_meta()], results, None)
    stats = page[page.index("Partition statistics"):]
    assert "<td>541.6</td><td>-1.2 %</td>" in stats and "<td>0.600</td><td>-1.6 %</td>" in stats
    assert "1.2369791666666667" not in page and "541.6166666666667" not in page


def test_inconsistent_reported_values_are_marked_with_the_relation(results):
    meta = {**study_meta(), "inconsistencies": [
        {"id": "synth_offset", "method": "FedTAD", "relation": "Table 2 is Table 4 plus 1.00",
         "cells": [{"dataset": "Cora", "clients": 5, "metric": "acc"}]}]}
    page = paper_report("SynthPaper", [meta], results, None)
    fedtad5 = np.mean([accuracy("fedtad", 5, s) for s in (0, 1, 2)])
    assert grid_cell(page, f"{fedtad5:.1f} (85.1‡, {fedtad5 - 85.1:+.1f})")
    assert "‡ FedTAD, Table 2" in page and "synth_offset" in page and "Table 4 plus 1.00" in page
    assert "‡" not in paper_report("SynthPaper", [study_meta()], results, None)


def test_captions_say_the_protocol_and_what_is_not_run(results):
    page = paper_report("SynthPaper", [study_meta()], results, None)
    caption = re.search(r'<p class="caption">(.*?)</p>', page).group(1)
    for part in ("louvain (delta = 20)", "stratified split 20/40/40 % train/val/test", "gcn, layers 2, hidden 64",
                 "100 rounds x 3 local epochs", "global model, weighted average", "Seeds: 0, 1, 2 (3)"):
        assert part in caption, part
    not_run = page[page.index("<h3>Not run</h3>"):]
    not_run = not_run[:not_run.index("</ul>")]
    assert "Ghost: not reproducible (code not public)" in not_run
    assert "Broken: no ok run (diverged)" in not_run
    assert "Flaky, Cora with 10 clients: 1 of 3 seeds ok" in not_run
    assert "FedAvg" not in not_run and "Flaky, Cora with 5" not in not_run
    assert "only_datasets: PubMed" in not_run and "skip_runs: FedSage+" in not_run and "only_seeds" not in not_run


def test_claims_of_the_paper_with_their_verdicts_or_not_evaluated(results):
    missing = paper_report("SynthPaper", [study_meta()], results, None)
    assert "claims not evaluated" in missing
    page = paper_report("SynthPaper", [study_meta()], results, CLAIMS)
    claims = page[page.index('<h2 id="claims">Claims</h2>'):page.index("<section")]
    assert '<tr class="partly"><td>synth-beats-all</td>' in claims
    assert '<tr class="confirmed"><td>synth-noise</td>' in claims
    assert ("<td>1 clearly hold, 1 within noise (of 2)</td><td>n=3</td>"
            "<td>⚠ no (0 of 2 hold, 0 clearly; 1 clearly fail)</td>") in claims
    assert "<td>n=1-3</td><td>n/a</td>" in claims and "paper_clearly_holds" not in claims
    main, machine = claims.split("<details>", 1)
    assert "<th>within_noise</th>" not in main and "<th>within_noise</th>" in machine  # counts folded away
    assert "other-claim" not in claims and "claims not evaluated" not in claims
    assert "claims not evaluated" in paper_report("ThirdPaper", [study_meta()], results, CLAIMS)


def test_summary_table_when_the_paper_reports_no_numbers(results):
    meta = {**study_meta("synth_fig"), "figures": []}
    rows = [{"label": "FedAvg", "dataset": "Cora", "clients": 5, "seed": s, "status": "ok",
             "test_acc": 60.0 + s, "test_f1_macro": 40.0} for s in (0, 1)]
    cell_summary(pd.DataFrame(rows)).to_csv(results / "tables" / "synth_fig.csv", index=False)
    page = paper_report("SynthPaper", [meta], results, None)
    assert "Reproduced test accuracy" in page and "<td>60.5 ± 0.7</td>" in page  # sample std of 60, 61: 0.707
    assert "mean ± std over n=2 seeds" in page
    empty = paper_report("SynthPaper", [{**study_meta("nothing"), "labels": {}, "figures": []}], results, None)
    assert "data protocol only" in empty


def test_one_seed_shows_no_std_and_a_not_learning_run_is_marked(results):
    meta = {**study_meta("synth_one"), "figures": []}
    rows = [{"label": "FedAvg", "dataset": "Cora", "clients": 5, "seed": 0, "status": "ok", "test_acc": 60.0,
             "test_f1_macro": 40.0, "learning": "not learning: validation accuracy never above its first round's"},
            {"label": "FedTAD", "dataset": "Cora", "clients": 5, "seed": 0, "status": "ok", "test_acc": 62.0,
             "test_f1_macro": 41.0, "learning": np.nan}]
    cell_summary(pd.DataFrame(rows)).to_csv(results / "tables" / "synth_one.csv", index=False)
    page = paper_report("SynthPaper", [meta], results, None)
    assert "(%), mean over n=1 seed (no std)" in page and "±" not in page.split("synth_one")[1]
    assert "<td>60.0 (n=1) †</td>" in page and "<td>62.0 (n=1)</td>" in page
    assert "† not learning" in page


def test_cli_writes_the_report_and_reads_claims_when_present(results, tmp_path):
    out = tmp_path / "report" / "SynthPaper.html"
    args = ["html", "--paper", "SynthPaper", "--meta", json.dumps([study_meta()]), "--results", str(results),
            "--claims", str(tmp_path / "absent.csv"), "--out", str(out)]
    report_main(args)
    assert "claims not evaluated" in out.read_text()
    CLAIMS.to_csv(tmp_path / "claims.csv", index=False)
    report_main(args[:-3] + [str(tmp_path / "claims.csv"), "--out", str(out)])
    assert "synth-beats-all" in out.read_text()


def chromium() -> str:
    """The Chromium binary; installed from Debian when missing (root and apt-get needed), else skip."""
    found = shutil.which("chromium")
    if found:
        return found
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        pytest.skip("Chromium is missing and cannot be installed here (needs root and apt-get)")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for cmd in (["apt-get", "update", "-qq"], ["apt-get", "install", "-y", "-qq", "chromium"]):
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900)
        if proc.returncode != 0:
            pytest.skip(f"cannot install Chromium: {proc.stderr[-500:]}")
    return shutil.which("chromium") or pytest.skip("apt-get installed no chromium binary")


def headless(binary: str, page: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([binary, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", *args,
                           page.as_uri()], capture_output=True, text=True, timeout=120)


@pytest.mark.e2e
def test_report_renders_in_headless_chromium(results, tmp_path):
    binary = chromium()
    page = tmp_path / "SynthPaper.html"
    page.write_text(paper_report("SynthPaper", [study_meta()], results, CLAIMS))
    shot = tmp_path / "shot.png"
    proc = headless(binary, page, f"--screenshot={shot}", "--window-size=1280,1600")
    assert shot.is_file() and shot.stat().st_size > 0, proc.stderr[-2000:]
    pixels = plt.imread(shot)[..., :3]
    assert pixels.shape[:2] == (1600, 1280)
    assert pixels.std() > 0.05  # not blank: text, tables and figures
    assert (pixels.reshape(-1, 3).std(axis=1) > 0.05).mean() > 0.001  # some coloured pixels (verdicts, plots)
    dom = headless(binary, page, "--dump-dom").stdout
    assert "<table>" in dom and "<th>Cora (5) Acc</th>" in dom
    assert '<tr class="partly"><td>synth-beats-all</td>' in dom and "<td>confirmed</td>" in dom
    assert dom.count("<img") == 4  # the scatter, the convergence figure, two heat maps
    assert '<div class="summary">' in dom and '<td class="num d3"' in dom and '<td class="num d1"' in dom


@pytest.mark.e2e
def test_workflow_builds_the_paper_report(repo, tmp_path):
    """A one-run, one-seed, two-round study: `snakemake html_report` writes the paper's page."""
    import sys

    from test_workflow import TINY_STUDY, make_workdir

    study = {**TINY_STUDY, "seeds": [0], "train": {**TINY_STUDY["train"], "rounds": 2},
             "runs": {"fedavg": TINY_STUDY["runs"]["fedavg"]}}
    work = make_workdir(repo, tmp_path, study)
    proc = subprocess.run([sys.executable, "-m", "snakemake", "--cores", "1", "html_report"], cwd=work,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    page = (work / "results" / "report" / "TinyPaper.html").read_text()
    assert "claims not evaluated" in page and "<th>Cora (3) Acc</th>" in page
    assert page.count("data:image/png;base64,") == 3  # scatter, convergence figure, one partition heat map
    assert "1 of the paper's 1 reported cells reproduced" in page
    assert "Seeds: 0 (1)" in page and "runs left out by skip_runs" not in page
