"""The vectorised engine against the sequential path and OpenFGL, measured side by side.

    .venv/bin/python benchmarks/engine_speed.py [--repeats 3] [--out benchmarks/ENGINE_SPEED.md]
        [--openfgl-python /tmp/openfgl-venv/bin/python] [--device cpu|cuda] [--only fedavg:Cora:10 ...]

The CLIs run as modules (``python -m fglrepro.cli.train``), so the script also runs where the
package is only on PYTHONPATH (a GPU node without the project's virtual environment).

For each configuration (FedAvg on Cora-10, Cora-20, CiteSeer-10; FedProx, SCAFFOLD and MOON on
Cora-10; the FedTAD Table 2 protocol: Louvain + FedSage+ assignment, stratified 20/40/40,
2-layer GCN hidden 64, dropout 0.5, Adam lr 0.01 weight decay 5e-4, 100 rounds x 3 local epochs,
global model tested every round, one thread) every repetition runs, back to back so that they
share the machine's load, ``fgl-train`` with ``train.engine: sequential``, ``fgl-train`` with
``train.engine: vectorised`` and, when installed, OpenFGL's implementation of the method
(``benchmarks/openfgl_baseline.py``). Reported per configuration: medians of the whole process
(wall, start to exit) and of the round loop (``wall_s`` of the run JSON; OpenFGL's
``trainer.train()``), the same spans in CPU seconds (user + system; the numbers to compare on a loaded
machine), the ratios vectorised / sequential and vectorised / OpenFGL, and the best-round test accuracy.
Also: the start-up of a training process (``fgl-train`` on a missing data file, i.e. imports
until the first file access) and which heavy libraries a training process imports.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from openfgl_baseline import children_cpu, openfgl_available, run_openfgl  # noqa: E402
from run_benchmarks import MIRROR, REPO, machine  # noqa: E402

SPEC = {
    "seed": 0, "hparams": {},
    "model": {"arch": "gcn", "hidden": 64, "layers": 2, "dropout": 0.5, "readout": False},
    "train": {"rounds": 100, "local_epochs": 3, "optimizer": "adam", "lr": 0.01, "weight_decay": 5e-4},
    "evaluation": {"model": "global", "average": "weighted", "patience": None},
}
PARTITION = {"partitioner": "louvain", "options": {"delta": 20},
             "split": {"mode": "stratified", "train": 0.2, "val": 0.4}}
CONFIGS = [("fedavg", "Cora", 10), ("fedavg", "Cora", 20), ("fedavg", "CiteSeer", 10),
           ("fedprox", "Cora", 10), ("scaffold", "Cora", 10), ("moon", "Cora", 10)]
HPARAMS = {"fedprox": {"mu": 0.01}}


def cli(name: str) -> tuple[str, ...]:
    """``fgl-<name>`` run as a module (so it also runs where the package is only on PYTHONPATH)."""
    return sys.executable, "-m", f"fglrepro.cli.{name}"


HEAVY = ("torch_geometric", "sklearn", "igraph", "pymetis", "networkx", "pandas", "scipy")


def run(cmd: list) -> tuple[float, float]:
    """Wall and CPU seconds (user + system) of a subprocess."""
    start, cpu = time.perf_counter(), children_cpu()
    subprocess.run([str(c) for c in cmd], check=True, capture_output=True)
    return time.perf_counter() - start, children_cpu() - cpu


def prepare(tmp: Path, dataset: str, clients: int) -> tuple[Path, Path]:
    """Prepared graph and partition files of one configuration (built once, outside the timing)."""
    graph, part = tmp / f"{dataset}.pt", tmp / f"{dataset}-{clients}.pt"
    if part.exists():
        return graph, part
    if not graph.exists():
        run([*cli("data"), "download", "--dataset", dataset, "--root", tmp / "raw", "--mirror", MIRROR,
             "--out", tmp / f"{dataset}.json"])
        run([*cli("data"), "prepare", "--dataset", dataset, "--root", tmp / "raw", "--out", graph])
    run([*cli("partition"), "build", "--data", graph, "--spec", json.dumps(PARTITION), "--clients", clients,
         "--seed", 0, "--out", part])
    return graph, part


def train(method: str, engine: str, graph: Path, part: Path, out: Path, device: str) -> dict:
    spec = {**SPEC, "method": method, "hparams": HPARAMS.get(method, {}), "train": {**SPEC["train"], "engine": engine}}
    process, process_cpu = run([*cli("train"), "--spec", json.dumps(spec), "--data", graph,
                                "--partition", part, "--out", out, "--threads", 1, "--device", device])
    record = json.loads(out.read_text())
    assert record["engine"] == engine, record["engine"]
    return {"process_s": process, "process_cpu_s": process_cpu, "loop_s": record["wall_s"],
            "loop_cpu_s": record["cpu_s"], "test_acc": record["metrics"]["best"]["test_acc"]}


def startup(tmp: Path) -> dict:
    """Start-up of a training process, and the heavy libraries it imports (as top-level modules:
    ``fglrepro.pyg_import`` registers ``torch_geometric.isinstance`` alone, without importing PyG)."""
    spec = json.dumps({**SPEC, "method": "fedavg"})
    missing = [*cli("train"), "--spec", spec, "--data", tmp / "missing.pt",
               "--partition", tmp / "missing.pt", "--out", tmp / "x.json"]
    times = []
    for _ in range(5):
        start = time.perf_counter()
        subprocess.run([str(c) for c in missing], capture_output=True)
        times.append(time.perf_counter() - start)
    probe = ("import sys, fglrepro.cli.train as t, fglrepro.methods.fedavg, fglrepro.fl.engine, fglrepro.fl.loop, "
             "fglrepro.data.graph, fglrepro.partition.data; print(sorted(set(sys.modules) & "
             f"set({list(HEAVY)!r})))")
    imported = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout.strip()
    return {"missing_file_s": statistics.median(times), "heavy_imports": imported}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", default=str(REPO / "benchmarks" / "ENGINE_SPEED.md"))
    parser.add_argument("--openfgl-python", default=os.environ.get("OPENFGL_PYTHON", "/tmp/openfgl-venv/bin/python"))
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument("--only", nargs="+", metavar="METHOD:DATASET:CLIENTS",
                        help="measure only these configurations (e.g. fedavg:Cora:10)")
    args = parser.parse_args()
    configs = [c for c in CONFIGS if args.only is None or ":".join(map(str, c)) in args.only]
    if not configs:
        sys.exit(f"--only matches no configuration; choose from {[':'.join(map(str, c)) for c in CONFIGS]}")
    with_openfgl = args.device == "cpu" and openfgl_available(args.openfgl_python)
    rows = []
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        start = startup(tmp)
        for method, dataset, clients in configs:
            graph, part = prepare(tmp, dataset, clients)
            samples = {"sequential": [], "vectorised": [], "openfgl": []}
            for _ in range(args.repeats):
                for engine in ("sequential", "vectorised"):
                    samples[engine].append(train(method, engine, graph, part, tmp / "run.json", args.device))
                if with_openfgl:
                    samples["openfgl"].append(run_openfgl(method, dataset, clients, python=args.openfgl_python))
            rows.append((method, dataset, clients, samples))
            print(method, dataset, clients, {k: [round(s["loop_s"], 2) for s in v] for k, v in samples.items()},
                  flush=True)
    write_report(args, rows, start, with_openfgl, load_before, os.getloadavg())


def device_name(device: str) -> str:
    import torch

    return torch.cuda.get_device_name() if device == "cuda" else "cpu"


def median(samples: list[dict], key: str) -> float:
    return statistics.median(s[key] for s in samples)


def write_report(args, rows, start, with_openfgl, load_before, load_after) -> None:
    lines = [
        "# Vectorised engine vs sequential path vs OpenFGL", "",
        f"Machine: {machine()}; device {device_name(args.device)}; every process runs with one torch thread.",
        f"Date: {time.strftime('%Y-%m-%d %H:%M')}; load average before {load_before[0]:.2f}, after "
        f"{load_after[0]:.2f} (1 min).", "",
        f"Medians of {args.repeats} paired repetitions (each repetition runs the three back to back). "
        "Loop: the round loop (100 rounds x 3 local epochs, global model tested each round); process: "
        "the whole `fgl-train` process (imports, loading, loop, writing the run JSON) or OpenFGL's "
        "whole script (imports, its own data processing and Louvain partition, loop). Test accuracy: "
        "best-validation round (OpenFGL: its own partition and split, so not the same clients).", "",
        "| method | data | clients | loop seq. (s) | loop vec. (s) | loop OpenFGL (s) | process seq. (s) | "
        "process vec. (s) | process OpenFGL (s) | vec./seq. loop | vec./seq. process | test acc seq. / vec. / "
        "OpenFGL |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for method, dataset, clients, samples in rows:
        seq, vec, ofgl = samples["sequential"], samples["vectorised"], samples["openfgl"]
        ofgl_loop = f"{median(ofgl, 'loop_s'):.2f}" if ofgl else "-"
        ofgl_proc = f"{median(ofgl, 'process_s'):.2f}" if ofgl else "-"
        ofgl_acc = f"{100 * median(ofgl, 'test_acc'):.1f}" if ofgl else "-"
        lines.append(
            f"| {method} | {dataset} | {clients} | {median(seq, 'loop_s'):.2f} | {median(vec, 'loop_s'):.2f} | "
            f"{ofgl_loop} | {median(seq, 'process_s'):.2f} | {median(vec, 'process_s'):.2f} | {ofgl_proc} | "
            f"{median(vec, 'loop_s') / median(seq, 'loop_s'):.2f} | "
            f"{median(vec, 'process_s') / median(seq, 'process_s'):.2f} | "
            f"{100 * median(seq, 'test_acc'):.1f} / {100 * median(vec, 'test_acc'):.1f} / {ofgl_acc} |")
    lines += ["", "CPU seconds (user + system) of the same spans; OpenFGL's loop CPU is that of its `trainer.train()`.",
              "", "| method | data | clients | loop CPU seq. / vec. / OpenFGL (s) "
              "| process CPU seq. / vec. / OpenFGL (s) | vec./seq. loop CPU | vec./OpenFGL loop CPU "
              "| vec./seq. process CPU | vec./OpenFGL process CPU |",
              "|---|---|---:|---|---|---:|---:|---:|---:|"]
    for method, dataset, clients, samples in rows:
        seq, vec, ofgl = samples["sequential"], samples["vectorised"], samples["openfgl"]
        cells = [method, dataset, str(clients)]
        for key in ("loop_cpu_s", "process_cpu_s"):
            cells.append(" / ".join(f"{median(runs, key):.2f}" if runs else "-" for runs in (seq, vec, ofgl)))
        for key in ("loop_cpu_s", "process_cpu_s"):
            cells.append(f"{median(vec, key) / median(seq, key):.2f}")
            cells.append(f"{median(vec, key) / median(ofgl, key):.2f}" if ofgl else "-")
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", f"Start-up: `fgl-train` on a missing data file exits after {start['missing_file_s']:.2f} s "
              f"(median of 5; imports of the training path). Heavy libraries imported by a training process "
              f"(of {', '.join(HEAVY)}): {start['heavy_imports']}."]
    if not with_openfgl:
        lines += ["", "OpenFGL was not installed; see benchmarks/openfgl_baseline.py for how to install it."]
    Path(args.out).write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
