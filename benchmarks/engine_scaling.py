"""FedAvg's round loop against the number of clients: is the vectorised engine linear in K?

    .venv/bin/python benchmarks/engine_scaling.py [--clients 5 10 20 50 100] [--repeats 3]
        [--rounds 50] [--dataset Cora] [--src path/to/src] [--out benchmarks/ENGINE_SCALING.md]

Metis partitions of ``--dataset`` (stratified 20/40/40) into each K, then FedAvg (2-layer GCN
hidden 64, dropout 0.5, Adam, 3 local epochs, global model tested every round, one thread) for
``--rounds`` rounds and for 10 rounds. Reported per K: the median over repetitions of the CPU
seconds per round, the difference of the two processes' CPU time (user + system) divided by
the difference of their rounds (start-up, loading and the partition cancel; CPU time is robust
to other load on the machine), a least-squares line ``a + b K`` through all K, and each K's deviation from that line. ``--src``
measures another source tree (e.g. a ``git worktree`` of an earlier commit).
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, nargs="+", default=[5, 10, 20, 50, 100])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=50)
    parser.add_argument("--dataset", default="Cora")
    parser.add_argument("--src", type=Path, default=REPO / "src", help="source tree measured")
    parser.add_argument("--out", default=str(REPO / "benchmarks" / "ENGINE_SCALING.md"))
    args = parser.parse_args()
    graph = REPO / "data" / "prepared" / args.dataset / "plain.pt"
    if not graph.exists():
        sys.exit(f"{graph} is missing: build it first (snakemake {graph.relative_to(REPO)} --cores 1)")
    short = 10
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
                cpu = [cli("train", "--spec", json.dumps({**SPEC, "train": {**SPEC["train"], "rounds": rounds}}),
                           "--data", graph, "--partition", part, "--out", out, "--threads", 1, "--device", "cpu",
                           src=args.src) for rounds in (short, args.rounds)]
                samples.append((cpu[1] - cpu[0]) / (args.rounds - short))
            per_round[k] = statistics.median(samples)
            print(f"K={k}: {1000 * per_round[k]:.1f} ms per round", flush=True)
    ks = np.array(args.clients, dtype=float)
    ms = 1000 * np.array([per_round[k] for k in args.clients])
    slope, intercept = np.polyfit(ks, ms, 1)
    lines = [f"# FedAvg round loop against the number of clients ({args.dataset}, Metis)", "",
             f"Written by `benchmarks/engine_scaling.py` ({start}); {machine()}; source tree `{args.src}`; "
             f"training processes with one thread; CPU ms per round: (CPU of a {args.rounds}-round process - CPU "
             f"of a {short}-round one) / {args.rounds - short}, median of {args.repeats} repetitions.", "",
             f"Least-squares line: {intercept:.1f} ms + {slope:.2f} ms per client.", "",
             "| clients | ms per round | line | deviation |", "|---:|---:|---:|---:|"]
    for k, value in zip(args.clients, ms):
        fit = intercept + slope * k
        lines.append(f"| {k} | {value:.1f} | {fit:.1f} | {100 * (value - fit) / fit:+.1f} % |")
    Path(args.out).write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
