"""benchmarks/run_costs.py: per-method costs from the run JSONs (default) or from Snakemake's benchmark TSVs."""

from __future__ import annotations

import importlib.util
import json
import re
import sys

import pytest
from conftest import REPO

spec = importlib.util.spec_from_file_location("run_costs", REPO / "benchmarks" / "run_costs.py")
run_costs = importlib.util.module_from_spec(spec)
spec.loader.exec_module(run_costs)

SCHEME = "louvain_plain"


def write_run(results, run, dataset, clients, seed, **record):
    path = results / "runs" / "study" / run / dataset / SCHEME / f"k{clients}" / f"seed{seed}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"status": "ok", **record}))


def write_benchmark(results, run, dataset, clients, seed, s, cpu_time, max_rss):
    path = results / "benchmarks" / "train" / "study" / run / dataset / SCHEME / f"k{clients}" / f"seed{seed}.tsv"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"s\tcpu_time\tmax_rss\n{s}\t{cpu_time}\t{max_rss}\n")


@pytest.fixture
def results(tmp_path):
    write_run(tmp_path, "fedavg", "Cora", 10, 0, wall_s=6.0, cpu_s=4.0, peak_memory_mb=350.0)
    write_run(tmp_path, "fedavg", "Cora", 10, 1, wall_s=8.0, cpu_s=5.0, peak_memory_mb=360.0)
    write_run(tmp_path, "fedgkd@tau_s=3.0", "CiteSeer", 20, 2, wall_s=30.0, cpu_s=25.0, peak_memory_mb=900.0)
    write_run(tmp_path, "fedtad", "Cora", 10, 0)  # a run JSON without timings (an older format)
    write_benchmark(tmp_path, "fedavg", "Cora", 10, 0, s=9.0, cpu_time=2.5, max_rss=400.0)
    return tmp_path


def test_run_jsons_give_each_timed_run_with_its_grid_point_folded_into_the_run(results):
    jobs = run_costs.job_costs(results, "study").sort_values(["run", "seed"])
    assert jobs[["run", "dataset", "clients", "seed"]].values.tolist() == [
        ["fedavg", "Cora", 10, 0], ["fedavg", "Cora", 10, 1], ["fedgkd", "CiteSeer", 20, 2]]
    assert jobs.cpu_s.tolist() == [4.0, 5.0, 25.0]
    assert jobs.rss_mb.tolist() == [350.0, 360.0, 900.0]


def test_benchmark_files_and_run_jsons_are_separate_sources(results):
    bench = run_costs.job_costs(results, "study", source="benchmarks")
    assert bench[["run", "seed", "wall_s", "cpu_s", "rss_mb"]].values.tolist() == [["fedavg", 0, 9.0, 2.5, 400.0]]
    summary = run_costs.summary(run_costs.job_costs(results, "study", source="runs"), ["run"])
    assert summary.loc["fedavg", "jobs"] == 2
    assert summary.loc["fedavg", "cpu_total_s"] == 9.0
    assert summary.loc["fedavg", "cpu_median_s"] == 4.5
    assert summary.loc["fedavg", "peak_rss_mb"] == 360.0


def test_the_cli_writes_one_table_per_study_and_names_what_it_lacks(results, tmp_path, monkeypatch, capsys):
    out = tmp_path / "costs.md"
    monkeypatch.setattr(sys, "argv", ["run_costs.py", "study", "absent", "--results", str(results),
                                      "--by-dataset", "--out", str(out)])
    run_costs.main()
    text = out.read_text()
    assert "3 jobs, seeds [0, 1, 2], CPU time 0.6 min in all" in text
    assert re.search(r"\| fedgkd +\| CiteSeer +\| +1 \| +25 \|", text)
    assert "## absent\n\nno timed runs" in text
