"""Node-to-client partitioners: each maps a graph to K client node lists, seeded.

A partitioner is ``fn(edge_index, num_nodes, num_clients, seed, **options) -> list[Tensor]``
returning one sorted LongTensor of node ids per client. Register new ones in
:data:`PARTITIONERS`.
"""

from __future__ import annotations

from typing import Callable

import networkx as nx
import numpy as np
import pymetis
import torch
from torch import Tensor

from fglrepro.config import ConfigError


def _to_networkx(edge_index: Tensor, num_nodes: int) -> nx.Graph:
    graph = nx.Graph()
    graph.add_nodes_from(range(num_nodes))
    graph.add_edges_from(edge_index.t().tolist())
    return graph


def _membership_to_lists(membership: np.ndarray, num_clients: int) -> list[Tensor]:
    membership = torch.as_tensor(membership, dtype=torch.long)
    order = torch.argsort(membership, stable=True)
    counts = torch.bincount(membership, minlength=num_clients)
    if (counts == 0).any():
        empty = torch.nonzero(counts == 0).view(-1).tolist()
        raise RuntimeError(f"partition left clients {empty} empty; use fewer clients")
    return list(torch.split(order, counts.tolist()))


def balanced_community_assignment(
    communities: list[np.ndarray], num_nodes: int, num_clients: int, delta: int
) -> np.ndarray:
    """Assign communities to clients of about N/K nodes (FedSage+ / FedTAD rule).

    Communities larger than ``N // K - delta`` are cut into chunks of that size; chunks
    are then taken largest first and given to the current client as long as it stays
    below ``N // K + delta`` nodes, moving round-robin to the next client otherwise;
    clients holding ``N // K`` nodes or more take no further chunk.

    Args:
        communities: node-id arrays, one per community, covering every node once.
    Returns:
        membership ``[N]``: client id of every node.
    """
    capacity = num_nodes // num_clients
    max_chunk = capacity - delta
    if max_chunk < 1:
        raise ConfigError(
            f"louvain delta={delta} leaves no room for {num_clients} clients of "
            f"{capacity} nodes; lower delta or the number of clients"
        )
    chunks = [c[i : i + max_chunk] for c in communities for i in range(0, len(c), max_chunk)]
    chunks.sort(key=len, reverse=True)
    membership = np.full(num_nodes, -1, dtype=np.int64)
    sizes = np.zeros(num_clients, dtype=np.int64)
    open_clients = list(range(num_clients))
    cursor = 0
    for chunk in chunks:
        open_clients = [k for k in open_clients if sizes[k] < capacity]
        if not open_clients:
            owner = int(np.argmin(sizes))
        else:
            cursor %= len(open_clients)
            for step in range(len(open_clients)):
                position = (cursor + step) % len(open_clients)
                if sizes[open_clients[position]] + len(chunk) < capacity + delta:
                    break
            else:
                position = int(np.argmin(sizes[open_clients]))
            cursor = position
            owner = open_clients[position]
        membership[chunk] = owner
        sizes[owner] += len(chunk)
    return membership


def louvain(
    edge_index: Tensor, num_nodes: int, num_clients: int, seed: int, delta: int = 20,
    resolution: float = 1.0,
) -> list[Tensor]:
    """Louvain communities balanced into ``num_clients`` clients (FedSage+ assignment)."""
    graph = _to_networkx(edge_index, num_nodes)
    communities = nx.community.louvain_communities(graph, resolution=resolution, seed=seed)
    communities = [np.sort(np.fromiter(c, dtype=np.int64)) for c in communities]
    communities.sort(key=lambda c: int(c[0]))
    membership = balanced_community_assignment(communities, num_nodes, num_clients, delta)
    return _membership_to_lists(membership, num_clients)


def metis(edge_index: Tensor, num_nodes: int, num_clients: int, seed: int) -> list[Tensor]:
    """METIS k-way partition (pymetis) into ``num_clients`` disjoint parts."""
    row, col = edge_index
    keep = row != col
    row, col = row[keep], col[keep]
    order = torch.argsort(row * num_nodes + col)
    row, col = row[order], col[order]
    xadj = torch.zeros(num_nodes + 1, dtype=torch.long)
    xadj[1:] = torch.cumsum(torch.bincount(row, minlength=num_nodes), 0)
    _, membership = pymetis.part_graph(
        num_clients,
        adjacency=pymetis.CSRAdjacency(xadj.numpy(), col.numpy()),
        options=pymetis.Options(seed=seed),
    )
    return _membership_to_lists(np.asarray(membership), num_clients)


PARTITIONERS: dict[str, Callable[..., list[Tensor]]] = {"louvain": louvain, "metis": metis}


def get_partitioner(name: str) -> Callable[..., list[Tensor]]:
    """Look up a partitioner by name; an unknown name lists the valid ones."""
    if name not in PARTITIONERS:
        raise ConfigError(f"unknown partitioner {name!r}; valid partitioners: {sorted(PARTITIONERS)}")
    return PARTITIONERS[name]
