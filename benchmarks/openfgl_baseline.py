"""OpenFGL's own FedAvg/FedProx/SCAFFOLD/MOON on our benchmark configuration, timed on this machine.

    .venv/bin/python benchmarks/openfgl_baseline.py [--python PY] [--reps 3] [--only fedavg:Cora:10]
                                                   [--format jsonl|csv] [--out FILE]

Each run is a fresh subprocess of an OpenFGL-capable Python (default /tmp/openfgl-venv/bin/python,
or $OPENFGL_PYTHON, or --python); OpenFGL is never imported in this process. Per run it reports
(one JSON line or CSV row: method, dataset, clients, process_s, loop_s, test_acc, plus
process_cpu_s, loop_cpu_s, final_test_acc, best_round, seed):

- process_s: wall time from just before the subprocess is spawned to its exit: interpreter start,
  imports (torch, torch_geometric, openfgl), PyG's processing of the raw Planetoid files, OpenFGL's
  Louvain partition and per-client split (a fresh, empty data root per run, so nothing is cached),
  client/server construction, the rounds, and writing the result.
- loop_s: wall time of `FGLTrainer.train()` alone, i.e. OpenFGL's communication rounds: per round
  the server broadcast, every client's local training (3 epochs), the server aggregation and the
  per-round evaluation of the global model on every client (including OpenFGL's own prints of it;
  its logger is a no-op without --debug). Data loading, partitioning, splitting and model/optimizer
  construction (all in `FGLTrainer.__init__`) are outside it.
- process_cpu_s, loop_cpu_s: CPU time (user + system) of the same two spans; with one thread they
  stay close to the wall times on an idle machine and are the numbers to compare when it is loaded.
- test_acc: OpenFGL's reported `best_test_accuracy` (test accuracy of the round with the best
  validation accuracy); final_test_acc is the last round's test accuracy.

Configuration (OpenFGL names): scenario subgraph_fl, simulation_mode subgraph_fl_louvain
(resolution 1, delta 20), train_val_test default_split (per client, per class 20/40/40 %), model
gcn (2 layers, hidden 64, dropout 0.5), Adam lr 0.01, weight decay 5e-4, 100 rounds, 3 local epochs,
client_frac 1.0, evaluation_mode global_model_on_local_data (node-count-weighted mean over clients),
CPU, torch.set_num_threads(1) and OMP_NUM_THREADS=1, seed_everything(seed) before building the
trainer (OpenFGL's library never seeds by itself). FedProx uses mu 0.01 (OpenFGL's default is
1e-3); SCAFFOLD and MOON use OpenFGL's defaults (MOON: mu 1, temperature 0.5). Raw Planetoid files
come from resources/datasets/planetoid, so nothing is downloaded.

Install OpenFGL (PyPI openfgl-lib 1.1.0 declares only `requests`; the rest is added by hand):

    python3 -m venv /tmp/openfgl-venv
    /tmp/openfgl-venv/bin/pip install torch==2.13.0
    /tmp/openfgl-venv/bin/pip install openfgl-lib==1.1.0 torch==2.13.0 torch-geometric==2.8.1 \\
        scikit-learn scikit-network pymetis tqdm munkres
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RAW_DIR = REPO / "resources" / "datasets" / "planetoid"
DEFAULT_PYTHON = "/tmp/openfgl-venv/bin/python"
COLUMNS = ["method", "dataset", "clients", "process_s", "loop_s", "test_acc",
           "process_cpu_s", "loop_cpu_s", "final_test_acc", "best_round", "seed"]
CONFIGS = [("fedavg", "Cora", 10), ("fedavg", "Cora", 20), ("fedavg", "CiteSeer", 10),
           ("fedprox", "Cora", 10), ("scaffold", "Cora", 10), ("moon", "Cora", 10)]
FEDPROX_MU = 0.01

# Runs inside the OpenFGL interpreter; argv[1] is a JSON dict (root, dataset, clients, method, seed,
# rounds, result). Writes its result as JSON to cfg["result"].
DRIVER = r"""
import json, sys, time
cfg = json.loads(sys.argv[1])
sys.argv = sys.argv[:1]  # openfgl.config parses sys.argv at import
import torch
torch.set_num_threads(1)
import openfgl.config as config
from openfgl.flcore.trainer import FGLTrainer
from openfgl.utils.basic_utils import seed_everything
a = config.args
a.root, a.dataset, a.num_clients = cfg["root"], [cfg["dataset"]], cfg["clients"]
a.fl_algorithm, a.scenario, a.simulation_mode = cfg["method"], "subgraph_fl", "subgraph_fl_louvain"
a.task, a.train_val_test, a.client_frac = "node_cls", "default_split", 1.0
a.model, a.num_layers, a.hid_dim, a.dropout = ["gcn"], 2, 64, 0.5
a.optim, a.lr, a.weight_decay, a.num_rounds, a.num_epochs = "adam", 0.01, 5e-4, cfg["rounds"], 3
a.metrics, a.evaluation_mode = ["accuracy"], "global_model_on_local_data"
a.use_cuda, a.seed, a.debug = False, cfg["seed"], False
if a.fl_algorithm == "fedprox":
    from openfgl.flcore.fedprox.fedprox_config import config as prox
    prox["fedprox_mu"] = cfg["fedprox_mu"]
seed_everything(a.seed)
trainer = FGLTrainer(a)  # loads data, partitions, splits, builds clients and server
last = {}
trainer.logger.add_log = last.update  # keep the last round's metrics (the logger is a no-op anyway)
start, cpu_start = time.perf_counter(), time.process_time()
trainer.train()  # the communication rounds, with per-round evaluation
loop_s, loop_cpu_s = time.perf_counter() - start, time.process_time() - cpu_start
best = trainer.evaluation_result
with open(cfg["result"], "w") as f:
    json.dump({"loop_s": loop_s, "loop_cpu_s": loop_cpu_s, "test_acc": best["best_test_accuracy"],
               "best_round": best["best_round"], "final_test_acc": last["current_test_accuracy"]}, f)
"""


class OpenFGLUnavailable(RuntimeError):
    """The given Python cannot import openfgl."""


def openfgl_python(python: str | None = None) -> str:
    return python or os.environ.get("OPENFGL_PYTHON") or DEFAULT_PYTHON


def openfgl_available(python: str | None = None) -> bool:
    python = openfgl_python(python)
    if not Path(python).exists():
        return False
    probe = "import importlib.util, sys; sys.exit(importlib.util.find_spec('openfgl') is None)"
    return subprocess.run([python, "-c", probe], check=False, capture_output=True).returncode == 0


def children_cpu() -> float:
    """CPU seconds (user + system) of this process's finished children so far."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run_openfgl(method: str, dataset: str, clients: int, python: str | None = None,
                seed: int = 2024, rounds: int = 100, raw_dir: Path = RAW_DIR) -> dict:
    """One OpenFGL run in a fresh process; returns a dict with the COLUMNS keys.

    Raises OpenFGLUnavailable if `python` cannot import openfgl.
    """
    python = openfgl_python(python)
    if not openfgl_available(python):
        raise OpenFGLUnavailable(f"OpenFGL is not importable by {python} (this module's docstring says how "
                                 "to install it)")
    with tempfile.TemporaryDirectory(prefix="openfgl-root-") as root:
        raw = Path(root, "global", "subgraph_fl", dataset, "raw")  # where PyG's Planetoid looks
        raw.mkdir(parents=True)
        for f in Path(raw_dir).glob(f"ind.{dataset.lower()}.*"):
            shutil.copy(f, raw)
        result = Path(root, "result.json")
        cfg = {"root": root, "dataset": dataset, "clients": clients, "method": method, "seed": seed,
               "rounds": rounds, "fedprox_mu": FEDPROX_MU, "result": str(result)}
        # OpenFGL (written for torch < 2.6) torch.load()s the partition files it has just written
        # without weights_only=False, which torch >= 2.6 refuses; this restores the old default.
        env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD="1")
        cpu_before = children_cpu()
        start = time.perf_counter()
        proc = subprocess.run([python, "-c", DRIVER, json.dumps(cfg)], check=False, capture_output=True,
                              text=True, env=env, cwd=root)
        process_s = time.perf_counter() - start
        process_cpu_s = children_cpu() - cpu_before
        if proc.returncode != 0:
            raise RuntimeError(f"OpenFGL run {method}/{dataset}/{clients} failed:\n{proc.stderr[-3000:]}")
        out = json.loads(result.read_text())
    return {"method": method, "dataset": dataset, "clients": clients, "process_s": round(process_s, 3),
            "loop_s": round(out["loop_s"], 3), "test_acc": round(out["test_acc"], 4),
            "process_cpu_s": round(process_cpu_s, 3), "loop_cpu_s": round(out["loop_cpu_s"], 3),
            "final_test_acc": round(out["final_test_acc"], 4), "best_round": out["best_round"], "seed": seed}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--python", default=None,
                        help=f"OpenFGL python (default $OPENFGL_PYTHON or {DEFAULT_PYTHON})")
    parser.add_argument("--reps", type=int, default=1, help="runs per configuration, seeds 2024, 2025, ...")
    parser.add_argument("--only", action="append", default=[], metavar="METHOD:DATASET:CLIENTS",
                        help="run only these configurations (repeatable)")
    parser.add_argument("--format", choices=["jsonl", "csv"], default="jsonl")
    parser.add_argument("--out", default=None, help="also write the rows to this file")
    args = parser.parse_args()
    python = openfgl_python(args.python)
    if not openfgl_available(python):
        print(f"SKIP: OpenFGL is not importable by {python}; install it as the docstring of "
              f"{Path(__file__).name} says, or pass --python / OPENFGL_PYTHON.", file=sys.stderr)
        return
    configs = [(m, d, int(c)) for m, d, c in (o.split(":") for o in args.only)] if args.only else CONFIGS
    rows = []
    for method, dataset, clients in configs:
        for rep in range(args.reps):
            rows.append(run_openfgl(method, dataset, clients, python, seed=2024 + rep))
            print("done:", json.dumps(rows[-1]), file=sys.stderr, flush=True)
    write_rows(rows, sys.stdout, args.format)
    if args.out:
        with open(args.out, "w", newline="") as sink:
            write_rows(rows, sink, args.format)


def write_rows(rows: list[dict], sink, fmt: str) -> None:
    if fmt == "csv":
        writer = csv.DictWriter(sink, fieldnames=COLUMNS)
        writer.writeheader()
        writer.writerows(rows)
    else:
        sink.writelines(json.dumps(r) + "\n" for r in rows)


if __name__ == "__main__":
    main()
