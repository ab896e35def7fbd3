"""Class prototypes: per-class mean embeddings of a client and their sample-weighted average on
the server (FedProto, Tan et al., AAAI 2022; also the basis of FedTGP and FedPPN)."""

from __future__ import annotations

import torch
from torch import Tensor


def class_prototypes(hidden: Tensor, labels: Tensor, num_classes: int) -> tuple[Tensor, Tensor, Tensor]:
    """Mean of the rows of ``hidden [n, d]`` per class of ``labels [n]``.

    Returns ``(classes [m], prototypes [m, d], counts [m])`` for the m classes present in
    ``labels`` (ascending), ``counts`` as float.
    """
    counts = torch.bincount(labels, minlength=num_classes)
    classes = counts.nonzero().flatten()
    sums = hidden.new_zeros(num_classes, hidden.size(1)).index_add_(0, labels, hidden)
    present = counts[classes].to(hidden.dtype)
    return classes, sums[classes] / present.unsqueeze(1), present


def average_prototypes(
    parts: list[tuple[Tensor, Tensor, Tensor]], num_classes: int, dim: int,
) -> tuple[Tensor, Tensor]:
    """Server step of FedProto: ``p_c = sum_k n_k^c p_k^c / sum_k n_k^c`` over the clients that
    report class c, from the clients' ``(classes, prototypes, counts)`` of :func:`class_prototypes`.

    Returns ``(prototypes [C, dim], present [C] bool)``; rows of classes no client reports are 0.
    """
    sums = torch.zeros(num_classes, dim, dtype=torch.float64)
    totals = torch.zeros(num_classes, dtype=torch.float64)
    for classes, prototypes, counts in parts:
        classes, counts = classes.cpu(), counts.cpu().to(torch.float64)
        sums.index_add_(0, classes, counts.unsqueeze(1) * prototypes.cpu().to(torch.float64))
        totals.index_add_(0, classes, counts)
    present = totals > 0
    sums[present] /= totals[present].unsqueeze(1)
    return sums.to(torch.float32), present
