"""Class-wise feature statistics of clients and their pooling on the server (O-pFGL eqs. 4-8).

A client summarises each class ``c`` by its node count ``N_k^c``, the mean ``mu_k^c`` and the
unbiased variance ``s2_k^c`` of (propagated) node features. The server pools them by eq. 8

    N^c = sum_k N_k^c,   mu^c = sum_k N_k^c mu_k^c / N^c,
    s2^c = (sum_k (N_k^c - 1) s2_k^c + sum_k N_k^c (mu_k^c - mu^c)^2) / (N^c - m^c),

with ``m^c`` the number of clients reporting class ``c``. The same result follows from sums
alone (App. B, Alg. 1), which is what secure aggregation delivers: see :class:`ClassSums`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


def propagate_features(x: Tensor, adj: Tensor, hops: int) -> Tensor:
    """Eq. 4: ``[X, A X, ..., A^h X]`` concatenated, ``[n, (h+1) F]``; ``adj [n, n]`` is a
    normalised adjacency, sparse or dense."""
    blocks = [x]
    for _ in range(hops):
        blocks.append(adj @ blocks[-1])
    return torch.cat(blocks, dim=1)


@dataclass
class ClassStatistics:
    """Per-class summary of D-dimensional features (float64 unless sent over the wire).

    Attributes:
        count: ``[C]`` nodes per class N^c (0 for a class not summarised).
        mean: ``[C, D]`` class means (0 where count is 0).
        var: ``[C, D]`` unbiased class variances (0 where count is 0).
        clients: ``[C]`` number of clients that reported the class (m^c).
        labelled: ``[C]`` labelled (training) nodes per class, before any expansion.
    """

    count: Tensor
    mean: Tensor
    var: Tensor
    clients: Tensor
    labelled: Tensor


def class_statistics(
    features: Tensor, labels: Tensor, num_classes: int, labelled: Tensor, min_count: int = 2,
) -> ClassStatistics:
    """Eq. 5/7 on one client: statistics of ``features [n, D]`` grouped by ``labels [n]``;
    classes with fewer than ``min_count`` nodes are left out (count 0). ``labelled [C]``
    is passed through."""
    feats = features.detach().to(torch.float64)
    dim = feats.size(1)
    count = torch.zeros(num_classes, dtype=torch.float64)
    mean = torch.zeros(num_classes, dim, dtype=torch.float64)
    var = torch.zeros(num_classes, dim, dtype=torch.float64)
    for c in range(num_classes):
        rows = feats[labels == c]
        if rows.size(0) >= min_count:
            count[c] = rows.size(0)
            mean[c] = rows.mean(dim=0)
            var[c] = rows.var(dim=0, correction=1)
    return ClassStatistics(count, mean, var, (count > 0).to(torch.float64), labelled.to(torch.float64))


def pool_statistics(parts: list[ClassStatistics]) -> ClassStatistics:
    """Eq. 8: the server's pooled statistics from the clients' individual ones."""
    count = sum(p.count for p in parts)
    safe = count.clamp(min=1).unsqueeze(1)
    mean = sum(p.count.unsqueeze(1) * p.mean for p in parts) / safe
    spread = sum(
        (p.count - 1).clamp(min=0).unsqueeze(1) * p.var
        + p.count.unsqueeze(1) * (p.mean - mean) ** 2
        for p in parts
    )
    clients = sum(p.clients for p in parts)
    var = spread / (count - clients).clamp(min=1).unsqueeze(1)
    return ClassStatistics(count, mean, var, clients, sum(p.labelled for p in parts))


@dataclass
class ClassSums:
    """Additive form of :class:`ClassStatistics` (Alg. 1 line 4): summing it over clients
    and calling :func:`pool_sums` equals :func:`pool_statistics`.

    Attributes:
        count: ``[C]`` N^c (A in Alg. 1).
        clients: ``[C]`` 1 where the class is reported (sums to m^c).
        labelled: ``[C]`` labelled nodes per class.
        total: ``[C, D]`` N^c mu^c (B).
        within: ``[C, D]`` (N^c - 1) s2^c (C).
        square: ``[C, D]`` N^c (mu^c)^2 (D).
    """

    count: Tensor
    clients: Tensor
    labelled: Tensor
    total: Tensor
    within: Tensor
    square: Tensor

    @classmethod
    def of(cls, stats: ClassStatistics) -> ClassSums:
        n = stats.count.unsqueeze(1)
        return cls(stats.count, stats.clients, stats.labelled, n * stats.mean,
                   (n - 1).clamp(min=0) * stats.var, n * stats.mean**2)

    def to_vector(self) -> Tensor:
        """Flat ``[3 C + 3 C D]`` vector (the secure-aggregation payload)."""
        return torch.cat([self.count, self.clients, self.labelled,
                          self.total.flatten(), self.within.flatten(), self.square.flatten()])

    @classmethod
    def from_vector(cls, vector: Tensor, num_classes: int) -> ClassSums:
        """Inverse of :meth:`to_vector`."""
        c = num_classes
        dim = (vector.numel() - 3 * c) // (3 * c)
        heads = vector[: 3 * c].split(c)
        blocks = vector[3 * c:].view(3, c, dim)
        return cls(heads[0], heads[1], heads[2], blocks[0], blocks[1], blocks[2])


def pool_sums(sums: ClassSums) -> ClassStatistics:
    """Alg. 1 lines 29-33: pooled statistics from the summed :class:`ClassSums`.

    ``s2 = (within + square - total^2 / N) / (N - m)``.
    """
    count = sums.count.round()
    clients = sums.clients.round()
    safe = count.clamp(min=1).unsqueeze(1)
    mean = sums.total / safe
    between = sums.square - sums.total**2 / safe
    var = (sums.within + between) / (count - clients).clamp(min=1).unsqueeze(1)
    var = torch.where(count.unsqueeze(1) > 0, var.clamp(min=0), torch.zeros_like(var))
    return ClassStatistics(count, mean, var, clients, sums.labelled.round())
