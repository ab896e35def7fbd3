"""FedAvg's round loop against the number of clients: is the vectorised engine linear in K?

    .venv/bin/python benchmarks/engine_scaling.py [--clients 5 10 20 50 100] [--repeats 3]
        [--rounds 40] [--datasets Cora CiteSeer] [--src NAME=path/to/src ...] [--data-dir data]
        [--out benchmarks/ENGINE_SCALING.md]

Metis partitions of each data set (stratified 20/40/40) into each K, then FedAvg (2-layer GCN
hidden 64, dropout 0.5, Adam, 3 local epochs, global model tested every round, one thread) for
``--rounds`` rounds. Reported per source tree and K: the median over repetitions of the CPU
milliseconds per round (the round loop's CPU time as the run JSON records it, so start-up and
loading do not enter; CPU time is less sensitive than wall time to other load on the machine),
a least-squares line ``a + b K`` through all K, and each K's deviation from that line. Several
``--src`` trees (e.g. ``before=/tmp/before/src``, an ``git archive`` of an earlier commit) are
measured interleaved, one repetition of each tree after the other, so that they share the
machine's load; the last column compares each tree with the first.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
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


def cli(name: str, *args, src: Path = REPO / "src") -> float:
    """Run ``fgl-<name> args`` on the package at ``src``; its CPU seconds (user + system)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run([sys.executable, "-m", f"fglrepro.cli.{name}", *map(str, args)], cwd=REPO, check=True,
                   capture_output=True, env={**os.environ, "PYTHONPATH": str(src)})
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime


def per_round(src: Path, graph: Path, part: Path, out: Path, rounds: int) -> float:
    """CPU seconds per round of FedAvg: the round loop's CPU time (``cpu_s`` of the run JSON,
    without start-up, loading and writing) divided by ``rounds``."""
    cli("train", "--spec", json.dumps({**SPEC, "train": {**SPEC["train"], "rounds": rounds}}), "--data", graph,
        "--partition", part, "--out", out, "--threads", 1, "--device", "cpu", src=src)
    return json.loads(out.read_text())["cpu_s"] / rounds


def table(ks: list[int], ms: np.ndarray, first: np.ndarray | None) -> list[str]:
    """Least-squares line and per-K deviation (and the ratio to the first tree's ``first``)."""
    slope, intercept = np.polyfit(np.array(ks, dtype=float), ms, 1)
    lines = [f"Least-squares line: {intercept:.1f} ms + {slope:.2f} ms per client; largest deviation "
             f"{max(abs(v / (intercept + slope * k) - 1) for k, v in zip(ks, ms)) * 100:.1f} %.", "",
             "| clients | ms per round | line | deviation | / first tree |", "|---:|---:|---:|---:|---:|"]
    for i, (k, value) in enumerate(zip(ks, ms)):
        fit = intercept + slope * k
        ratio = "" if first is None else f"{value / first[i]:.2f}"
        lines.append(f"| {k} | {value:.1f} | {fit:.1f} | {100 * (value - fit) / fit:+.1f} % | {ratio} |")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, nargs="+", default=[5, 10, 20, 50, 100])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--datasets", nargs="+", default=["Cora", "CiteSeer"])
    parser.add_argument("--src", nargs="+", default=[f"current={REPO / 'src'}"],
                        help="NAME=PATH of each source tree measured (interleaved)")
    parser.add_argument("--data-dir", type=Path, default=REPO / "data", help="holds prepared/<dataset>/plain.pt")
    parser.add_argument("--out", default=str(REPO / "benchmarks" / "ENGINE_SCALING.md"))
    args = parser.parse_args()
    trees = dict(item.split("=", 1) for item in args.src)
    start = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    load_before = os.getloadavg()[0]
    results: dict[str, dict[str, list[float]]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for dataset in args.datasets:
            graph = args.data_dir / "prepared" / dataset / "plain.pt"
            if not graph.exists():
                sys.exit(f"{graph} is missing: build it first (snakemake data/prepared/{dataset}/plain.pt --cores 1)")
            results[dataset] = {name: [] for name in trees}
            for k in args.clients:
                part = Path(tmp) / f"{dataset}-k{k}.pt"
                cli("partition", "build", "--data", graph, "--spec", json.dumps(PARTITION), "--clients", k,
                    "--seed", 0, "--out", part)
                samples = {name: [] for name in trees}
                for _ in range(args.repeats):
                    for name, src in trees.items():
                        samples[name].append(per_round(Path(src), graph, part, Path(tmp) / "run.json", args.rounds))
                for name in trees:
                    results[dataset][name].append(1000 * statistics.median(samples[name]))
                print(dataset, f"K={k}:", {n: f"{v[-1]:.1f} ms" for n, v in results[dataset].items()}, flush=True)
    lines = ["# FedAvg round loop against the number of clients (Metis)", "",
             f"Written by `benchmarks/engine_scaling.py` ({start}); {machine()}; load average (1 min) "
             f"{load_before:.1f} before, {os.getloadavg()[0]:.1f} after; training processes with one thread; "
             f"CPU ms per round: the round loop's CPU time over {args.rounds} rounds / {args.rounds}, median of "
             f"{args.repeats} repetitions; source trees (measured interleaved): "
             + ", ".join(f"{name} `{src}`" for name, src in trees.items()) + "."]
    for dataset, per_tree in results.items():
        first = None
        for name, values in per_tree.items():
            ms = np.array(values)
            lines += ["", f"## {dataset}, {name}", "", *table(args.clients, ms, first)]
            first = ms if first is None else first
    Path(args.out).write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
