"""Which batched layout is fastest for the engine's first GCN layer, on CPU and on a GPU.

    .venv/bin/python benchmarks/engine_layout.py [--device cpu|cuda] [--out FILE]

On the configurations of ``benchmarks/engine_speed.py`` (Cora-10, Cora-20, CiteSeer-10), for the
union of all clients it
times one forward and backward pass of the first layer ``X W_k`` (client-stacked weights,
hidden 64) in the two layouts the engine has: the sparse gather-sum (``embedding_bag``
forward, one CSR product with the transposed features backward; the engine's choice for
bag-of-words features) and the dense padded ``bmm`` over ``[K, n_max, F]`` (its choice for
dense features), plus the per-client loop of dense products the sequential path runs.
Median milliseconds of 50 repetitions after 5 warm-ups.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

from fglrepro.data.graph import load_graph
from fglrepro.fl.clients import build_clients
from fglrepro.fl.engine import ClientBatch
from fglrepro.partition.data import Partition
from fglrepro.sparse import sparse_matmul

sys.path.insert(0, str(Path(__file__).resolve().parent))
from engine_speed import prepare  # noqa: E402

HIDDEN = 64


def timed(fn, device: torch.device, repeats: int = 50) -> float:
    for _ in range(5):
        fn()
    times = []
    for _ in range(repeats):
        if device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return 1e3 * statistics.median(times)


def layouts(clients, device: torch.device) -> dict[str, float]:
    """Milliseconds of the first layer's forward + backward in each layout."""
    sparse = ClientBatch.of(clients, list(range(len(clients))), sparse_below=1.0)
    dense = ClientBatch.of(clients, list(range(len(clients))), sparse_below=0.0)
    num_features = clients[0].x.size(1)
    weight = torch.randn(len(clients), num_features, HIDDEN, device=device, requires_grad=True)
    per_client = [torch.randn(num_features, HIDDEN, device=device, requires_grad=True) for _ in clients]

    def gather_sum():
        sparse_matmul(sparse.stacked, weight.view(-1, HIDDEN)).sum().backward()

    def padded_bmm():
        dense.unpad(torch.bmm(dense.x_pad, weight)).sum().backward()

    def loop():
        sum((c.x @ w).sum() for c, w in zip(clients, per_client)).backward()

    return {"sparse gather-sum": timed(gather_sum, device), "dense padded bmm": timed(padded_bmm, device),
            "per-client loop (sequential)": timed(loop, device)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument("--out")
    args = parser.parse_args()
    torch.set_num_threads(1)
    device = torch.device(args.device)
    name = torch.cuda.get_device_name() if device.type == "cuda" else "CPU, 1 thread"
    lines = [f"First-layer layouts on {name} (torch {torch.__version__}), fwd + bwd, median ms", "",
             "| data | clients | sparse gather-sum | dense padded bmm | per-client loop (sequential) |",
             "|---|---:|---:|---:|---:|"]
    with tempfile.TemporaryDirectory() as tmp:
        for dataset, count in (("Cora", 10), ("Cora", 20), ("CiteSeer", 10)):
            graph, part = prepare(Path(tmp), dataset, count)
            ms = layouts(build_clients(load_graph(graph), Partition.load(part), device), device)
            lines.append(f"| {dataset} | {count} | " + " | ".join(f"{v:.2f}" for v in ms.values()) + " |")
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        Path(args.out).write_text(text)


if __name__ == "__main__":
    main()
