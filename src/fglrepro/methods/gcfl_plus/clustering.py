"""Client clustering for clustered federated learning (GCFL / GCFL+, Xie et al., 2021).

Whether a cluster splits is Sattler et al.'s (CFL, 2020) rule on the members' updates
``dW [m, d]``: the federation is near a stationary point (``||mean_k dW_k|| < eps1``) while
some client is not (``max_k ||dW_k|| > eps2``); :func:`split_criterion`. A cluster that
splits is cut in two by a minimum cut (Stoer-Wagner) of the complete
graph whose edge weights are pairwise client similarities: the cosine similarity of
their model updates (GCFL), or the negated dynamic-time-warping distance between their
sequences of gradient norms (GCFL+).
"""

from __future__ import annotations

import networkx as nx
import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor


def cosine_similarity_matrix(vectors: Tensor) -> Tensor:
    """Pairwise cosine similarities ``[m, m]`` of the rows of ``vectors [m, d]``
    (a zero row has similarity 0 to every row)."""
    unit = F.normalize(vectors.double(), dim=1)
    return unit @ unit.T


def _batched_dtw(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """DTW distances of ``P`` pairs at once: ``a [P, La]``, ``b [P, Lb]`` -> ``[P]``.

    The warping path minimises the sum of squared differences; the distance is its
    square root (the definition of ``dtaidistance.dtw.distance`` used by the GCFL code).
    """
    cost = (a[:, :, None] - b[:, None, :]) ** 2
    pairs, la, lb = cost.shape
    acc = np.full((pairs, la + 1, lb + 1), np.inf)
    acc[:, 0, 0] = 0.0
    for i in range(1, la + 1):
        for j in range(1, lb + 1):
            best = np.minimum(np.minimum(acc[:, i - 1, j], acc[:, i, j - 1]), acc[:, i - 1, j - 1])
            acc[:, i, j] = cost[:, i - 1, j - 1] + best
    return np.sqrt(acc[:, la, lb])


def dtw_distance(a: np.ndarray, b: np.ndarray) -> float:
    """DTW distance between two 1-D sequences (lengths may differ)."""
    a = np.asarray(a, dtype=np.float64)[None, :]
    b = np.asarray(b, dtype=np.float64)[None, :]
    return float(_batched_dtw(a, b)[0])


def dtw_distance_matrix(sequences: np.ndarray) -> np.ndarray:
    """Symmetric DTW distances ``[m, m]`` (zero diagonal) of ``m`` equal-length
    sequences ``[m, L]``; all pairs are computed in one vectorised pass."""
    seqs = np.asarray(sequences, dtype=np.float64)
    m = seqs.shape[0]
    rows, cols = np.triu_indices(m, k=1)
    out = np.zeros((m, m))
    out[rows, cols] = out[cols, rows] = _batched_dtw(seqs[rows], seqs[cols])
    return out


def min_cut_bipartition(similarity: np.ndarray) -> tuple[list[int], list[int]]:
    """Split ``m >= 2`` items into two groups by a Stoer-Wagner minimum cut of the
    complete graph weighted by ``similarity [m, m]`` (symmetric, non-negative).

    Returns the two groups as sorted index lists, the one holding item 0 first.
    """
    m = len(similarity)
    if m < 2:
        raise ValueError(f"a bi-partition needs at least 2 items, got {m}")
    graph = nx.Graph()
    graph.add_nodes_from(range(m))
    for i in range(m):
        for j in range(i + 1, m):
            graph.add_edge(i, j, weight=float(similarity[i][j]))
    _, (first, second) = nx.stoer_wagner(graph)
    first, second = sorted(first), sorted(second)
    return (first, second) if 0 in first else (second, first)


def bipartition_by_updates(updates: Tensor) -> tuple[list[int], list[int]]:
    """GCFL: min-cut on cosine similarity + 1 (in ``[0, 2]``) of updates ``[m, d]``."""
    return min_cut_bipartition((cosine_similarity_matrix(updates) + 1.0).numpy())


def bipartition_by_sequences(
    sequences: np.ndarray, standardize: bool = False,
) -> tuple[list[int], list[int]]:
    """GCFL+: min-cut on ``max(D) - D`` for the DTW distances ``D`` of the rows of
    ``sequences [m, L]``; ``standardize`` divides each sequence by its standard
    deviation first (to compare trends only)."""
    seqs = np.asarray(sequences, dtype=np.float64)
    if standardize:
        seqs = seqs / np.maximum(seqs.std(axis=1, keepdims=True), np.finfo(np.float64).tiny)
    distances = dtw_distance_matrix(seqs)
    return min_cut_bipartition(distances.max() - distances)


def update_norms(updates: Tensor) -> tuple[float, float]:
    """``(||mean_k dW_k||, max_k ||dW_k||)`` of the rows of ``updates [m, d]`` (plain mean, as in
    the GCFL code)."""
    return float(updates.mean(dim=0).norm()), float(updates.norm(dim=1).max())


def split_criterion(updates: Tensor, eps1: float, eps2: float, scale: float = 1.0) -> bool:
    """GCFL's rule on updates ``[m, d]``: ``||mean dW|| < eps1 * scale`` and
    ``max ||dW|| > eps2 * scale``. ``scale`` 1 gives the absolute thresholds of the GCFL code; a
    reference update norm (e.g. round 1's mean ``||dW_k||``) makes them relative, so the rule does
    not change when every update is multiplied by the same constant."""
    mean_norm, max_norm = update_norms(updates)
    return mean_norm < eps1 * scale and max_norm > eps2 * scale


def flatten_update(update: dict[str, Tensor]) -> Tensor:
    """All tensors of a named update concatenated into one vector ``[d]``."""
    return torch.cat([t.reshape(-1) for t in update.values()])
