"""Class prototypes: per-class mean embeddings of a client and their weighted average on the
server (FedProto, Tan et al., AAAI 2022; also the knowledge carrier of FedTGP and FedPPN).

A client's prototype of class ``c`` is the mean hidden embedding (the input of the linear
head, one common width ``d`` for every architecture) of its training nodes of class ``c``;
a class without training nodes is not reported.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Iterable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fglrepro.fl.clients import ClientData
from fglrepro.fl.method import Upload

if TYPE_CHECKING:
    from fglrepro.fl.engine import ClientBatch
    from fglrepro.fl.grouped import PerClient


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


@torch.no_grad()
def client_prototypes(model: nn.Module, client: ClientData) -> tuple[Tensor, Tensor, Tensor]:
    """:func:`class_prototypes` of the client's training nodes, from ``model``'s hidden
    embeddings in evaluation mode."""
    model.eval()
    hidden = model(client.x, client.adj, return_hidden=True)[0]
    return class_prototypes(hidden[client.train_mask], client.y[client.train_mask], client.num_classes)


def prototype_upload(model: nn.Module, client: ClientData, loss: float,
                     computed: tuple[Tensor, Tensor, Tensor] | None = None) -> Upload:
    """A prototype-only upload (FedTGP, FedPPN): ``extras`` = the ``classes [m]`` with training
    nodes and their ``prototypes [m, d]`` (:func:`client_prototypes`, or ``computed`` already),
    no parameters."""
    classes, prototypes, _ = client_prototypes(model, client) if computed is None else computed
    return Upload(params={}, extras={"classes": classes, "prototypes": prototypes}, weight=float(client.num_nodes),
                  loss=loss)


def average_prototypes(
    parts: list[tuple[Tensor, Tensor, Tensor]], num_classes: int, dim: int,
) -> tuple[Tensor, Tensor]:
    """Server step: ``p_c = sum_k w_k^c p_k^c / sum_k w_k^c`` over the clients that report
    class c, from the clients' ``(classes [m], prototypes [m, d], weights [m])``: FedProto
    weighs by the class's node counts (the ``counts`` of :func:`class_prototypes`), FedTGP's
    and FedPPN's servers take the plain mean (weights 1).

    Returns ``(prototypes [C, dim], present [C] bool)``; rows of classes no client reports are 0.
    """
    sums = torch.zeros(num_classes, dim, dtype=torch.float64)
    totals = torch.zeros(num_classes, dtype=torch.float64)
    for classes, prototypes, weights in parts:
        classes, weights = classes.cpu(), weights.cpu().to(torch.float64)
        sums.index_add_(0, classes, weights.unsqueeze(1) * prototypes.cpu().to(torch.float64))
        totals.index_add_(0, classes, weights)
    present = totals > 0
    sums[present] /= totals[present].unsqueeze(1)
    return sums.to(torch.float32), present


def plain_mean_parts(messages: Iterable[dict[str, Tensor]]) -> list[tuple[Tensor, Tensor, Tensor]]:
    """``(classes, prototypes, 1)`` of each uploaded ``{"classes", "prototypes"}``: the parts
    of the plain per-class mean (:func:`average_prototypes`) of FedTGP's and FedPPN's servers."""
    return [(m["classes"], m["prototypes"], torch.ones(m["classes"].numel())) for m in messages]


def prototype_alignment_loss(hidden: Tensor, labels: Tensor, prototypes: Tensor, present: Tensor,
                             clients: PerClient | None = None) -> Tensor:
    r"""OpenFGL's FedTGP (and FedProto) regulariser: the sum over classes ``c`` with a global
    prototype of the mean squared error between the embeddings of class ``c`` and ``p_c``:

    .. math:: \sum_c \frac{1}{N^c d} \sum_{i: y_i = c} \lVert h_i - p_c \rVert^2,

    ``hidden [m, d]``, ``labels [m]``, ``prototypes [C, d]``, ``present [C]`` bool. A scalar,
    or with ``clients`` (the client of each row, :class:`~fglrepro.fl.grouped.PerClient`) each
    client's own sum over its rows, ``[K]`` (``N^c`` counted per client).
    """
    keep = present[labels]
    rows, classes = hidden[keep], labels[keep]
    if clients is None and classes.numel() == 0:
        return hidden.sum() * 0.0
    errors = (rows - prototypes[classes]).pow(2).mean(dim=1)       # [m'] per-node MSE
    if clients is None:
        counts = torch.bincount(classes, minlength=prototypes.size(0)).to(errors.dtype)
        return (errors / counts[classes]).sum()
    client = clients.client[keep]
    cells = client * prototypes.size(0) + classes
    counts = torch.bincount(cells, minlength=clients.num_clients * prototypes.size(0)).to(errors.dtype)
    return errors.new_zeros(clients.num_clients).index_add(0, client, errors / counts[cells])


def union_prototypes(hidden: Tensor, union: ClientBatch, num_classes: int) -> dict[int, tuple[Tensor, Tensor, Tensor]]:
    """:func:`client_prototypes` of every client of ``union`` (``{k: (classes, prototypes,
    counts)}``) from the embeddings ``hidden [N, d]`` of their models on the union's nodes
    (evaluation mode)."""
    sizes = union.sizes.tolist()
    parts = zip(union.clients, *(torch.split(t, sizes) for t in (hidden, union.y, union.train_mask)))
    return {k: class_prototypes(h[mask], y[mask], num_classes) for k, h, y, mask in parts}


def margin_contrastive_loss(hidden: Tensor, labels: Tensor, prototypes: Tensor, margin: float) -> Tensor:
    """FedTGP's adaptive-margin-enhanced contrastive loss: cross-entropy of the scores
    ``-(||h_i - p_c|| + margin * 1[c = y_i])`` (the own class's distance is enlarged by the
    margin); ``hidden [m, d]``, ``labels [m]``, ``prototypes [C, d]``."""
    distance = torch.cdist(hidden, prototypes) + margin * F.one_hot(labels, prototypes.size(0)).to(hidden.dtype)
    return F.cross_entropy(-distance, labels)
