"""Perturbed views of a client graph: edge removal and feature masking (GRACE-style, as
FGSSL's code draws its weak and strong views: ``EdgeRemoving(pe)`` + ``FeatureMasking(pf)``)."""

from __future__ import annotations

import torch
from torch import Tensor

from fglrepro.fl.clients import ClientData, normalized_adjacency


def drop_edges(edge_index: Tensor, p: float) -> Tensor:
    """``edge_index [2, E]`` without each (directed) edge independently with probability ``p``
    (PyG ``dropout_adj`` / ``dropout_edge`` without ``force_undirected``)."""
    keep = torch.rand(edge_index.size(1), device=edge_index.device) >= p
    return edge_index[:, keep]


def mask_features(x: Tensor, p: float) -> Tensor:
    """``x [n, F]`` with each feature column zeroed independently with probability ``p``."""
    keep = torch.rand(x.size(1), device=x.device) >= p
    return x * keep.to(x.dtype)


def perturbed_view(client: ClientData, edge_drop: float, feature_mask: float) -> tuple[Tensor, Tensor]:
    """``(x [n, F], adj [n, n])``: masked features and the normalised adjacency of the kept
    edges of a fresh random view of ``client``'s graph."""
    edges = drop_edges(client.edge_index, edge_drop)
    return mask_features(client.x, feature_mask), normalized_adjacency(edges, client.num_nodes)
