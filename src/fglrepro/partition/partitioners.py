"""Node-to-client partitioners: each maps a graph to K client node lists, seeded.

A partitioner is ``fn(data, num_clients, seed, **options) -> list[Tensor]``: ``data`` is a
prepared :class:`~fglrepro.data.graph.Graph` (``edge_index [2, E]`` undirected, ``y [N]``,
``num_nodes``, ``num_classes``); the result holds one sorted LongTensor of node ids per
client. Clients are disjoint and cover every node except for ``metis_overlap`` (clients of
one Metis part share nodes) and ``louvain_communities`` (nodes outside the K largest
communities are dropped). Every partitioner is deterministic for a given seed (``external``
reads a file and ignores it). Register
new ones in :data:`PARTITIONERS`.
"""

from __future__ import annotations

import random
import sys
from collections.abc import Callable
from types import ModuleType

import numpy as np
import torch
from torch import Tensor

from fglrepro.config import ConfigError, choice
from fglrepro.data.graph import Graph
from fglrepro.partition.external import external

KMEANS_N_INIT = 10
"""KMeans restarts of the label-imbalance partitioners (OpenFGL uses sklearn's default)."""


def _membership_to_lists(membership: np.ndarray | Tensor, num_clients: int) -> list[Tensor]:
    """Client id per node ``[N]`` (``-1``: dropped) -> sorted node ids per client."""
    membership = torch.as_tensor(membership, dtype=torch.long)
    kept = torch.nonzero(membership >= 0).view(-1)
    order = kept[torch.argsort(membership[kept], stable=True)]
    counts = torch.bincount(membership[kept], minlength=num_clients)
    if (counts == 0).any():
        empty = torch.nonzero(counts == 0).view(-1).tolist()
        raise ConfigError(f"partition left clients {empty} empty; use fewer than {num_clients} clients")
    return list(torch.split(order, counts.tolist()))


def _undirected_pairs(edge_index: Tensor) -> np.ndarray:
    """Each undirected edge once, self-loops dropped: ``[E', 2]`` with ``u < v``."""
    row, col = edge_index
    keep = row < col
    return torch.stack([row[keep], col[keep]], 1).numpy()


def import_igraph() -> ModuleType:
    """``igraph`` without its plotting back-end.

    ``import igraph`` imports ``matplotlib.pyplot`` whenever matplotlib is installed (for its
    drawing functions, which no partitioner uses): a third of a partition job's CPU. Unless
    matplotlib is loaded already, it is hidden while igraph loads (igraph then keeps a stub
    that raises on drawing) and visible again afterwards.
    """
    if "igraph" in sys.modules or "matplotlib" in sys.modules:
        import igraph

        return igraph
    sys.modules["matplotlib"] = None
    try:
        import igraph
    finally:
        del sys.modules["matplotlib"]
    return igraph


#: Louvain implementations: igraph's C ``community_multilevel`` (ours), or python-louvain's
#: ``best_partition``, which the FedTAD and O-pFGL authors' code vendors (``library`` option).
LOUVAIN_LIBRARIES = ("igraph", "python-louvain")


def louvain_membership(
    edge_index: Tensor, num_nodes: int, seed: int, resolution: float = 1.0, library: str = "igraph",
) -> np.ndarray:
    """Louvain communities from ``library`` (one of :data:`LOUVAIN_LIBRARIES`), seeded (the
    authors' code calls python-louvain unseeded).

    Communities are numbered by their smallest node id, so the numbering is canonical.

    Returns:
        community id of every node ``[N]``.
    """
    if library == "python-louvain":
        import community as python_louvain
        import networkx as nx

        graph = nx.Graph()
        graph.add_nodes_from(range(num_nodes))
        graph.add_edges_from(_undirected_pairs(edge_index).tolist())
        partition = python_louvain.best_partition(graph, resolution=resolution, random_state=seed)
        membership = np.array([partition[i] for i in range(num_nodes)])
    else:
        igraph = import_igraph()
        graph = igraph.Graph(n=num_nodes)
        graph.add_edges(_undirected_pairs(edge_index))
        igraph.set_random_number_generator(random.Random(seed))
        try:
            membership = np.asarray(graph.community_multilevel(resolution=resolution).membership)
        finally:
            igraph.set_random_number_generator(random)
    first_node = np.full(membership.max() + 1, num_nodes, dtype=np.int64)
    np.minimum.at(first_node, membership, np.arange(num_nodes))
    rank = np.empty_like(first_node)
    rank[np.argsort(first_node)] = np.arange(first_node.size)
    return rank[membership]


def _communities(membership: np.ndarray) -> list[np.ndarray]:
    """Community id per node ``[N]`` -> sorted node ids of every community, by id."""
    order = np.argsort(membership, kind="stable")
    return np.split(order, np.cumsum(np.bincount(membership))[:-1])


#: Orders in which the chunks of cut communities are walked before the stable largest-first sort:
#: ``authors`` (the FedTAD / O-pFGL code: round by round, the i-th chunk of every community, so
#: equal-size chunks alternate between communities) or ``community`` (community by community).
CHUNK_ORDERS = ("authors", "community")


def community_chunks(communities: list[np.ndarray], max_chunk: int, order: str = "authors") -> list[np.ndarray]:
    """Cut every community into consecutive chunks of at most ``max_chunk`` nodes and sort
    them largest first (stable), walking the chunks in ``order`` (one of :data:`CHUNK_ORDERS`).

    ``authors`` reproduces the authors' loop, which keeps the first ``max_chunk`` nodes of a
    long community and appends the rest to the end of the community list it is walking: the
    chunks come out by round (chunk index), communities in list order within a round.
    """
    choice(order, CHUNK_ORDERS, "partition.options.chunk_order")
    chunks = [(i // max_chunk, c[i : i + max_chunk]) for c in communities for i in range(0, len(c), max_chunk)]
    if order == "authors":
        chunks.sort(key=lambda indexed: indexed[0])
    return sorted((chunk for _, chunk in chunks), key=len, reverse=True)


def balanced_community_assignment(
    communities: list[np.ndarray], num_nodes: int, num_clients: int, delta: int, chunk_order: str = "authors",
) -> np.ndarray:
    """Assign communities to clients of about N/K nodes (FedSage+ / FedTAD rule).

    Communities larger than ``N // K - delta`` are cut into chunks of that size (see
    :func:`community_chunks` for their order); chunks are then taken largest first and given
    to the current client as long as it stays below ``N // K + delta`` nodes, moving
    round-robin to the next client otherwise; clients holding ``N // K`` nodes or more take
    no further chunk.

    Args:
        communities: node-id arrays, one per community, covering every node once.
        chunk_order: one of :data:`CHUNK_ORDERS`.
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
    chunks = community_chunks(communities, max_chunk, chunk_order)
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


def louvain_parts(
    data: Graph, num_parts: int, seed: int, delta: int, resolution: float, library: str = "igraph",
    chunk_order: str = "authors",
) -> np.ndarray:
    """Louvain communities balanced into ``num_parts`` parts; part id per node ``[N]``."""
    choice(library, LOUVAIN_LIBRARIES, "partition.options.library")
    communities = _communities(louvain_membership(data.edge_index, data.num_nodes, seed, resolution, library))
    return balanced_community_assignment(communities, data.num_nodes, num_parts, delta, chunk_order)


def metis_membership(edge_index: Tensor, num_nodes: int, num_parts: int, seed: int) -> np.ndarray:
    """METIS k-way partition (pymetis) into ``num_parts`` parts; part id per node ``[N]``."""
    if num_parts == 1:
        return np.zeros(num_nodes, dtype=np.int64)
    row, col = edge_index
    keep = row != col
    row, col = row[keep], col[keep]
    order = torch.argsort(row * num_nodes + col)
    row, col = row[order], col[order]
    xadj = torch.zeros(num_nodes + 1, dtype=torch.long)
    xadj[1:] = torch.cumsum(torch.bincount(row, minlength=num_nodes), 0)
    import pymetis

    _, membership = pymetis.part_graph(
        num_parts,
        adjacency=pymetis.CSRAdjacency(xadj.numpy(), col.numpy()),
        options=pymetis.Options(seed=seed),
    )
    return np.asarray(membership, dtype=np.int64)


def louvain(
    data: Graph, num_clients: int, seed: int, delta: int = 20, resolution: float = 1.0, library: str = "igraph",
    chunk_order: str = "authors",
) -> list[Tensor]:
    """Louvain communities balanced into ``num_clients`` clients (FedSage+ assignment)."""
    membership = louvain_parts(data, num_clients, seed, delta, resolution, library, chunk_order)
    return _membership_to_lists(membership, num_clients)


def metis(data: Graph, num_clients: int, seed: int) -> list[Tensor]:
    """METIS k-way partition (pymetis) into ``num_clients`` disjoint parts."""
    membership = metis_membership(data.edge_index, data.num_nodes, num_clients, seed)
    return _membership_to_lists(membership, num_clients)


def metis_overlap(
    data: Graph, num_clients: int, seed: int, clients_per_part: int = 5, ratio: float = 0.5
) -> list[Tensor]:
    """Overlapping clients (FED-PUB / FedGKD): Metis into ``K / clients_per_part`` parts,
    then every part yields ``clients_per_part`` clients, each an independent uniformly
    random ``floor(ratio * n_part)`` of the part's nodes (FED-PUB takes ``n_part // 2``).

    Clients are ordered part by part.
    """
    if clients_per_part < 1 or num_clients % clients_per_part:
        raise ConfigError(
            f"metis_overlap needs clients to be a multiple of clients_per_part={clients_per_part}, "
            f"got {num_clients}; e.g. {clients_per_part}, {2 * clients_per_part}, {3 * clients_per_part}, ..."
        )
    if not 0 < ratio <= 1:
        raise ConfigError(f"metis_overlap ratio={ratio} must lie in (0, 1]")
    num_parts = num_clients // clients_per_part
    parts = _membership_to_lists(metis_membership(data.edge_index, data.num_nodes, num_parts, seed), num_parts)
    generator = torch.Generator().manual_seed(seed)
    clients = []
    for part in parts:
        size = int(ratio * part.numel())
        for _ in range(clients_per_part):
            pick = torch.randperm(part.numel(), generator=generator)[:size]
            clients.append(torch.sort(part[pick]).values)
    return clients


def louvain_communities(data: Graph, num_clients: int, seed: int, resolution: float = 1.0) -> list[Tensor]:
    """FedGLS: each client is one Louvain community, the ``K`` largest ones (ties: the
    community with the smaller first node id wins); nodes of other communities are dropped.

    This rule reproduces FedGLS Table 4 on the full graphs (no LCC), whose "edges" count
    every undirected edge twice (``edge_index`` columns). Means over seeds 0-9, K = 8:
    Cora 194.8 nodes (per seed 188-204), 712 directed edges (688-754), Table 4: 192 / 695;
    CiteSeer 149.5 nodes (136-161), 533 directed edges (479-568), Table 4: 149 / 535.
    On the LCC, CiteSeer gives 129 nodes, so the paper partitioned the full graph.
    """
    membership = louvain_membership(data.edge_index, data.num_nodes, seed, resolution)
    sizes = np.bincount(membership)
    if sizes.size < num_clients:
        raise ConfigError(
            f"louvain_communities found only {sizes.size} communities, fewer than {num_clients} clients; "
            "use fewer clients or a higher resolution"
        )
    largest = np.argsort(-sizes, kind="stable")[:num_clients]
    client_of = np.full(sizes.size, -1, dtype=np.int64)
    client_of[largest] = np.arange(num_clients)
    return _membership_to_lists(client_of[membership], num_clients)


def community_label_histograms(membership: np.ndarray, y: Tensor, num_classes: int) -> np.ndarray:
    """Label distribution of every community ``[M, C]``, rows summing to one."""
    num_communities = int(membership.max()) + 1
    counts = np.bincount(membership * num_classes + y.numpy(), minlength=num_communities * num_classes)
    counts = counts.reshape(num_communities, num_classes).astype(np.float64)
    return counts / counts.sum(1, keepdims=True)


def cluster_communities(membership: np.ndarray, data: Graph, num_clients: int, seed: int) -> np.ndarray:
    """Label-imbalance split (OpenFGL Louvain+/Metis+): KMeans (``K`` clusters, seeded,
    ``KMEANS_N_INIT`` restarts) on the communities' normalised label histograms; every
    cluster becomes a client, so clients are unions of whole communities.

    Raises ConfigError if a cluster is empty (fewer distinct histograms than clients).

    Returns:
        client id of every node ``[N]``.
    """
    _, membership = np.unique(membership, return_inverse=True)
    histograms = community_label_histograms(membership, data.y, data.num_classes)
    if histograms.shape[0] < num_clients:
        raise ConfigError(
            f"{histograms.shape[0]} communities cannot form {num_clients} clients; "
            "raise num_communities or use fewer clients"
        )
    from sklearn.cluster import KMeans

    kmeans = KMeans(n_clusters=num_clients, n_init=KMEANS_N_INIT, random_state=seed)
    cluster = kmeans.fit_predict(histograms)
    empty = sorted(set(range(num_clients)) - set(cluster.tolist()))
    if empty:
        raise ConfigError(
            f"KMeans left clients {empty} empty: the communities have fewer distinct label "
            f"distributions than {num_clients} clients; use fewer clients or more communities"
        )
    return cluster[membership]


def louvain_plus(
    data: Graph, num_clients: int, seed: int, num_communities: int = 100, delta: int = 20,
    resolution: float = 1.0, library: str = "igraph", chunk_order: str = "authors",
) -> list[Tensor]:
    """O-pFGL Louvain+: Louvain balanced into ``num_communities`` parts (FedSage+ rule,
    ``delta``, ``chunk_order``), clustered by label distribution into ``num_clients`` clients.

    With the authors' chunk order (default) the ~``N // num_communities - delta``-node chunks of
    the large communities alternate, so most parts mix several communities; ``community`` makes
    each part (nearly) one community."""
    communities = louvain_parts(data, num_communities, seed, delta, resolution, library, chunk_order)
    return _membership_to_lists(cluster_communities(communities, data, num_clients, seed), num_clients)


def metis_plus(data: Graph, num_clients: int, seed: int, num_communities: int = 100) -> list[Tensor]:
    """O-pFGL Metis+: ``num_communities`` Metis parts clustered by label distribution into
    ``num_clients`` clients."""
    communities = metis_membership(data.edge_index, data.num_nodes, num_communities, seed)
    return _membership_to_lists(cluster_communities(communities, data, num_clients, seed), num_clients)


def dirichlet_assignment(
    y: Tensor, num_classes: int, shares: np.ndarray, rng: np.random.Generator
) -> np.ndarray:
    """Give every class's nodes to clients in proportions ``shares [C, K]`` (rows sum to
    one): in a random order of the class's ``n_c`` nodes, client ``k`` takes ranks
    ``[floor(n_c * S_{k-1}), floor(n_c * S_k))`` with ``S`` the cumulative shares.

    Returns:
        client id of every node ``[N]``.
    """
    labels = y.numpy()
    order = rng.permutation(labels.size)
    order = order[np.argsort(labels[order], kind="stable")]
    class_sizes = np.bincount(labels, minlength=num_classes)
    rank = np.arange(labels.size) - (np.cumsum(class_sizes) - class_sizes)[labels[order]]
    bounds = np.floor(np.cumsum(shares, 1)[:, :-1] * class_sizes[:, None])
    client = (rank[:, None] >= bounds[labels[order]]).sum(1)
    membership = np.empty_like(client)
    membership[order] = client
    return membership


def dirichlet(
    data: Graph, num_clients: int, seed: int, alpha: float = 0.2, min_size: int = 10, max_attempts: int = 1000
) -> list[Tensor]:
    """Label non-IID split (O-pFGL heterophilic datasets): per class, node shares over
    clients drawn from ``Dir(alpha)``; redrawn until every client has ``min_size`` nodes."""
    if alpha <= 0:
        raise ConfigError(f"dirichlet alpha={alpha} must be > 0")
    if min_size * num_clients > data.num_nodes:
        raise ConfigError(
            f"dirichlet min_size={min_size} x {num_clients} clients exceeds {data.num_nodes} nodes; "
            "lower min_size or the number of clients"
        )
    rng = np.random.default_rng(seed)
    for _ in range(max_attempts):
        shares = rng.dirichlet(np.full(num_clients, alpha), size=data.num_classes)
        membership = dirichlet_assignment(data.y, data.num_classes, shares, rng)
        if np.bincount(membership, minlength=num_clients).min() >= min_size:
            return _membership_to_lists(membership, num_clients)
    raise ConfigError(
        f"dirichlet: no draw in {max_attempts} attempts gave every one of {num_clients} clients "
        f">= {min_size} nodes; raise alpha, lower min_size or use fewer clients"
    )


PARTITIONERS: dict[str, Callable[..., list[Tensor]]] = {
    "louvain": louvain,
    "metis": metis,
    "metis_overlap": metis_overlap,
    "louvain_communities": louvain_communities,
    "louvain_plus": louvain_plus,
    "metis_plus": metis_plus,
    "dirichlet": dirichlet,
    "external": external,
}


def get_partitioner(name: str) -> Callable[..., list[Tensor]]:
    """Look up a partitioner by name; an unknown name lists the valid ones."""
    if name not in PARTITIONERS:
        raise ConfigError(f"unknown partitioner {name!r}; valid partitioners: {sorted(PARTITIONERS)}")
    return PARTITIONERS[name]
