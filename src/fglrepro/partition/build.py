"""A partition as data: client node lists, client split masks, graphless flags.

Written once per (dataset, scheme, clients, seed) and read by every method.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor
from torch_geometric.data import Data
from torch_geometric.utils import subgraph

from fglrepro.config import ConfigError, choice
from fglrepro.partition.partitioners import get_partitioner
from fglrepro.partition.splits import random_split, stratified_split

SPLIT_MODES = ("global", "stratified")


@dataclass(frozen=True)
class PartitionSpec:
    """How clients are simulated.

    Attributes:
        partitioner: registered partitioner name (``louvain``, ``metis``).
        options: extra keyword arguments of the partitioner (e.g. ``{"delta": 20}``).
        split: ``global`` (random split of the whole graph before partitioning) or
            ``stratified`` (per client, class-stratified).
        train, val: split fractions; test is the remainder.
    """

    partitioner: str
    split: str
    train: float
    val: float
    options: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        get_partitioner(self.partitioner)
        choice(self.split, SPLIT_MODES, "partition.split")
        if not (0 < self.train and 0 <= self.val and self.train + self.val <= 1):
            raise ConfigError(f"split fractions train={self.train}, val={self.val} are invalid")

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> "PartitionSpec":
        values = dict(values)
        split = values.pop("split")
        return cls(
            partitioner=values.pop("partitioner"),
            options=values.pop("options", {}) or {},
            split=split["mode"],
            train=float(split["train"]),
            val=float(split["val"]),
        )


@dataclass
class Partition:
    """Clients of one graph.

    Attributes:
        num_nodes: N of the whole graph.
        client_nodes: per client, sorted global node ids ``[n_k]``.
        train_mask, val_mask, test_mask: per client, boolean ``[n_k]`` aligned with
            ``client_nodes``.
        graphless: ``[K]`` bool, clients whose edges are hidden from methods.
    """

    num_nodes: int
    client_nodes: list[Tensor]
    train_mask: list[Tensor]
    val_mask: list[Tensor]
    test_mask: list[Tensor]
    graphless: Tensor

    @property
    def num_clients(self) -> int:
        return len(self.client_nodes)

    def client_edges(self, k: int, edge_index: Tensor) -> Tensor:
        """Edges of client ``k`` as methods see them: the induced subgraph relabelled to
        local ids ``[2, E_k]``, empty for a graphless client."""
        local, _ = subgraph(self.client_nodes[k], edge_index, relabel_nodes=True, num_nodes=self.num_nodes)
        return local[:, :0] if bool(self.graphless[k]) else local

    def save(self, path: str | Path) -> None:
        from fglrepro.io import atomic_torch_save

        atomic_torch_save(self.__dict__, path)

    @classmethod
    def load(cls, path: str | Path) -> "Partition":
        return cls(**torch.load(path, weights_only=True))


def build_partition(data: Data, spec: PartitionSpec, num_clients: int, seed: int) -> Partition:
    """Partition ``data`` into ``num_clients`` clients and split each client's nodes.

    Deterministic for a given seed: the partitioner and the split draw from it.
    """
    if num_clients < 1:
        raise ConfigError(f"clients must be >= 1, got {num_clients}")
    generator = torch.Generator().manual_seed(seed)
    partition_fn = get_partitioner(spec.partitioner)
    client_nodes = partition_fn(data.edge_index, data.num_nodes, num_clients, seed, **spec.options)
    if spec.split == "global":
        masks = random_split(data.num_nodes, spec.train, spec.val, generator)
        train, val, test = ([m[nodes] for nodes in client_nodes] for m in masks)
    else:
        per_client = [stratified_split(data.y[n], spec.train, spec.val, generator) for n in client_nodes]
        train, val, test = (list(m) for m in zip(*per_client))
    return Partition(
        num_nodes=data.num_nodes,
        client_nodes=client_nodes,
        train_mask=train,
        val_mask=val,
        test_mask=test,
        graphless=torch.zeros(len(client_nodes), dtype=torch.bool),
    )
