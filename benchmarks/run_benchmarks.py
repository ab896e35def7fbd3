"""Benchmarks of the pipeline's costs on this machine (not a test; results go to RESULTS.md).

    .venv/bin/python benchmarks/run_benchmarks.py [--repeats 3] [--out benchmarks/RESULTS.md]

Measures: process start-up of the training CLI (imports), one Louvain partition of Cora
(10 clients), and one FedAvg run on Cora / Louvain / 10 clients with the FedTAD protocol
(100 rounds x 3 local epochs, GCN hidden 64), and the same run with FedTAD (code defaults:
server distillation every round), each as wall time of a fresh process.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
MIRROR = REPO / "resources" / "datasets" / "planetoid"
FEDTAD_SPEC = {
    "method": "fedavg", "seed": 0, "hparams": {},
    "model": {"arch": "gcn", "hidden": 64, "layers": 2, "dropout": 0.5, "readout": False},
    "train": {"rounds": 100, "local_epochs": 3, "optimizer": "adam", "lr": 0.01, "weight_decay": 5e-4},
    "evaluation": {"model": "global", "average": "weighted", "patience": None},
}
PARTITION_SPEC = {"partitioner": "louvain", "options": {"delta": 20},
                  "split": {"mode": "stratified", "train": 0.2, "val": 0.4}}


def timed(cmd: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run(cmd, check=True, capture_output=True)
    return time.perf_counter() - start


def machine() -> str:
    import torch

    cpu = platform.processor() or platform.machine()
    try:
        model = next(line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name"))
    except (OSError, StopIteration):
        model = cpu
    return (f"{model}, {os.cpu_count()} cores, Python {platform.python_version()}, "
            f"torch {torch.__version__}, threads {torch.get_num_threads()}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", default=str(REPO / "benchmarks" / "RESULTS.md"))
    args = parser.parse_args()
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        subprocess.run([BIN / "fgl-data", "download", "--dataset", "Cora", "--root", tmp / "raw",
                        "--mirror", MIRROR, "--out", tmp / "dl.json"], check=True, capture_output=True)
        subprocess.run([BIN / "fgl-data", "prepare", "--dataset", "Cora", "--root", tmp / "raw",
                        "--out", tmp / "cora.pt"], check=True, capture_output=True)
        results["start-up: python -c 'import fglrepro.cli.train deps (torch, torch_geometric)'"] = [
            timed([sys.executable, "-c", "import torch, torch_geometric; import fglrepro.fl.loop"])
            for _ in range(args.repeats)]
        results["start-up: fgl-train --help"] = [
            timed([BIN / "fgl-train", "--help"]) for _ in range(args.repeats)]
        partition = [BIN / "fgl-partition", "build", "--data", tmp / "cora.pt", "--spec", json.dumps(PARTITION_SPEC),
                     "--clients", "10", "--seed", "0", "--out", tmp / "p.pt"]
        results["partition: Cora, Louvain, 10 clients (process)"] = [timed(partition) for _ in range(args.repeats)]
        inner = {}
        for method in ("fedavg", "fedtad"):
            train = [BIN / "fgl-train", "--spec", json.dumps({**FEDTAD_SPEC, "method": method}),
                     "--data", tmp / "cora.pt", "--partition", tmp / "p.pt", "--out", tmp / "run.json",
                     "--threads", "1"]
            results[f"train: {method}, Cora, Louvain, 10 clients, 100 rounds x 3 epochs, 1 thread (process)"] = [
                timed(train) for _ in range(args.repeats)]
            inner[method] = json.loads((tmp / "run.json").read_text())["wall_s"]
    lines = ["# Benchmark results", "", f"Machine: {machine()}", f"Date: {time.strftime('%Y-%m-%d')}", "",
             "Wall time of a fresh process, seconds (median / min / max of "
             f"{args.repeats}).", "", "| what | median | min | max |", "|---|---:|---:|---:|"]
    for name, values in results.items():
        lines.append(f"| {name} | {statistics.median(values):.2f} | {min(values):.2f} | {max(values):.2f} |")
    lines += [""] + [f"Round loop alone (wall_s in the run JSON of the last {method} run): {value:.2f} s"
                     for method, value in inner.items()] + [""]
    Path(args.out).write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
