"""A partition as data: client node lists, client split masks, graphless flags.

Written once per (dataset, scheme, clients, seed) by :mod:`fglrepro.partition.build` and
read by every method; this module needs only torch, so training processes load partitions
without importing the partitioners' libraries.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from torch import Tensor

from fglrepro.data.graph import induced_subgraph


@dataclass
class Partition:
    """Clients of one graph.

    Attributes:
        num_nodes: N of the whole graph.
        client_nodes: per client, sorted global node ids ``[n_k]``; clients may overlap
            (``metis_overlap``) or leave nodes out (``louvain_communities``).
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

    def true_edges(self, k: int, edge_index: Tensor) -> Tensor:
        """Client ``k``'s induced subgraph relabelled to local ids ``[2, E_k]``."""
        return induced_subgraph(self.client_nodes[k], edge_index, self.num_nodes)

    def client_edges(self, k: int, edge_index: Tensor) -> Tensor:
        """Edges of client ``k`` as methods see them: :meth:`true_edges`, empty for a
        graphless client."""
        local = self.true_edges(k, edge_index)
        return local[:, :0] if bool(self.graphless[k]) else local

    def save(self, path: str | Path) -> None:
        from fglrepro.io import atomic_torch_save

        atomic_torch_save(self.__dict__, path)

    @classmethod
    def load(cls, path: str | Path) -> "Partition":
        """Read a partition written by :meth:`save` (rule partition); a damaged file raises ``DamagedFileError``."""
        from fglrepro.io import load_torch

        return cls(**load_torch(path, "partition"))
