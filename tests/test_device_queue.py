"""benchmarks/device_queue.py: a queue of the workflow's commands runs without Snakemake, each job's
status is recorded (ok, the exit code, not started after the deadline, run JSON already there),
--gpu-runs sends only the named runs to CUDA (the rest to the CPU), and what came back folds into the
results snapshot."""

from __future__ import annotations

import csv
import importlib.util
import json
import shutil
import subprocess
import sys

import pandas as pd
import pytest
import torch
from conftest import REPO
from test_cli import BASE
from test_workflow import TINY_STUDY, make_workdir

spec = importlib.util.spec_from_file_location("device_queue", REPO / "benchmarks" / "device_queue.py")
device_queue = importlib.util.module_from_spec(spec)
spec.loader.exec_module(device_queue)

DOWNLOAD = ["fgl-data", "download", "--dataset", "Cora", "--root", "data/raw", "--mirror",
            str(REPO / "resources" / "datasets" / "planetoid"), "--out", "data/raw/Cora/download.json"]


def train_job(inputs, method: str, name: str, data: str = "g.pt", seed: int | None = None) -> list[str]:
    """The workflow's training command for a 4-round run on the CLI tests' graph (``cli_inputs``), with
    ``seed`` in place of BASE's when given."""
    spec = {**BASE, "method": method, "run": method, **({} if seed is None else {"seed": seed})}
    return ["fgl-train", "--spec", json.dumps(spec), "--data", str(inputs / data), "--partition", str(inputs / "p.pt"),
            "--out", f"results/runs/{name}.json", "--device", "auto", "--threads", "1"]


def run_queue(tmp_path, monkeypatch, queue: dict, *options: str) -> dict[str, str]:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "queue.json").write_text(json.dumps(queue))
    monkeypatch.setattr(sys, "argv", ["device_queue.py", "run", "--queue", "queue.json", "--workers", "2",
                                      "--log", "log.csv", *options])
    device_queue.main()
    with open(tmp_path / "log.csv") as handle:
        return {row["target"]: row["status"] for row in csv.DictReader(handle)}


def test_jobs_run_in_order_of_stages_and_failures_and_the_deadline_are_recorded(cli_inputs, tmp_path, monkeypatch):
    queue = {"download": [DOWNLOAD], "prepare": [],
             "train": [train_job(cli_inputs, "fedavg", "a"), train_job(cli_inputs, "fedavg", "b", data="missing.pt")]}
    status = run_queue(tmp_path, monkeypatch, queue)
    assert status["data/raw/Cora/download.json"] == "ok" and (tmp_path / "data/raw/Cora/download.json").exists()
    assert status["results/runs/a.json"] == "ok"
    assert json.loads((tmp_path / "results/runs/a.json").read_text())["status"] == "ok"
    assert status["results/runs/b.json"].startswith("exit ")
    assert "missing.pt" in (tmp_path / "results/logs/device_queue/results_runs_b.json.log").read_text()
    status = run_queue(tmp_path, monkeypatch, queue, "--deadline", "0")
    assert status == {"data/raw/Cora/download.json": "ok", "results/runs/a.json": "exists",
                      "results/runs/b.json": "not started"}
    (tmp_path / "results/runs/a.json").unlink()
    assert run_queue(tmp_path, monkeypatch, queue, "--deadline", "0")["results/runs/a.json"] == "not started"


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the routing by CUDA's absence")
def test_only_the_gpu_runs_are_sent_to_cuda(cli_inputs, tmp_path, monkeypatch):
    queue = {"download": [], "prepare": [],
             "train": [train_job(cli_inputs, "fedprox", "gpu"), train_job(cli_inputs, "fedavg", "cpu")]}
    status = run_queue(tmp_path, monkeypatch, queue, "--gpu-runs", "fedpr", "--gpu-workers", "1")
    assert status == {"results/runs/gpu.json": "exit 2", "results/runs/cpu.json": "ok"}
    assert "no CUDA device" in (tmp_path / "results/logs/device_queue/results_runs_gpu.json.log").read_text()


@pytest.mark.parametrize("order, expected", [("longest", ["unknown", "slow", "fast"]),
                                             ("shortest", ["fast", "slow", "unknown"])])
def test_export_orders_training_jobs_by_their_expected_cost(tmp_path, order, expected):
    jobs = {name: train_job(tmp_path, method, name) for name, method in
            [("fast", "fedavg"), ("unknown", "fedlog"), ("slow", "fedsage_plus")]}
    cost = {"method": {("fedavg", BASE["dataset"]): 5.0, ("fedsage_plus", BASE["dataset"]): 100.0}}
    assert device_queue.ordered(list(jobs.values()), cost, order) == [jobs[name] for name in expected]


def test_export_can_put_every_seed_0_job_before_any_later_seed(tmp_path):
    jobs = {(name, seed): train_job(tmp_path, method, f"{name}{seed}", seed=seed)
            for name, method in [("fast", "fedavg"), ("slow", "fedsage_plus")] for seed in (1, 0)}
    cost = {"method": {("fedavg", BASE["dataset"]): 5.0, ("fedsage_plus", BASE["dataset"]): 100.0}}
    order = device_queue.ordered(list(jobs.values()), cost, "longest", seed_first=True)
    assert order == [jobs[key] for key in [("slow", 0), ("fast", 0), ("slow", 1), ("fast", 1)]]
    assert device_queue.ordered(list(jobs.values()), cost, "longest")[:2] == [jobs["slow", 0], jobs["slow", 1]]


def test_a_jobs_cost_is_that_of_its_row_before_that_of_its_method(tmp_path):
    """FedGM+ft and FedAvg+ft are both method ``finetune``: the row's own cost decides, and a row measured on
    other datasets only has no cost here (not its method's)."""
    job = train_job(tmp_path, "finetune", "x")
    spec = json.loads(device_queue.flag(job, "--spec"))
    assert spec["run"] == "finetune"
    job[job.index("--spec") + 1] = json.dumps({**spec, "run": "fedgm_ft"})
    by_method = {"method": {("finetune", BASE["dataset"]): 30.0}}
    assert device_queue.job_seconds(job, by_method) == 30.0
    assert device_queue.job_seconds(job, {**by_method, "run": {("fedgm_ft", BASE["dataset"]): 600.0}}) == 600.0
    assert device_queue.job_seconds(job, {**by_method, "run": {("fedgm_ft", "Cora"): 600.0}}) is None


def test_export_estimates_the_queue_from_the_snapshots_costs(tmp_path):
    jobs = [train_job(tmp_path, method, name) for name, method in [("a", "fedavg"), ("b", "fedavg"), ("c", "fedlog")]]
    cost = {"method": {("fedavg", BASE["dataset"]): 900.0, ("fedlog", "Cora"): 5.0}}
    assert device_queue.queue_estimate(jobs, cost) == "about 0.5 h on one worker for 2, 1 of unknown cost"


def test_expected_costs_are_the_snapshot_s_cpu_seconds_where_recorded(tmp_path):
    runs_csv = tmp_path / "runs.csv"
    runs_csv.write_text("run,method,dataset,wall_s,cpu_s\n"
                        "a,fedavg,Cora,100.0,10.0\na,fedavg,Cora,100.0,30.0\nb,fedtad,Cora,50.0,\n")
    cost = device_queue.expected_seconds(runs_csv)
    assert cost["run"] == {("a", "Cora"): 20.0, ("b", "Cora"): 50.0}
    assert cost["method"] == {("fedavg", "Cora"): 20.0, ("fedtad", "Cora"): 50.0}


def test_export_keeps_the_training_jobs_whose_run_json_the_snapshot_lacks(tmp_path):
    done, todo = train_job(tmp_path, "fedavg", "done"), train_job(tmp_path, "fedavg", "todo")
    prepare = ["fgl-data", "prepare", "--out", "data/prepared/Cora/plain.pt"]
    runs_csv = tmp_path / "runs.csv"
    runs_csv.write_text(f"study,target\ns,{device_queue.flag(done, '--out')}\n")
    assert device_queue.missing([prepare, done, todo], runs_csv) == [todo]


def queue_tool(work, *args: str) -> str:
    """``benchmarks/device_queue.py <args>`` of the tiny workflow copy ``work`` (its own REPO)."""
    proc = subprocess.run([sys.executable, str(work / "benchmarks" / "device_queue.py"), *args], cwd=work,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, f"device_queue.py {args} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc.stdout


@pytest.mark.e2e
def test_runs_made_by_the_queue_fold_into_the_snapshot_seed_by_seed(repo, tmp_path):
    """export -> run (seed 0 only) -> fold, then again for what is left: the snapshot gets exactly the runs
    that were made, keeps the earlier ones, and a second export asks only for the runs it still lacks."""
    work = make_workdir(repo, tmp_path, TINY_STUDY)
    (work / "benchmarks").mkdir()
    shutil.copy(repo / "benchmarks" / "device_queue.py", work / "benchmarks")
    runs_csv = work / "docs" / "results" / "runs.csv"

    def export_run_fold(seeds: set[int]) -> list[dict]:
        queue_tool(work, "export", "--studies", "tiny", "--datasets", "Cora", "--out", "queue.json")
        queue = json.loads((work / "queue.json").read_text())
        planned = [json.loads(device_queue.flag(argv, "--spec")) for argv in queue["train"]]
        queue["train"] = [argv for argv, spec in zip(queue["train"], planned) if spec["seed"] in seeds]
        (work / "queue.json").write_text(json.dumps(queue))
        queue_tool(work, "run", "--queue", "queue.json", "--workers", "2", "--log", "log.csv")
        out = queue_tool(work, "fold", "--studies", "tiny", "--allow-dirty")
        assert "runs of tiny" in out
        replaced = "2 runs: 2 equal, 0 within, 0 differs" if seeds == {1} else "no run folded replaces a row"
        assert replaced in out, out
        return planned

    planned = export_run_fold({0})
    assert sorted((spec["run"], spec["seed"]) for spec in planned) == [("fedavg", 0), ("fedavg", 1),
                                                                       ("fedprox", 0), ("fedprox", 1)]
    first = pd.read_csv(runs_csv)
    assert sorted(zip(first["run"], first["seed"])) == [("fedavg", 0), ("fedprox", 0)]
    assert set(first["status"]) == {"ok"} and (work / "docs" / "results" / "COVERAGE.md").is_file()
    assert json.loads((work / "docs" / "results" / "studies.json").read_text())["tiny"]["columns"] == [["Cora", 3]]

    planned = export_run_fold({1})
    assert sorted((spec["run"], spec["seed"]) for spec in planned) == [("fedavg", 1), ("fedprox", 1)]
    both = pd.read_csv(runs_csv)
    assert sorted(zip(both["run"], both["seed"])) == [("fedavg", 0), ("fedavg", 1), ("fedprox", 0), ("fedprox", 1)]
    kept = both[both["seed"] == 0].sort_values("run")["test_acc"].tolist()
    assert kept == first.sort_values("run")["test_acc"].tolist()
    assert "2 with every row and client count; the study lists 2" in (work / "docs/results/COVERAGE.md").read_text()


def test_fold_leaves_out_a_grid_run_until_every_point_has_run(tmp_path, capsys):
    path = "results/runs/s/{run}/Cora/metis/k{k}/seed0.json"
    points = [path.format(run=f"fedgkd@tau={tau}", k=k) for k in (5, 10) for tau in (0.05, 0.5)]
    plain = path.format(run="fedavg", k=5)
    for done in [*points[:3], plain]:  # k10's tau=0.5 point has not run
        (tmp_path / done).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / done).write_text("{}")
    aggregate = ["fgl-aggregate", "--out-curves", "c.csv", *points, plain]
    assert device_queue.present_runs(aggregate, root=tmp_path) == [*points[:2], plain]
    left_out = "left out: 1 of the 2 grid points of results/runs/s/fedgkd/Cora/metis/k10/seed0.json"
    assert left_out in capsys.readouterr().out
    (tmp_path / points[3]).parent.mkdir(parents=True)
    (tmp_path / points[3]).write_text("{}")
    assert device_queue.present_runs(aggregate, root=tmp_path) == [*points, plain]


def test_fold_aggregates_only_the_runs_present_and_takes_its_files_from_the_snapshots_checkout(tmp_path):
    present, absent = (f"results/runs/s/fedavg/Cora/louvain/k3/seed{seed}.json" for seed in (0, 1))
    (tmp_path / present).parent.mkdir(parents=True)
    (tmp_path / present).write_text("{}")
    aggregate = ["fgl-aggregate", "--meta", json.dumps({"study": "s"}), "--out-metrics", "results/metrics/s.csv",
                 "--out-curves", "results/metrics/s.curves.csv"]
    report = ["fgl-report", "snapshot", "--claims", "config/paper/claims.yaml", "--paper-dir", "config/paper",
              "--meta", json.dumps({"s": {"rows": ["FedAvg"]}, "t": {}}), "--results-dir", "results",
              "--out", "docs/results", "--partition-stats", "results/tables/s.partition_stats.csv"]
    snapshot = tmp_path / "main" / "docs" / "results"
    assert device_queue.fold_commands([[aggregate + [absent], report]], snapshot, root=tmp_path) == []
    fold_aggregate, merge, coverage = device_queue.fold_commands([[aggregate + [present, absent], report]],
                                                                 snapshot, root=tmp_path)
    assert fold_aggregate == aggregate + [present]
    assert device_queue.flag(merge, "--claims") == str(tmp_path / "main" / "config/paper/claims.yaml")
    assert device_queue.flag(merge, "--out") == str(snapshot) and merge[-1] == "results/metrics/s.csv"
    assert "--merge" in merge and "--allow-dirty" not in merge and "--partition-stats" not in merge
    assert json.loads(device_queue.flag(merge, "--meta")) == {"s": {"rows": ["FedAvg"]}}
    assert device_queue.flag(coverage, "--notes") == str(tmp_path / "main" / "docs/notes/coverage.yaml")
