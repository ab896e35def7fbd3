"""Perturbed views of a client graph: random edge removal and feature-column masking (the
weak and strong views of FGSSL's code and FedGKC's self-distillation)."""

from __future__ import annotations

import torch
from torch import Tensor

from fglrepro.fl.clients import ClientData, normalized_adjacency
from fglrepro.models import share_sparsity


def drop_edges(edge_index: Tensor, p: float) -> Tensor:
    """``edge_index [2, E]`` with each (directed) edge removed independently with
    probability ``p`` (PyG's ``dropout_edge`` without ``force_undirected``)."""
    return edge_index[:, torch.rand(edge_index.size(1), device=edge_index.device) >= p]


def mask_features(x: Tensor, p: float) -> Tensor:
    """``x [n, F]`` with each feature column set to 0 independently with probability ``p``
    (its non-zeros within ``x``'s, so the fast kernels reuse ``x``'s sparse pattern)."""
    return share_sparsity(x * (torch.rand(x.size(1), device=x.device) >= p).to(x.dtype), x)


def perturbed_view(client: ClientData, edge_drop: float, feature_mask: float) -> tuple[Tensor, Tensor]:
    """A fresh random view of ``client``'s graph: masked features ``[n, F]`` and the
    normalised adjacency ``[n, n]`` of the kept edges."""
    edges = drop_edges(client.edge_index, edge_drop)
    return mask_features(client.x, feature_mask), normalized_adjacency(edges, client.num_nodes)
