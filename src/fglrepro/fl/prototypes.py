"""Class prototypes: the knowledge carrier of prototype-based heterogeneous FL (FedTGP, FedPPN).

A client summarises class ``c`` by the mean ``p_k^c`` of the hidden embeddings (the input of
the linear head, one common width ``d`` for every architecture) of its training nodes of
that class; a class without training nodes is not reported. The server combines the clients'
prototypes class by class over the clients that report the class.
"""

from __future__ import annotations

from typing import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fglrepro.fl.clients import ClientData


def class_prototypes(hidden: Tensor, labels: Tensor, mask: Tensor, num_classes: int) -> tuple[Tensor, Tensor]:
    """Per-class means of the rows of ``hidden [n, d]`` selected by ``mask [n]``, grouped by
    ``labels [n]``.

    Returns ``(prototypes [C, d], counts [C])``; a class without selected rows has count 0
    and a zero prototype.
    """
    rows, classes = hidden[mask], labels[mask]
    counts = torch.bincount(classes, minlength=num_classes).to(hidden.dtype)
    sums = torch.zeros(num_classes, hidden.size(1), dtype=hidden.dtype, device=hidden.device)
    sums.index_add_(0, classes, rows)
    return sums / counts.clamp(min=1).unsqueeze(1), counts


@torch.no_grad()
def client_prototypes(model: nn.Module, client: ClientData) -> tuple[Tensor, Tensor]:
    """:func:`class_prototypes` of the client's training nodes from ``model``'s hidden
    embeddings in evaluation mode: ``([C, d], counts [C])``."""
    model.eval()
    hidden = model(client.x, client.adj, return_hidden=True)[0]
    return class_prototypes(hidden, client.y, client.train_mask, client.num_classes)


def average_prototypes(
    prototypes: Sequence[Tensor], counts: Sequence[Tensor], weights: Sequence[float] | None = None,
) -> tuple[Tensor, Tensor]:
    r"""Global prototypes from K clients' ``prototypes`` (each ``[C, d]``) and ``counts``
    (each ``[C]``):

    .. math:: \bar p^c = \frac{\sum_{k: N_k^c > 0} w_k p_k^c}{\sum_{k: N_k^c > 0} w_k},

    with ``weights`` ``w_k`` (``None``: 1 per client, the plain mean over the clients that
    report the class, as FedPPN's and FedTGP's servers compute it).

    Returns ``(global prototypes [C, d], present [C] bool)``; a class no client reports is
    not present and has a zero prototype.
    """
    stacked = torch.stack(list(prototypes))                       # [K, C, d]
    reports = torch.stack(list(counts)) > 0                       # [K, C]
    w = torch.ones(len(prototypes)) if weights is None else torch.as_tensor(weights, dtype=torch.float64)
    w = reports.to(torch.float64) * w.to(torch.float64).unsqueeze(1)  # [K, C]
    total = w.sum(dim=0)                                          # [C]
    mean = (w.unsqueeze(2) * stacked.to(torch.float64)).sum(dim=0) / total.clamp(min=1e-300).unsqueeze(1)
    return mean.to(stacked.dtype), total > 0


def prototype_alignment_loss(hidden: Tensor, labels: Tensor, mask: Tensor, prototypes: Tensor,
                             present: Tensor) -> Tensor:
    r"""OpenFGL's FedProto / FedTGP regulariser: the sum over classes ``c`` with a global
    prototype of the mean squared error between the embeddings of the client's selected
    nodes of class ``c`` and ``\bar p^c``:

    .. math:: \sum_c \frac{1}{N^c d} \sum_{i: y_i = c} \lVert h_i - \bar p^c \rVert^2.

    ``hidden [n, d]``, ``labels [n]``, ``mask [n]``, ``prototypes [C, d]``, ``present [C]``.
    """
    rows, classes = hidden[mask], labels[mask]
    keep = present[classes]
    rows, classes = rows[keep], classes[keep]
    if classes.numel() == 0:
        return hidden.sum() * 0.0
    errors = (rows - prototypes[classes]).pow(2).mean(dim=1)       # [m] per-node MSE
    counts = torch.bincount(classes, minlength=prototypes.size(0)).to(errors.dtype)
    return (errors / counts[classes]).sum()


def margin_contrastive_loss(hidden: Tensor, labels: Tensor, prototypes: Tensor, margin: float) -> Tensor:
    """FedTGP's adaptive-margin-enhanced contrastive loss: cross-entropy of the scores
    ``-(||h_i - p_c|| + margin * 1[c = y_i])`` (the own class's distance is enlarged by the
    margin); ``hidden [m, d]``, ``labels [m]``, ``prototypes [C, d]``."""
    distance = torch.cdist(hidden, prototypes) + margin * F.one_hot(labels, prototypes.size(0)).to(hidden.dtype)
    return F.cross_entropy(-distance, labels)


def pack_prototypes(prototypes: Tensor, counts: Tensor) -> dict[str, Tensor]:
    """What a client sends: the prototypes of the classes it has (``[C', d]``) and their
    class ids (``[C']``)."""
    classes = torch.nonzero(counts > 0).flatten()
    return {"prototypes": prototypes[classes], "classes": classes}


def unpack_prototypes(message: dict[str, Tensor], num_classes: int) -> tuple[Tensor, Tensor]:
    """Inverse of :func:`pack_prototypes`: ``(prototypes [C, d], reported [C])`` with zero
    rows and 0 for the classes not sent."""
    sent, classes = message["prototypes"], message["classes"]
    prototypes = sent.new_zeros(num_classes, sent.size(1))
    prototypes[classes] = sent
    reported = torch.zeros(num_classes, dtype=sent.dtype, device=sent.device)
    reported[classes] = 1.0
    return prototypes, reported
