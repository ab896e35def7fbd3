"""benchmarks/device_queue.py run: a queue of the workflow's commands runs without Snakemake, each job's
status is recorded (ok, the exit code, not started after the deadline) and --gpu-runs sends only
the named runs to CUDA (the rest to the CPU)."""

from __future__ import annotations

import csv
import importlib.util
import json
import sys

import pytest
import torch
from conftest import REPO
from test_cli import BASE

spec = importlib.util.spec_from_file_location("device_queue", REPO / "benchmarks" / "device_queue.py")
device_queue = importlib.util.module_from_spec(spec)
spec.loader.exec_module(device_queue)

DOWNLOAD = ["fgl-data", "download", "--dataset", "Cora", "--root", "data/raw", "--mirror",
            str(REPO / "resources" / "datasets" / "planetoid"), "--out", "data/raw/Cora/download.json"]


def train_job(inputs, method: str, name: str, data: str = "g.pt") -> list[str]:
    """The workflow's training command for a 4-round run on the CLI tests' graph (``cli_inputs``)."""
    spec = {**BASE, "method": method, "run": method}
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
    assert status == {"data/raw/Cora/download.json": "ok", "results/runs/a.json": "not started",
                      "results/runs/b.json": "not started"}


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
    cost = {("fedavg", BASE["dataset"]): 5.0, ("fedsage_plus", BASE["dataset"]): 100.0}
    assert device_queue.ordered(list(jobs.values()), cost, order) == [jobs[name] for name in expected]


def test_export_keeps_the_training_jobs_whose_run_json_the_snapshot_lacks(tmp_path):
    done, todo = train_job(tmp_path, "fedavg", "done"), train_job(tmp_path, "fedavg", "todo")
    prepare = ["fgl-data", "prepare", "--out", "data/prepared/Cora/plain.pt"]
    runs_csv = tmp_path / "runs.csv"
    runs_csv.write_text(f"study,target\ns,{device_queue.flag(done, '--out')}\n")
    assert device_queue.missing([prepare, done, todo], runs_csv) == [todo]
