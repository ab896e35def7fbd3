"""Speed of every partitioner and of partition_stats on a graph of ogbn-arxiv size.

    .venv/bin/python benchmarks/partition_speed.py [--clients 10] [--out benchmarks/PARTITION_SPEED.md]

The graph is a degree-corrected planted partition drawn with numpy: ~170k nodes in
communities of skewed sizes, ~1.2M undirected edges (80 % inside a community), 40 labels
(each community has a dominant label that 70 % of its nodes carry). Each partitioner
runs once with ``K`` clients (seed 0); the target is under 60 s each.
"""

from __future__ import annotations

import argparse
import os
import platform
import time
from importlib.metadata import version
from pathlib import Path

import networkx as nx
import numpy as np
import torch
from torch_geometric.data import Data

from fglrepro.partition.build import PartitionSpec, build_partition
from fglrepro.partition.partitioners import PARTITIONERS
from fglrepro.partition.stats import partition_stats

REPO = Path(__file__).resolve().parents[1]
TARGET_S = 60.0


def planted_partition(
    num_nodes: int = 169_343, num_edges: int = 1_200_000, num_communities: int = 400,
    num_classes: int = 40, p_in: float = 0.8, seed: int = 0,
) -> Data:
    """Undirected planted-partition graph ``edge_index [2, ~2 * num_edges]`` with labels ``y [N]``."""
    rng = np.random.default_rng(seed)
    sizes = rng.multinomial(num_nodes - num_communities, rng.dirichlet(np.full(num_communities, 1.0))) + 1
    community = np.repeat(np.arange(num_communities), sizes)
    starts = np.cumsum(sizes) - sizes
    weight = rng.pareto(2.5, num_nodes) + 1.0
    draws = int(num_edges * 1.02)
    src = rng.choice(num_nodes, draws, p=weight / weight.sum())
    inside = rng.random(draws) < p_in
    c = community[src]
    same_community = starts[c] + (rng.random(draws) * sizes[c]).astype(np.int64)
    dst = np.where(inside, same_community, rng.integers(0, num_nodes, draws))
    low, high = np.minimum(src, dst), np.maximum(src, dst)
    keys = np.unique(low[low != high] * num_nodes + high[low != high])
    row, col = keys // num_nodes, keys % num_nodes
    edge_index = torch.from_numpy(np.stack([np.concatenate([row, col]), np.concatenate([col, row])]))
    dominant = rng.integers(0, num_classes, num_communities)[community]
    y = np.where(rng.random(num_nodes) < 0.7, dominant, rng.integers(0, num_classes, num_nodes))
    data = Data(edge_index=edge_index, y=torch.from_numpy(y), num_nodes=num_nodes)
    data.num_classes = num_classes
    return data


def networkx_louvain(data: Data) -> list[set]:
    """The replaced implementation (networkx, pure Python), timed for reference."""
    graph = nx.Graph()
    graph.add_nodes_from(range(data.num_nodes))
    graph.add_edges_from(data.edge_index.t().tolist())
    return nx.community.louvain_communities(graph, seed=0)


def timed(fn, *args, **kwargs) -> tuple[float, object]:
    start = time.perf_counter()
    result = fn(*args, **kwargs)
    return time.perf_counter() - start, result


def machine() -> str:
    try:
        model = next(line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name"))
    except (OSError, StopIteration):
        model = platform.machine()
    packages = ("torch", "igraph", "pymetis", "scikit-learn", "networkx")
    versions = ", ".join(f"{name} {version(name)}" for name in packages)
    return f"{model}, {os.cpu_count()} cores, Python {platform.python_version()}, {versions}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=10)
    parser.add_argument("--out", default=str(REPO / "benchmarks" / "PARTITION_SPEED.md"))
    args = parser.parse_args()

    gen_s, data = timed(planted_partition)
    num_edges = data.edge_index.size(1) // 2
    rows = []
    stats_part = None
    for name in sorted(PARTITIONERS):
        spec = PartitionSpec(name, "stratified", 0.6, 0.2)
        seconds, part = timed(build_partition, data, spec, args.clients, 0)
        sizes = [n.numel() for n in part.client_nodes]
        rows.append((f"`{name}`", seconds, f"{min(sizes)}-{max(sizes)} nodes"))
        print(f"{name}: {seconds:.1f} s", flush=True)
        stats_part = part if name == "metis" else stats_part
    seconds, communities = timed(networkx_louvain, data)
    rows.append(("networkx Louvain (replaced by igraph; reference)", seconds, f"{len(communities)} communities"))
    print(f"networkx louvain: {seconds:.1f} s", flush=True)
    seconds, stats = timed(partition_stats, data, stats_part)
    rows.append(("`partition_stats` (metis clients)", seconds, f"clustering {stats['average']['clustering']:.3f}"))
    print(f"partition_stats: {seconds:.1f} s", flush=True)

    lines = [
        "# Partitioner speed on an ogbn-arxiv-sized graph",
        "",
        f"Produced by `benchmarks/partition_speed.py` on {time.strftime('%Y-%m-%d', time.gmtime())}.",
        f"Machine: {machine()}.",
        "",
        f"Graph: planted partition, {data.num_nodes:,} nodes, {num_edges:,} undirected edges, "
        f"{data.num_classes} labels (generated in {gen_s:.1f} s). K = {args.clients} clients, seed 0; "
        "each time is one `build_partition` call (partitioner + stratified 60/20/20 split), "
        f"target < {TARGET_S:.0f} s.",
        "",
        "| step | seconds | result | < 60 s |",
        "|---|---:|---|:-:|",
        *(f"| {name} | {s:.1f} | {what} | {'yes' if s < TARGET_S else 'no'} |" for name, s, what in rows),
        "",
    ]
    Path(args.out).write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
