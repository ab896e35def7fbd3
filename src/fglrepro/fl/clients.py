"""Client subgraphs as the methods see them."""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import torch
from torch import Tensor
from torch_geometric.data import Data
from torch_geometric.nn.conv.gcn_conv import gcn_norm

from fglrepro.partition.build import Partition


@dataclass
class ClientData:
    """One client's local graph, on the training device.

    Attributes:
        x: ``[n, F]`` node features.
        y: ``[n]`` labels.
        edge_index: ``[2, E]`` local edges (empty for graphless clients).
        adj: ``[n, n]`` sparse CSR, symmetric GCN normalisation of ``A + I``.
        train_mask, val_mask, test_mask: ``[n]`` boolean.
        global_ids: ``[n]`` node ids in the whole graph.
        num_classes: C of the whole dataset.
    """

    x: Tensor
    y: Tensor
    edge_index: Tensor
    adj: Tensor
    train_mask: Tensor
    val_mask: Tensor
    test_mask: Tensor
    global_ids: Tensor
    num_classes: int

    @property
    def num_nodes(self) -> int:
        return self.x.size(0)


def normalized_adjacency(edge_index: Tensor, num_nodes: int) -> Tensor:
    """``D^-1/2 (A + I) D^-1/2`` as a sparse CSR tensor ``[n, n]``."""
    edge_index, weight = gcn_norm(edge_index, None, num_nodes, add_self_loops=True)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Sparse (CSR tensor support|invariant checks)")
        adj = torch.sparse_coo_tensor(edge_index, weight, (num_nodes, num_nodes))
        return adj.coalesce().to_sparse_csr()


def build_clients(data: Data, partition: Partition, device: torch.device) -> list[ClientData]:
    """Induced subgraph of every client (edges hidden for graphless clients)."""
    clients = []
    for k, nodes in enumerate(partition.client_nodes):
        edge_index = partition.client_edges(k, data.edge_index)
        n = nodes.numel()
        clients.append(
            ClientData(
                x=data.x[nodes].to(device),
                y=data.y[nodes].to(device),
                edge_index=edge_index.to(device),
                adj=normalized_adjacency(edge_index, n).to(device),
                train_mask=partition.train_mask[k].to(device),
                val_mask=partition.val_mask[k].to(device),
                test_mask=partition.test_mask[k].to(device),
                global_ids=nodes.to(device),
                num_classes=data.num_classes,
            )
        )
    return clients
