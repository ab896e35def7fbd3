"""Cost of FedTAD's client-side reliability ϕ on a graph of ogbn-arxiv size.

    .venv/bin/python benchmarks/fedtad_speed.py [--threads 1] [--out benchmarks/FEDTAD_SPEED.md]

One client holding the whole generated graph of :func:`partition_speed.planted_partition`
(~170k nodes, ~1.2M undirected edges) with 128 random features and 60 % labelled nodes
(the ogbn-arxiv split) computes ϕ (eq. 3-5, walk length 5) in a fresh process; the
target is under 60 s and 4 GB. The timing of a whole FedTAD run (Cora, 10 clients) is
taken by ``run_benchmarks.py``.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TARGET_S, TARGET_MB = 60.0, 4096.0


def measure(threads: int) -> dict:
    """Build the client, time ϕ, report time and this process's peak resident memory."""
    import torch

    sys.path.insert(0, str(REPO / "benchmarks"))
    from partition_speed import planted_partition

    from fglrepro.components.topology import return_probabilities
    from fglrepro.fl.clients import ClientData
    from fglrepro.methods.fedtad import class_reliability

    torch.set_num_threads(threads)
    graph = planted_partition()
    n = graph.num_nodes
    gen = torch.Generator().manual_seed(0)
    train_mask = torch.rand(n, generator=gen) < 0.6
    client = ClientData(
        x=torch.randn(n, 128, generator=gen), y=graph.y, edge_index=graph.edge_index, adj=None,
        train_mask=train_mask, val_mask=~train_mask, test_mask=~train_mask,
        global_ids=torch.arange(n), num_classes=graph.num_classes,
    )
    before_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    start = time.perf_counter()
    phi = class_reliability(client, return_probabilities(client.edge_index, client.num_nodes, 5))
    seconds = time.perf_counter() - start
    return {
        "nodes": n, "edges": graph.edge_index.size(1) // 2, "labelled": int(train_mask.sum()),
        "seconds": seconds, "peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "peak_mb_before": before_mb, "finite": bool(torch.isfinite(phi).all()), "threads": threads,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", default=None, help="markdown file to write")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(measure(args.threads)))
        return
    out = subprocess.run([sys.executable, __file__, "--child", "--threads", str(args.threads)],
                         check=True, capture_output=True, text=True)
    result = json.loads(out.stdout.strip().splitlines()[-1])
    verdict = "meets" if result["seconds"] < TARGET_S and result["peak_mb"] < TARGET_MB else "MISSES"
    text = (
        "# FedTAD reliability ϕ on a graph of ogbn-arxiv size\n\n"
        f"Command: `.venv/bin/python benchmarks/fedtad_speed.py --threads {args.threads}`\n\n"
        "| nodes | edges | labelled | threads | ϕ time (s) | peak RSS of the process (MB) "
        f"| graph built, before ϕ (MB) |\n"
        f"|---:|---:|---:|---:|---:|---:|---:|\n"
        f"| {result['nodes']} | {result['edges']} | {result['labelled']} | {result['threads']} | "
        f"{result['seconds']:.1f} | {result['peak_mb']:.0f} | {result['peak_mb_before']:.0f} |\n\n"
        f"Target under {TARGET_S:.0f} s and {TARGET_MB:.0f} MB: {verdict}.\n"
    )
    print(text)
    if args.out:
        Path(args.out).write_text(text)


if __name__ == "__main__":
    main()
