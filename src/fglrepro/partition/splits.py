"""Train/validation/test splits: uniformly random (of the whole graph before partitioning,
or per client) and class-stratified (per client)."""

from __future__ import annotations

import torch
from torch import Tensor


def _counts(n: Tensor, train: float, val: float) -> tuple[Tensor, Tensor]:
    """Train and validation sizes for group sizes ``n``: ``floor(fraction * n)`` as in the
    FedTAD / OpenFGL code, so rounding leftovers go to test."""
    n_train = torch.floor(n.double() * train).long()
    n_val = torch.floor(n.double() * val).long().clamp(max=n - n_train)
    return n_train, n_val


def random_split(
    num_nodes: int, train: float, val: float, generator: torch.Generator
) -> tuple[Tensor, Tensor, Tensor]:
    """Uniformly random split of ``num_nodes`` nodes; the rest of train+val is test.

    Returns three disjoint boolean masks ``[num_nodes]``.
    """
    return stratified_split(torch.zeros(num_nodes, dtype=torch.long), train, val, generator)


def stratified_split(
    labels: Tensor, train: float, val: float, generator: torch.Generator
) -> tuple[Tensor, Tensor, Tensor]:
    """Class-stratified split: in every class, ``floor(train * n_c)`` nodes go to train,
    ``floor(val * n_c)`` to validation and the remainder to test.

    Classes too small to stratify simply get fewer (possibly zero) nodes in a part.

    Args:
        labels: ``[n]`` class ids.
    Returns:
        three disjoint boolean masks ``[n]`` covering every node.
    """
    n = labels.numel()
    perm = torch.randperm(n, generator=generator)
    order = perm[torch.argsort(labels[perm], stable=True)]
    sorted_labels = labels[order]
    class_sizes = torch.bincount(sorted_labels)
    starts = torch.cumsum(class_sizes, 0) - class_sizes
    rank = torch.arange(n) - starts[sorted_labels]
    n_train, n_val = _counts(class_sizes, train, val)
    part = torch.full((n,), 2, dtype=torch.long)
    part[rank < n_train[sorted_labels] + n_val[sorted_labels]] = 1
    part[rank < n_train[sorted_labels]] = 0
    node_part = torch.empty_like(part)
    node_part[order] = part
    return node_part == 0, node_part == 1, node_part == 2
