"""ReNode (Chen et al., NeurIPS 2021): topology-imbalance learning by re-weighting labelled nodes.

The paper is not in ``../shared/papers``; this follows the O-pFGL paper's use of it (Table 6: "a
representative graph imbalance learning method") and the ReNode authors' public code for the
formulas. On each client's graph:

* personalised PageRank ``P = alpha (I - (1 - alpha) A_hat)^-1`` with ``A_hat = D^-1/2 (A + I) D^-1/2``
  (restart probability ``alpha = 0.15``), computed here by power iteration on ``[n, C]`` matrices
  (never the dense ``[n, n]`` inverse);
* class influence ``G [n, C]``: ``G[u, c]`` the mean of ``P[i, u]`` over the labelled nodes ``i``
  of class ``c`` (``G = P M`` with ``M[i, c] = 1 / |L_c|`` for ``i`` in ``L_c``, as ``P`` is symmetric);
* conflict ("Totoro") of a labelled node ``v``: ``T_v = sum_u P[v, u] sum_{j != y_v} G[u, j]``, the
  influence of the other classes around ``v`` (the code's form: no ``1 / (C - 1)`` and no own-class
  term, which the paper's equation has; the ranks below differ only by the own-class term);
* cosine-annealed weights by the rank ``r_v`` of ``T_v`` among the ``n_L`` labelled nodes
  (ascending: the least conflicting node ranks 0):
  ``w_v = w_min + (w_max - w_min) (1 + cos(pi r_v / (n_L - 1))) / 2``;
* loss ``sum_{v in L} w_v CE(v) / n_L`` instead of the mean cross-entropy.

ReNode itself is not federated. ``federated: false`` (default) trains every client alone with the
re-weighted loss (as Standalone does with cross-entropy); ``federated: true`` puts the loss into
FedAvg's local steps. With ``w_min = w_max = 1`` both reduce to their cross-entropy counterparts
(``local`` and ``fedavg``), up to the float rounding of a weighted sum against a mean.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from fglrepro.config import ConfigError
from fglrepro.fl.clients import ClientData
from fglrepro.fl.method import Capabilities, Objective, ParameterAveraging, Upload
from fglrepro.methods import register


@dataclass(frozen=True)
class ReNodeHparams:
    """Defaults of the ReNode authors' code.

    Attributes:
        restart: PageRank restart probability alpha (``1 - pagerank_prob``, 0.15).
        ppr_iterations: power-iteration steps of the PageRank (error ``(1 - alpha)^steps``).
        base_weight: w_min, the weight of the most conflicting node (0.5).
        scale_weight: w_max - w_min (1.0: weights in [0.5, 1.5]).
        federated: FedAvg with the re-weighted local loss instead of isolated training.
    """

    restart: float = 0.15
    ppr_iterations: int = 100
    base_weight: float = 0.5
    scale_weight: float = 1.0
    federated: bool = False

    def __post_init__(self) -> None:
        if not 0.0 < self.restart <= 1.0:
            raise ConfigError(f"hparams of renode.restart must be in (0, 1], got {self.restart}")
        if self.ppr_iterations < 1:
            raise ConfigError(f"hparams of renode.ppr_iterations must be >= 1, got {self.ppr_iterations}")


def pagerank_propagate(adj: Tensor, x: Tensor, restart: float, iterations: int) -> Tensor:
    """``P x`` for the personalised PageRank ``P = alpha (I - (1 - alpha) adj)^-1`` by
    ``iterations`` steps of ``h <- (1 - alpha) adj h + alpha x`` from ``h = alpha x``
    (``adj [n, n]`` sparse normalised adjacency, ``x [n, d]``)."""
    h = restart * x
    for _ in range(iterations):
        h = (1 - restart) * torch.sparse.mm(adj, h) + restart * x
    return h


def totoro(client: ClientData, restart: float, iterations: int) -> Tensor:
    """``[n]`` conflict ``T_v`` of every node with the labelled nodes of the other classes
    (meaningful for labelled nodes only; see the module docstring)."""
    train, labels = client.train_mask, client.y
    seeds = F.one_hot(labels, client.num_classes).float() * train.unsqueeze(1).float()
    seeds = seeds / seeds.sum(dim=0, keepdim=True).clamp_min(1.0)
    influence = pagerank_propagate(client.adj, seeds, restart, iterations)  # G [n, C]
    others = influence.sum(dim=1, keepdim=True) - influence
    conflict = pagerank_propagate(client.adj, others, restart, iterations)  # [n, C]
    return conflict.gather(1, labels.unsqueeze(1)).squeeze(1)


def cosine_rank_weights(scores: Tensor, base: float, scale: float) -> Tensor:
    """``[n_L]`` weights ``base + scale (1 + cos(pi r / (n_L - 1))) / 2`` of ``scores [n_L]``
    by their ascending rank ``r`` (ties keep their order)."""
    order = torch.argsort(scores, stable=True)
    rank = torch.empty_like(order).scatter_(0, order, torch.arange(order.numel(), device=order.device))
    span = max(order.numel() - 1, 1)
    return base + 0.5 * scale * (1 + torch.cos(rank.to(scores.dtype) * math.pi / span))


def renode_weights(client: ClientData, hparams: ReNodeHparams) -> Tensor:
    """``[n_L]`` ReNode weights of client's labelled nodes (in node order)."""
    scores = totoro(client, hparams.restart, hparams.ppr_iterations)[client.train_mask]
    return cosine_rank_weights(scores, hparams.base_weight, hparams.scale_weight)


def weighted_cross_entropy(logits: Tensor, labels: Tensor, weights: Tensor) -> Tensor:
    """``sum_v w_v CE(v) / n_L`` over the labelled nodes' ``logits [n_L, C]``."""
    return (weights * F.cross_entropy(logits, labels, reduction="none")).sum() / labels.numel()


@register("renode")
class ReNode(ParameterAveraging):
    """Every client minimises the ReNode-weighted cross-entropy; with ``federated`` the FedAvg
    skeleton around it, else no communication (uploads carry only the loss)."""

    label = "ReNode"
    Hparams = ReNodeHparams
    vectorised = True

    def __init__(self, federation, hparams: ReNodeHparams) -> None:
        super().__init__(federation, hparams)
        if not hparams.federated:
            for state in self.states:
                state.received = None
        self.weights = [renode_weights(client, hparams) for client in self.clients]

    @classmethod
    def capabilities(cls, hparams: ReNodeHparams) -> Capabilities:
        return Capabilities(global_model=hparams.federated, server_models=hparams.federated, vectorised=True)

    def receive(self, k: int, round_: int) -> None:
        if self.hparams.federated:
            super().receive(k, round_)

    def batched_receive(self, ks: list[int], round_: int, engine) -> None:
        if self.hparams.federated:
            engine.load_rows(ks, [self.states[k].received for k in ks])

    def local_objective(self, k: int, round_: int) -> Objective:
        model, client, weights = self.states[k].model, self.clients[k], self.weights[k]
        mask = client.train_mask
        return lambda: weighted_cross_entropy(model(client.x, client.adj)[mask], client.y[mask], weights)

    def batched_extra_loss(self, ks: list[int], round_: int, engine):
        """The re-weighting as a term added to the engine's mean cross-entropy:
        ``sum_v (w_v - 1) CE(v) / n_L`` per client."""
        excess = torch.cat([self.weights[k] for k in ks]) - 1.0

        def terms(out, params) -> Tensor:
            batch, train = out.batch, out.batch.train_mask
            per_node = F.cross_entropy(out.logits[train], batch.y[train], reduction="none")
            counts = torch.bincount(batch.batch[train], minlength=batch.num_clients).clamp_min(1)
            return batch.per_client_sum(excess * per_node, train) / counts

        return terms

    def upload(self, k: int, round_: int, loss: float) -> Upload:
        if self.hparams.federated:
            return super().upload(k, round_, loss)
        return Upload(params={}, weight=float(self.clients[k].num_nodes), loss=loss)

    def server_update(self, round_: int, uploads: dict[int, Upload]) -> None:
        if self.hparams.federated:
            super().server_update(round_, uploads)

    def server_models(self) -> list:
        return super().server_models() if self.hparams.federated else []

    def download_bytes(self, k: int) -> int:
        return super().download_bytes(k) if self.hparams.federated else 0
