"""Structural node descriptors computed on a client's graph, sparse and vectorised."""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp
import torch
from torch import Tensor


def return_probabilities(
    edge_index: Tensor, num_nodes: int, walk_length: int, block_size: int = 4096,
) -> Tensor:
    """Random-walk return probabilities ``[T^1_ii, ..., T^p_ii]`` for every node.

    ``T = Â D̂^-1`` is the transition matrix of ``Â = A + I`` (self-loops keep isolated
    nodes defined). ``diag(T^p)`` equals ``diag(S^p)`` for the symmetric
    ``S = D̂^-1/2 Â D̂^-1/2`` (a similarity transform), and for symmetric ``S``,
    ``(S^p)_ii = sum_j (S^a)_ij (S^b)_ij`` with ``a = ceil(p/2)``, ``b = floor(p/2)``. Rows
    of ``S^1 .. S^ceil(p/2)`` are built block by block, so memory is bounded by one block
    of ``S^ceil(p/2)`` rows; no dense ``N x N`` matrix is formed.

    Args:
        edge_index: ``[2, E]`` undirected edges (both directions present).
        num_nodes: N.
        walk_length: p >= 1.
        block_size: rows per block.

    Returns:
        ``[N, p]`` float tensor; column ``t - 1`` holds ``T^t_ii``.
    """
    if walk_length < 1:
        raise ValueError(f"walk_length must be >= 1, got {walk_length}")
    row, col = edge_index.cpu().numpy()
    keep = row != col
    adj = sp.csr_matrix(
        (np.ones(int(keep.sum()), dtype=np.float64), (row[keep], col[keep])), shape=(num_nodes, num_nodes)
    )
    adj.data[:] = 1.0
    adj = (adj + sp.identity(num_nodes, format="csr")).tocsr()
    inv_sqrt = 1.0 / np.sqrt(np.asarray(adj.sum(axis=1)).ravel())
    sym = sp.diags(inv_sqrt) @ adj @ sp.diags(inv_sqrt)
    sym = sym.tocsr()
    half = (walk_length + 1) // 2
    out = np.empty((num_nodes, walk_length), dtype=np.float64)
    for start in range(0, num_nodes, block_size):
        stop = min(start + block_size, num_nodes)
        eye = sp.identity(num_nodes, format="csr")[start:stop]
        powers = [eye, sym[start:stop]]
        for _ in range(half - 1):
            powers.append((powers[-1] @ sym).tocsr())
        for p in range(1, walk_length + 1):
            a, b = (p + 1) // 2, p // 2
            out[start:stop, p - 1] = np.asarray(powers[a].multiply(powers[b]).sum(axis=1)).ravel()
    return torch.from_numpy(out).float()


def sampled_walk_ids(edge_index: Tensor, num_nodes: int, walk_length: int, generator: torch.Generator) -> Tensor:
    """The topology embedding of the FedTAD authors' code (``cal_topo_emb``): for every node
    and every length ``l = 1 .. walk_length`` the ids of an ``l``-node "random walk" from it,
    concatenated: ``[N, walk_length (walk_length + 1) / 2]`` floats.

    The code's transition matrix ``A ⊙ pinv(D)`` (element-wise, ``A`` with self-loops) keeps
    only the diagonal ``1 / d_i``, and each step draws from a softmax over that row: it stays
    at node i with probability ``e^{1/d_i} / (e^{1/d_i} + N - 1)`` and otherwise moves to a
    uniformly drawn other node. This draws from that distribution directly (vectorised over
    start nodes), not with the code's per-node ``torch.multinomial`` calls.
    """
    degree = torch.bincount(edge_index[0][edge_index[0] != edge_index[1]], minlength=num_nodes).double() + 1.0
    stay = torch.exp(1.0 / degree) / (torch.exp(1.0 / degree) + num_nodes - 1)
    columns = []
    for length in range(1, walk_length + 1):
        current = torch.arange(num_nodes)
        columns.append(current)
        for _ in range(length - 1):
            moves = torch.rand(num_nodes, generator=generator, dtype=torch.float64) >= stay[current]
            other = torch.randint(num_nodes - 1, (num_nodes,), generator=generator)
            other = other + (other >= current).long()
            current = torch.where(moves, other, current)
            columns.append(current)
    return torch.stack(columns, dim=1).float()


def degree_one_hot(edge_index: Tensor, num_nodes: int, dim: int) -> Tensor:
    """``[N, dim]`` one-hot node degree (neighbours other than the node itself), degrees of
    ``dim - 1`` or more in the last column (FedStar's degree encoding)."""
    row, col = edge_index
    degree = torch.bincount(row[row != col], minlength=num_nodes).clamp(max=dim - 1)
    return torch.nn.functional.one_hot(degree, dim).float()


def structure_encoding(edge_index: Tensor, num_nodes: int, walk_length: int = 16, degree_dim: int = 16) -> Tensor:
    """FedStar's structure encoding (Tan et al., AAAI 2023): random-walk return probabilities
    of lengths 1..``walk_length`` (:func:`return_probabilities`, on ``A + I``) next to the
    one-hot degree, ``[N, walk_length + degree_dim]``."""
    return torch.cat([return_probabilities(edge_index, num_nodes, walk_length),
                      degree_one_hot(edge_index.cpu(), num_nodes, degree_dim)], dim=1)
