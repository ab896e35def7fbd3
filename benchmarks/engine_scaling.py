"""FedAvg's round loop against the number of clients: is the vectorised engine linear in K?

    .venv/bin/python benchmarks/engine_scaling.py [--clients 5 10 20 50 100] [--repeats 3]
        [--rounds 50] [--dataset Cora] [--out benchmarks/ENGINE_SCALING.md]

Metis partitions of ``--dataset`` (stratified 20/40/40) into each K, then FedAvg (2-layer GCN
hidden 64, dropout 0.5, Adam, 3 local epochs, global model tested every round, one thread) for
``--rounds`` rounds. Reported per K: the median over repetitions of the round loop's CPU
seconds per round (``cpu_s`` of the run JSON: robust to other load on the machine), a
least-squares line ``a + b K`` through all K, and each K's deviation from that line.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from run_benchmarks import REPO, machine  # noqa: E402

SPEC = {"seed": 0, "method": "fedavg", "hparams": {},
        "model": {"arch": "gcn", "hidden": 64, "layers": 2, "dropout": 0.5},
        "train": {"local_epochs": 3, "optimizer": "adam", "lr": 0.01, "weight_decay": 5e-4},
        "evaluation": {"model": "global", "average": "weighted"}}
PARTITION = {"partitioner": "metis", "split": {"mode": "stratified", "train": 0.2, "val": 0.4}}


def cli(name: str, *args) -> None:
    subprocess.run([sys.executable, "-m", f"fglrepro.cli.{name}", *map(str, args)], cwd=REPO, check=True,
                   capture_output=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, nargs="+", default=[5, 10, 20, 50, 100])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=50)
    parser.add_argument("--dataset", default="Cora")
    parser.add_argument("--out", default=str(REPO / "benchmarks" / "ENGINE_SCALING.md"))
    args = parser.parse_args()
    graph = REPO / "data" / "prepared" / args.dataset / "plain.pt"
    if not graph.exists():
        sys.exit(f"{graph} is missing: build it first (snakemake {graph.relative_to(REPO)} --cores 1)")
    spec = {**SPEC, "train": {**SPEC["train"], "rounds": args.rounds}}
    per_round = {}
    start = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    with tempfile.TemporaryDirectory() as tmp:
        for k in args.clients:
            part = Path(tmp) / f"k{k}.pt"
            cli("partition", "build", "--data", graph, "--spec", json.dumps(PARTITION), "--clients", k, "--seed", 0,
                "--out", part)
            samples = []
            for _ in range(args.repeats):
                out = Path(tmp) / "run.json"
                cli("train", "--spec", json.dumps(spec), "--data", graph, "--partition", part, "--out", out,
                    "--threads", 1, "--device", "cpu")
                samples.append(json.loads(out.read_text())["cpu_s"] / args.rounds)
            per_round[k] = statistics.median(samples)
            print(f"K={k}: {1000 * per_round[k]:.1f} ms per round", flush=True)
    ks = np.array(args.clients, dtype=float)
    ms = 1000 * np.array([per_round[k] for k in args.clients])
    slope, intercept = np.polyfit(ks, ms, 1)
    lines = [f"# FedAvg round loop against the number of clients ({args.dataset}, Metis)", "",
             f"Written by `benchmarks/engine_scaling.py` ({start}); {machine()}; {args.rounds} rounds, "
             f"median of {args.repeats} runs; CPU ms per round of the loop (`cpu_s` / rounds).", "",
             f"Least-squares line: {intercept:.1f} ms + {slope:.2f} ms per client.", "",
             "| clients | ms per round | line | deviation |", "|---:|---:|---:|---:|"]
    for k, value in zip(args.clients, ms):
        fit = intercept + slope * k
        lines.append(f"| {k} | {value:.1f} | {fit:.1f} | {100 * (value - fit) / fit:+.1f} % |")
    Path(args.out).write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
