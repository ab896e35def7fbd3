"""Loss terms shared by methods."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fglrepro.models import edge_index_of


def proximal_term(model: nn.Module, reference: dict[str, Tensor]) -> Tensor:
    """``sum ||w - w_ref||^2`` over the parameters named in ``reference`` (FedProx)."""
    total = torch.zeros((), device=next(model.parameters()).device)
    for name, p in model.named_parameters():
        if name in reference:
            total = total + (p - reference[name]).pow(2).sum()
    return total


def stacked_proximal_term(params: list[Tensor], anchors: list[Tensor]) -> Tensor:
    """``[m]``: :func:`proximal_term` of each of m client-stacked models ``params`` (each
    ``[m, ...]``) to ``anchors`` (stacked alike, or one shared model without the client
    dimension)."""
    return sum((p - a).pow(2).flatten(1).sum(dim=1) for p, a in zip(params, anchors))


def _positive_log_probability(z: Tensor, positive: Tensor, negative: Tensor, temperature: float) -> Tensor:
    """``[n]`` log-probability of the positive pair in MOON's two-way softmax over
    ``(sim(z, z+), sim(z, z-)) / tau`` (cosine similarities of the rows of ``[n, H]`` inputs)."""
    sims = torch.stack(
        [F.cosine_similarity(z, positive, dim=-1), F.cosine_similarity(z, negative, dim=-1)], dim=1,
    )
    return F.log_softmax(sims / temperature, dim=1)[:, 0]


def model_contrastive_terms(z: Tensor, positive: Tensor, negative: Tensor, temperature: float) -> Tensor:
    """MOON's model-contrastive loss of every row (node), ``[n]``:

    ``-log( e^{sim(z, z+)/tau} / (e^{sim(z, z+)/tau} + e^{sim(z, z-)/tau}) )`` with cosine
    similarity ``sim``; ``z``, ``positive``, ``negative`` are ``[n, H]`` representations
    (the local model's, the global model's, the previous local model's).
    """
    return -_positive_log_probability(z, positive, negative, temperature)


def model_contrastive_loss(z: Tensor, positive: Tensor, negative: Tensor, temperature: float) -> Tensor:
    """:func:`model_contrastive_terms` averaged over rows (nodes)."""
    return -_positive_log_probability(z, positive, negative, temperature).mean()


def kl_divergence(
    target_logits: Tensor, input_logits: Tensor, temperature: float = 1.0, reduction: str = "batchmean",
    log_target: bool = True,
) -> Tensor:
    """``KL(softmax(target / T) ‖ softmax(input / T))`` from logits ``[..., C]`` (the two
    broadcast), reduced as :func:`torch.nn.functional.kl_div` does (``"none"`` keeps the
    ``[..., C]`` terms; sum the last dimension for per-node values).

    ``log_target=False`` passes the target as probabilities instead of log-probabilities
    (the same divergence up to float rounding; O-pFGL's code computes it that way).
    """
    if temperature != 1.0:
        target_logits, input_logits = target_logits / temperature, input_logits / temperature
    target = F.log_softmax(target_logits, dim=-1) if log_target else F.softmax(target_logits, dim=-1)
    return F.kl_div(F.log_softmax(input_logits, dim=-1), target, reduction=reduction, log_target=log_target)


def neighbourhood_kl(teacher: Tensor, student: Tensor, adj: Tensor, reduction: str = "sum") -> Tensor:
    r"""FedGKC's neighbourhood distillation (eq. 1):

    .. math:: \frac{1}{n} \sum_i \sum_{j \in \mathcal{N}(i) \cup \{i\}}
              \mathrm{KL}(\sigma(z_j) \,\|\, \sigma(h_i)),

    ``teacher`` ``z`` and ``student`` ``h`` ``[n, d]`` (softmax over the d columns), the
    neighbours of i the edges ``j -> i`` of the operator ``adj [n, n]``
    (:func:`fglrepro.models.edge_index_of`). ``reduction="sum"`` (eq. 1): a sum over each
    node's neighbourhood, averaged over nodes; ``"mean"``: each node's sum divided by
    ``|N(i)| + 1``, then averaged over nodes. 0 when ``z = h`` and no node has a neighbour.
    """
    log_p, log_q = F.log_softmax(teacher, dim=-1), F.log_softmax(student, dim=-1)
    p = log_p.exp()
    source, target = edge_index_of(adj)
    if reduction == "mean":
        per_node = (p * (log_p - log_q)).sum(dim=-1)
        per_edge = (p[source] * (log_p[source] - log_q[target])).sum(dim=-1)
        return (per_node.index_add(0, target, per_edge) / neighbourhood_sizes(target, teacher.size(0))).mean()
    own = (p * (log_p - log_q)).sum()
    neighbours = (p * log_p).sum(dim=-1)[source].sum() - (p[source] * log_q[target]).sum()
    return (own + neighbours) / teacher.size(0)


def neighbourhood_sizes(target: Tensor, n: int) -> Tensor:
    """``[n]``: ``|N(i)| + 1`` for every node i, from the targets ``[E]`` of the edges ``j -> i``."""
    ones = torch.ones(target.numel(), device=target.device)
    return torch.ones(n, device=target.device).index_add(0, target, ones)
