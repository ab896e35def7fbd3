"""A partition read from a JSON file: clients' node ids and, optionally, their splits.

Format (that of the authors' partitions in ``shared/authors``)::

    {"dataset": "Cora", "num_nodes": 2708,
     "clients": [{"nodes": [...], "train": [...], "val": [...], "test": [...]}, ...]}

Node ids index the prepared graph; every node is in at most one client, every client holds
a node, and each client's ``train`` / ``val`` / ``test`` ids are disjoint subsets of its
``nodes`` (nodes in no split are allowed). ``dataset`` is informational.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from torch import Tensor

from fglrepro.config import ConfigError
from fglrepro.data import checksums
from fglrepro.data.graph import Graph

SPLITS = ("train", "val", "test")
SHOWN_IDS = 10
"""Bad ids an error message lists at most."""


def _ids(values: list[int], shown: int = SHOWN_IDS) -> str:
    """``values`` for an error message, the first ``shown`` of them."""
    values = sorted(values)
    more = f" ... ({len(values)} in all)" if len(values) > shown else ""
    return f"{values[:shown]}{more}"


def _id_tensor(values: object, where: str, path: Path) -> Tensor:
    """A list of integer node ids as a LongTensor ``[n]``; ``where`` names it in errors."""
    if not isinstance(values, list) or not all(isinstance(v, int) and not isinstance(v, bool) for v in values):
        raise ConfigError(f"{path}: {where} must be a list of integer node ids")
    return torch.tensor(values, dtype=torch.long)


def _check_nodes(nodes: Tensor, num_nodes: int, where: str, path: Path) -> None:
    """Ids in ``[0, num_nodes)``, each once."""
    bad = nodes[(nodes < 0) | (nodes >= num_nodes)]
    if bad.numel():
        raise ConfigError(f"{path}: {where} has ids outside [0, {num_nodes}): {_ids(bad.tolist())}")
    values, counts = torch.unique(nodes, return_counts=True)
    if (counts > 1).any():
        raise ConfigError(f"{path}: {where} lists ids more than once: {_ids(values[counts > 1].tolist())}")


def read_external(path: str | Path, num_nodes: int) -> list[dict[str, Tensor]]:
    """Read and validate a partition file for a graph of ``num_nodes`` nodes.

    Returns:
        per client, ``{"nodes": [n_k]}`` sorted node ids, plus ``train`` / ``val`` / ``test``
        sorted ids where the file gives them.
    Raises:
        ConfigError naming the file, the client and the bad ids.
    """
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"partition file {path} does not exist")
    try:
        document = json.loads(path.read_text())
    except json.JSONDecodeError as error:
        raise ConfigError(f"{path} is not valid JSON: {error}") from error
    if not isinstance(document, dict) or not isinstance(document.get("clients"), list) or not document["clients"]:
        raise ConfigError(f"{path}: expected an object with a non-empty list 'clients'")
    if document.get("num_nodes", num_nodes) != num_nodes:
        raise ConfigError(f"{path} is for a graph of {document['num_nodes']} nodes; this graph has {num_nodes}")
    clients, owner = [], torch.full((num_nodes,), -1, dtype=torch.long)
    for k, entry in enumerate(document["clients"]):
        if not isinstance(entry, dict):
            raise ConfigError(f"{path}: client {k} must be an object with 'nodes' and optional {list(SPLITS)}")
        nodes = _id_tensor(entry.get("nodes"), f"client {k} 'nodes'", path)
        if nodes.numel() == 0:
            raise ConfigError(f"{path}: client {k} has no nodes")
        _check_nodes(nodes, num_nodes, f"client {k} 'nodes'", path)
        shared = owner[nodes] >= 0
        if shared.any():
            raise ConfigError(
                f"{path}: client {k} shares nodes with client(s) {sorted(set(owner[nodes[shared]].tolist()))}: "
                f"{_ids(nodes[shared].tolist())}"
            )
        owner[nodes] = k
        client = {"nodes": torch.sort(nodes).values}
        for split in (s for s in SPLITS if s in entry):
            ids = _id_tensor(entry[split], f"client {k} {split!r}", path)
            _check_nodes(ids, num_nodes, f"client {k} {split!r}", path)
            outside = ids[owner[ids] != k]
            if outside.numel():
                raise ConfigError(f"{path}: client {k} {split!r} has ids outside the client: {_ids(outside.tolist())}")
            client[split] = torch.sort(ids).values
        _check_disjoint_splits(client, k, path)
        clients.append(client)
    return clients


def _check_disjoint_splits(client: dict[str, Tensor], k: int, path: Path) -> None:
    """No node of client ``k`` in two of its splits."""
    given = [s for s in SPLITS if s in client]
    for i, first in enumerate(given):
        for second in given[i + 1:]:
            both = client[first][torch.isin(client[first], client[second])]
            if both.numel():
                raise ConfigError(f"{path}: client {k} has ids in both {first!r} and {second!r}: {_ids(both.tolist())}")


def file_masks(path: str | Path, client_nodes: list[Tensor], num_nodes: int) -> tuple[list[Tensor], ...]:
    """Train, val and test masks per client from the file's splits, each ``[n_k]`` aligned
    with ``client_nodes``; a file without splits for every client raises ConfigError."""
    clients = read_external(path, num_nodes)
    missing = [k for k, client in enumerate(clients) if not all(s in client for s in SPLITS)]
    if missing:
        raise ConfigError(f"{path}: split mode 'file' needs {list(SPLITS)} for every client; "
                          f"clients {missing} lack some")
    return tuple([torch.isin(nodes, c[s]) for nodes, c in zip(client_nodes, clients)] for s in SPLITS)


def external(data: Graph, num_clients: int, seed: int, path: str = "", sha256: str = "") -> list[Tensor]:
    """Clients read from the JSON file ``path`` (module docstring); the same for every seed.

    ``sha256``, when given, must be the file's digest (a partition pinned to one file version).
    """
    if not path:
        raise ConfigError("partitioner 'external' needs options.path, the partition file")
    if sha256 and Path(path).is_file() and checksums.sha256(path) != sha256:
        raise ConfigError(f"partition file {path} has SHA-256 {checksums.sha256(path)}, expected {sha256}")
    clients = read_external(path, data.num_nodes)
    if len(clients) != num_clients:
        raise ConfigError(f"{path} holds {len(clients)} clients; the study asks for {num_clients}")
    return [client["nodes"] for client in clients]
