"""FedGKC (Wu et al., 2025, "Knowledge-Driven Federated Graph Learning on Model Heterogeneity").

Every client keeps its own model, of any architecture of the zoo (``model.clients``; it is
the model tested), and a copilot model, the study's ``model`` block (a 2-layer GCN in the
paper, C.3; Figure 3b varies it through ``model.arch``). Only the copilots are averaged,
so parameters of different shapes never meet on the server.

Client side, self-mutual knowledge distillation (SMKD), each step on one forward pass of
both models (teachers detached; one optimiser over both, each loss reaching only its model):

    L_cop   = alpha CE(y, p_c) + beta L_neigh(z = e_l, h = e_c) + (1 - alpha - beta) KL(p_l || p_c)   (eq. 2)
    L_local = alpha CE(y, p_l) + beta L_neigh(z = e_c, h = e_l) + (1 - alpha - beta) KL(p_c || p_l)   (eq. 3)
              + MSE(e_weak, e_strong) + KL(p_weak || p_strong)                                    (eq. 4-5)

with ``e`` the hidden embeddings before the linear head (``model.readout: true`` everywhere,
one width) and L_neigh eq. 1 (:func:`fglrepro.fl.losses.neighbourhood_kl`) on the two models'
logits by default (``neighbour_space``, see ``FedGKCHparams``); the weak and
strong views are fresh random edge removals + feature-column maskings of the client graph
each step, the weak one the detached teacher.

With ``train.engine: auto`` the clients train on the grouped path (:mod:`fglrepro.fl.grouped`):
the local models of one architecture as one stacked model, the copilots of all clients as
another, one step for all (the views drawn per architecture's union); :func:`mutual_terms`
and :func:`self_distillation_terms` are the losses of both paths.

Server side, knowledge-aware model aggregation (KAMA): each client uploads its copilot
and its knowledge level P_k (eq. 8) from the copilot's predictions on all its nodes; the
server averages the copilots with ``w_k = (w_vol + w_know) / 2`` (eq. 6-11,
:func:`kama_weights`).

Cost: every local step runs four forward passes (the local models, the copilots, the weak view without
gradient, the strong view) and backward passes through three, on a zoo of five architectures of which
GAT and GIN cost more than a GCN; FedAvg runs one GCN forward and backward. The grouped path already
batches all of them over clients, so a run cannot fall to FedAvg's cost: Cora-10 4.8x FedAvg's process
(``benchmarks/METHOD_COSTS.md``).

Not stated in the paper (choices, see ``FedGKCHparams``): which model gives ``z`` in
L_neigh (the other model, the teacher), the space of ``z`` and ``h`` for heterogeneous models,
the nodes of the CE / KL terms (training nodes, as FML in FedPPN's graph code) and of L_neigh /
L_self (all nodes, as eq. 1 writes), the perturbation rates, and a negative knowledge level (:func:`kama_weights`).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from functools import partial
from typing import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fglrepro.config import ConfigError, choice
from fglrepro.fl.aggregation import load_parameters, parameters_of, weighted_average
from fglrepro.fl.augment import perturbed_view
from fglrepro.fl.clients import ClientData
from fglrepro.fl.engine import ClientBatch
from fglrepro.fl.grouped import WHOLE_GRAPH, GroupedRole, GroupedUpdates, PerClient, WholeGraph
from fglrepro.fl.losses import neighbourhood_kl, neighbourhood_sizes
from fglrepro.fl.method import FederatedMethod, Federation, Objective, RunSetup, Upload
from fglrepro.methods import register
from fglrepro.models import edge_index_of, hidden_width


@dataclass(frozen=True)
class FedGKCHparams:
    """alpha, beta: loss weights of eq. 2-3 (paper 5.4: 0.6 and 0.2); lam: the over-smoothing
    weight lambda of eq. 7 (0.1).

    neighbour_space: where L_neigh compares the two models, ``logits`` (class scores
      ``[n, C]``, default) or ``hidden`` (the embeddings ``[n, d]`` before the head, eq. 1's
      literal "embedding outputs of the feature extractor"). The hidden coordinates of two
      different architectures share no meaning; on CiteSeer-10 (seed 0, 20 rounds) ``hidden``
      peaks at 60.5 % validation accuracy and ``logits`` at 68.3 % (docs/notes/fedgkc.md).
    neighbour_reduction: how L_neigh reduces each node's neighbourhood ``N(i) + {i}``: ``sum``
      (default, eq. 1 as written) or ``mean`` (divided by ``|N(i)| + 1``). With ``sum`` the
      term weighs about ``beta (1 + mean degree)`` against CE's ``alpha``: 4.4 vs 0.6 on Amazon
      Photo-10 (mean degree 21 within the clients), where it dominates the loss (docs/notes/fedgkc.md).
    weak_edge_drop, weak_feature_mask, strong_edge_drop, strong_feature_mask: perturbation
    rates of the self-distillation views (not stated in the paper; OpenFGL's FGSSL code of
    the authors' group draws 0.3/0.3 and 0.8/0.5).

    Ablation switches (Table 4, Figure 3):
      smkd: self-mutual distillation; off = the "conventional dual-model" objective
        ``alpha CE + (1 - alpha) KL`` both ways (no L_neigh, no L_self).
      mutual: the mutual terms (KL and L_neigh) of both losses; off = each model learns from
        its labels only (plus L_self for the local model).
      self_distill: L_self in the local loss.
      kama: knowledge-aware weights; off = volume weights n_k / N (FedAvg).
      kama_strength, kama_class_clarity, kama_assoc_clarity: the three terms of the node
        score ``max p + (max p - sum of the rest) / (M - 1) - lam * mean neighbour cosine``.
      coarse_alignment: Figure 3b's baseline, "losses and KAMA removed" (overrides ``smkd``
        and ``kama``: off both).

    Open choices of SMKD (issue 24; Cora-10 probe in docs/notes/fedgkc.md):
      teacher_mode: the mode of the local model's forward pass on the weak view, the teacher
        of L_self (eq. 4 compares the "weakly perturbated view" with the strong one; the mode
        is not stated): ``train`` (default, with dropout, as the student's pass) or ``eval``.
      mutual_nodes: the nodes of the KL terms of eq. 2-3 (eq. 2-3 write no node set):
        ``train`` (default, the labelled nodes, as the CE term and FML in FedPPN's graph code)
        or ``all`` (every node of the client, as L_neigh in eq. 1).
    """

    alpha: float = 0.6
    beta: float = 0.2
    lam: float = 0.1
    neighbour_space: str = "logits"
    neighbour_reduction: str = "sum"
    weak_edge_drop: float = 0.3
    weak_feature_mask: float = 0.3
    strong_edge_drop: float = 0.8
    strong_feature_mask: float = 0.5
    smkd: bool = True
    mutual: bool = True
    self_distill: bool = True
    kama: bool = True
    kama_strength: bool = True
    kama_class_clarity: bool = True
    kama_assoc_clarity: bool = True
    coarse_alignment: bool = False
    teacher_mode: str = "train"
    mutual_nodes: str = "train"

    def __post_init__(self) -> None:
        if self.alpha < 0 or self.beta < 0 or self.alpha + self.beta > 1:
            raise ConfigError(f"hparams.alpha and hparams.beta must be >= 0 with alpha + beta <= 1 "
                              f"(eq. 2-3 weigh the KL term by 1 - alpha - beta), got {self.alpha} and {self.beta}")
        if self.neighbour_space not in ("logits", "hidden"):
            raise ConfigError(f"hparams.neighbour_space must be one of ['hidden', 'logits'], "
                              f"got {self.neighbour_space!r}")
        choice(self.neighbour_reduction, ("mean", "sum"), "hparams.neighbour_reduction")
        choice(self.teacher_mode, ("eval", "train"), "hparams.teacher_mode")
        choice(self.mutual_nodes, ("all", "train"), "hparams.mutual_nodes")
        for key in ("weak_edge_drop", "weak_feature_mask", "strong_edge_drop", "strong_feature_mask"):
            if not 0.0 <= getattr(self, key) < 1.0:
                raise ConfigError(f"hparams.{key} must be in [0, 1), got {getattr(self, key)}")

    @property
    def uses_smkd(self) -> bool:
        return self.smkd and not self.coarse_alignment

    @property
    def uses_kama(self) -> bool:
        return self.kama and not self.coarse_alignment

    @property
    def neighbour_weight(self) -> float:
        """beta as used: 0 without SMKD (the KL terms then weigh ``1 - alpha``)."""
        return self.beta if self.uses_smkd else 0.0


def mutual_terms(local: tuple[Tensor, Tensor], copilot: tuple[Tensor, Tensor], labels: Tensor, mask: Tensor,
                 neighbour_kl: Callable[[Tensor, Tensor], Tensor], hp: FedGKCHparams,
                 terms: WholeGraph | PerClient = WHOLE_GRAPH,
                 node_terms: WholeGraph | PerClient = WHOLE_GRAPH) -> tuple[Tensor, Tensor]:
    """``(L_local-mutu, L_cop-mutu)`` of eq. 3 and 2 from the two models' ``(hidden [n, d],
    logits [n, C])``: cross-entropy on the training nodes (``mask [n]``, their ``labels``),
    KL on them too (``hp.mutual_nodes: train``, reduced by ``terms``) or on all nodes
    (``all``, reduced by ``node_terms``), L_neigh (``neighbour_kl(teacher, student)``, eq. 1)
    on all nodes; in each loss the other model is the detached teacher. Scalars, or per client
    ``[K]`` with :class:`~fglrepro.fl.grouped.PerClient` terms (and a per-client ``neighbour_kl``)."""
    (hidden_l, logits_l), (hidden_c, logits_c) = local, copilot
    loss_l = hp.alpha * terms.cross_entropy(logits_l[mask], labels)
    loss_c = hp.alpha * terms.cross_entropy(logits_c[mask], labels)
    if not hp.mutual:
        return loss_l, loss_c
    beta = hp.neighbour_weight
    if beta > 0:
        z_l, z_c = (logits_l, logits_c) if hp.neighbour_space == "logits" else (hidden_l, hidden_c)
        loss_l = loss_l + beta * neighbour_kl(z_c.detach(), z_l)
        loss_c = loss_c + beta * neighbour_kl(z_l.detach(), z_c)
    distill = 1 - hp.alpha - beta
    if hp.mutual_nodes == "train":
        logits_l, logits_c, node_terms = logits_l[mask], logits_c[mask], terms
    loss_l = loss_l + distill * node_terms.kl(logits_c.detach(), logits_l)
    loss_c = loss_c + distill * node_terms.kl(logits_l.detach(), logits_c)
    return loss_l, loss_c


def mutual_losses(local: tuple[Tensor, Tensor], copilot: tuple[Tensor, Tensor], client: ClientData,
                  hp: FedGKCHparams) -> tuple[Tensor, Tensor]:
    """:func:`mutual_terms` of one client: cross-entropy and KL on its training nodes,
    L_neigh over its adjacency."""
    return mutual_terms(local, copilot, client.y[client.train_mask], client.train_mask,
                        partial(neighbourhood_kl, adj=client.adj, reduction=hp.neighbour_reduction), hp)


def client_neighbourhood_kl(teacher: Tensor, student: Tensor, union: ClientBatch, reduction: str = "sum") -> Tensor:
    """:func:`~fglrepro.fl.losses.neighbourhood_kl` of every client of ``union`` at once,
    ``[m]``: ``teacher``, ``student`` ``[N, d]`` on the union's nodes, neighbours the edges of
    its block-diagonal adjacency (they never cross clients), each client's sum over its nodes
    divided by its node count (with ``reduction="mean"`` each node's term first divided by
    ``|N(i)| + 1``)."""
    log_p, log_q = F.log_softmax(teacher, dim=-1), F.log_softmax(student, dim=-1)
    p = log_p.exp()
    own = (p * (log_p - log_q)).sum(dim=-1)
    source, target = edge_index_of(union.adj)
    if reduction == "mean":
        per_edge = (p[source] * (log_p[source] - log_q[target])).sum(dim=-1)
        per_node = own.index_add(0, target, per_edge) / neighbourhood_sizes(target, own.size(0))
        return union.per_client_sum(per_node) / union.sizes
    neighbours = (p * log_p).sum(dim=-1)[source] - (p[source] * log_q[target]).sum(dim=-1)
    total = union.per_client_sum(own) + own.new_zeros(union.num_clients).index_add(0, union.batch[target], neighbours)
    return total / union.sizes


def self_distillation_terms(weak: tuple[Tensor, Tensor], strong: tuple[Tensor, Tensor],
                            terms: WholeGraph | PerClient = WHOLE_GRAPH) -> Tensor:
    """Eq. 4 from the weak view's ``(hidden, logits)`` (the teacher, no gradient) and the
    strong view's: ``MSE(e_weak, e_strong) + KL(p_weak || p_strong)`` over all nodes."""
    (hidden_weak, logits_weak), (hidden_strong, logits_strong) = weak, strong
    return terms.mse(hidden_strong, hidden_weak) + terms.kl(logits_weak, logits_strong)


def self_distillation_loss(model: nn.Module, client: ClientData, hp: FedGKCHparams) -> Tensor:
    """Eq. 4 on fresh weak and strong views (:func:`self_distillation_terms`): embeddings
    ``[n, d]``, MSE mean over entries, KL averaged over nodes, the weak view the detached
    teacher (in evaluation mode with ``hp.teacher_mode: eval``, else in the model's mode)."""
    x_weak, adj_weak = perturbed_view(client, hp.weak_edge_drop, hp.weak_feature_mask)
    x_strong, adj_strong = perturbed_view(client, hp.strong_edge_drop, hp.strong_feature_mask)
    training = model.training
    if hp.teacher_mode == "eval":
        model.eval()
    with torch.no_grad():
        weak = model(x_weak, adj_weak, return_hidden=True)
    model.train(training)
    return self_distillation_terms(weak, model(x_strong, adj_strong, return_hidden=True))


def mean_neighbour_cosine(probs: Tensor, edge_index: Tensor) -> Tensor:
    """``[n]``: mean cosine similarity of row i of ``probs [n, M]`` with the rows of its
    neighbours (edges ``j -> i`` of ``edge_index [2, E]``); 0 for a node without any."""
    source, target = edge_index
    n = probs.size(0)
    sims = F.cosine_similarity(probs[target], probs[source], dim=-1)
    total = torch.zeros(n, dtype=probs.dtype, device=probs.device).index_add_(0, target, sims)
    count = torch.zeros(n, dtype=probs.dtype, device=probs.device).index_add_(0, target, torch.ones_like(sims))
    return total / count.clamp(min=1)


def node_scores(probs: Tensor, edge_index: Tensor, lam: float, strength: bool = True, class_clarity: bool = True,
                assoc_clarity: bool = True) -> Tensor:
    r"""KAMA's node scores ``S_i = Q^stren_i + Q^clar_i`` ``[n]`` (eq. 7, 14) from predicted
    probabilities ``probs [n, M]`` and the graph's edges ``edge_index [2, E]``:

    .. math:: S_i = m_i + \frac{m_i - \sum_{c \ne \arg\max} p_{ic}}{M - 1}
              - \lambda \frac{1}{|V_i|} \sum_{j \in V_i} \cos(p_i, p_j),

    ``m_i = max_c p_ic``; a switch set to False drops its term (knowledge strength, class
    clarity, association clarity).
    """
    top = probs.max(dim=-1).values
    score = torch.zeros_like(top)
    if strength:
        score = score + top
    if class_clarity:
        score = score + (top - (probs.sum(dim=-1) - top)) / (probs.size(1) - 1)
    if assoc_clarity:
        score = score - lam * mean_neighbour_cosine(probs, edge_index)
    return score


@torch.no_grad()
def knowledge_level(model: nn.Module, client: ClientData, hp: FedGKCHparams) -> Tensor:
    """P_k (eq. 8): the mean node score of ``model``'s predictions on all the client's nodes
    (eval mode), a 0-d tensor."""
    model.eval()
    probs = F.softmax(model(client.x, client.adj), dim=-1)
    return node_scores(probs, edge_index_of(client.adj), hp.lam, hp.kama_strength, hp.kama_class_clarity,
                       hp.kama_assoc_clarity).mean()


def client_knowledge_levels(logits: Tensor, union: ClientBatch, hp: FedGKCHparams) -> Tensor:
    """:func:`knowledge_level` of every client of ``union`` at once, ``[m]``, from the
    copilots' logits ``[N, M]`` (evaluation mode) on the union's nodes: each client's mean
    node score (the union's edges never cross clients)."""
    scores = node_scores(F.softmax(logits, dim=-1), edge_index_of(union.adj), hp.lam, hp.kama_strength,
                         hp.kama_class_clarity, hp.kama_assoc_clarity)
    return union.per_client_sum(scores) / union.sizes


def kama_weights(volumes: Tensor, knowledge: Tensor) -> Tensor:
    """Aggregation weights ``w_k = (w_vol + w_know) / 2`` ``[K]`` (eq. 6, 9, 10) from data
    volumes ``N_k`` and knowledge levels ``P_k`` ``[K]``; they sum to 1.

    A knowledge level can be negative (near-uniform predictions with similar neighbours,
    e.g. in the first round: the score's minimum is ``1/(M(M-1)) - lam``, and without the
    strength term it is below 0 for every ``m_i < 1/2``), where eq. 9 is undefined or gives
    negative weights. Here negative levels count as 0 (such a client gets half its volume
    weight), and when no level is positive ``w_know = w_vol`` (volume weights, FedAvg).
    """
    w_vol = volumes / volumes.sum()
    positive = knowledge.clamp(min=0)
    w_know = positive / positive.sum() if positive.sum() > 0 else w_vol
    return (w_vol + w_know) / 2


@register("fedgkc")
class FedGKC(GroupedUpdates, FederatedMethod):
    """Client k's own model ``states[k].model`` (tested, heterogeneous) and copilot
    ``states[k].modules["copilot"]`` (aggregated with KAMA); ``states[k].received`` is the
    server's copilot."""

    label = "FedGKC"
    Hparams = FedGKCHparams
    has_global_model = False
    heterogeneous_models = True

    def __init__(self, federation: Federation, hparams: FedGKCHparams) -> None:
        super().__init__(federation, hparams)
        self.global_copilot = copy.deepcopy(federation.model)
        for state in self.states:
            state.modules["copilot"] = copy.deepcopy(federation.model)
            state.received = self.global_copilot
        #: the last round's aggregation weights of the uploading clients (ascending ids), ``[m]``
        self.weights: Tensor | None = None
        #: knowledge levels computed on the grouped path for this round's uploads
        self._knowledge: dict[int, Tensor] = {}

    @classmethod
    def check_protocol(cls, hparams: FedGKCHparams, setup: RunSetup) -> None:
        """Copilot (``model``) and client models (``model.clients``) need a linear head on
        one hidden width: SMKD distils their embeddings."""
        model = setup.model
        configs = [model] + [model.for_client(k) for k in range(len(model.clients))]
        widths = [hidden_width(c) for c in configs]
        if None in widths:
            raise ConfigError("method 'fedgkc' distils the hidden embeddings of the copilot (model) and of every "
                              "client model (model.clients): set model.readout: true")
        if len(set(widths)) > 1:
            raise ConfigError(f"method 'fedgkc' needs one hidden width for the copilot (model) and every client "
                              f"model (model.clients); got {sorted(set(widths))}")

    def receive(self, k: int, round_: int) -> None:
        """The server's copilot into client k's copilot."""
        load_parameters(self.states[k].modules["copilot"], dict(self.global_copilot.named_parameters()))

    def local_objective(self, k: int, round_: int) -> Objective:
        """``L_local + L_cop`` of one step (each term reaches only its own model)."""
        state, client, hp = self.states[k], self.clients[k], self.hparams
        local, copilot = state.model, state.modules["copilot"]
        self_distill = hp.uses_smkd and hp.self_distill

        def loss() -> Tensor:
            outputs_l = local(client.x, client.adj, return_hidden=True)
            outputs_c = copilot(client.x, client.adj, return_hidden=True)
            loss_l, loss_c = mutual_losses(outputs_l, outputs_c, client, hp)
            if self_distill:
                loss_l = loss_l + self_distillation_loss(local, client, hp)
            return loss_l + loss_c

        return loss

    def grouped_roles(self) -> dict[str, list[nn.Module]]:
        return {"local": [s.model for s in self.states], "copilot": [s.modules["copilot"] for s in self.states]}

    def grouped_loss(self, union: ClientBatch, roles: dict[str, GroupedRole], round_: int) -> Tensor:
        """:meth:`local_objective` of every participant, ``[m]``: both models of every client
        in two stacked forwards (the local models one per architecture), the two views of
        the self-distillation drawn for each architecture's union at once."""
        hp, local = self.hparams, roles["local"]
        mask, every_node = union.train_mask, PerClient(union.batch, union.num_clients)
        loss_l, loss_c = mutual_terms(local.forward(), roles["copilot"].forward(), union.y[mask], mask,
                                      partial(client_neighbourhood_kl, union=union,
                                              reduction=hp.neighbour_reduction), hp,
                                      PerClient(union.batch[mask], union.num_clients), every_node)
        if hp.uses_smkd and hp.self_distill:
            with torch.no_grad():
                weak = local.forward(hp.teacher_mode == "train", perturb=(hp.weak_edge_drop, hp.weak_feature_mask))
            strong = local.forward(perturb=(hp.strong_edge_drop, hp.strong_feature_mask))
            loss_l = loss_l + self_distillation_terms(weak, strong, every_node)
        return loss_l + loss_c

    def grouped_trained(self, ks: list[int], union: ClientBatch, roles: dict[str, GroupedRole], round_: int) -> None:
        """With KAMA, every participant's knowledge level P_k from one forward pass of all
        copilots (:func:`client_knowledge_levels`), taken by :meth:`upload`."""
        if self.hparams.uses_kama:
            levels = client_knowledge_levels(roles["copilot"].predict(ks)[1], union, self.hparams)
            self._knowledge = dict(zip(ks, levels))

    def upload(self, k: int, round_: int, loss: float) -> Upload:
        """The copilot's parameters (the same for every local architecture) and, with KAMA,
        the knowledge level P_k."""
        copilot, client = self.states[k].modules["copilot"], self.clients[k]
        extras = {}
        if self.hparams.uses_kama:
            level = self._knowledge.pop(k, None)
            extras["knowledge"] = (knowledge_level(copilot, client, self.hparams) if level is None else level).view(1)
        return Upload(params=parameters_of(copilot), extras=extras, weight=float(client.num_nodes), loss=loss)

    def server_update(self, round_: int, uploads: dict[int, Upload]) -> None:
        """Copilots averaged with KAMA's weights (eq. 11), or with ``n_k`` without KAMA."""
        ids = sorted(uploads)
        volumes = torch.tensor([uploads[k].weight for k in ids], dtype=torch.float64)
        if self.hparams.uses_kama:
            knowledge = torch.cat([uploads[k].extras["knowledge"] for k in ids]).to("cpu", torch.float64)
            weights = kama_weights(volumes, knowledge)
        else:
            weights = volumes
        self.weights = weights / weights.sum()
        load_parameters(self.global_copilot, weighted_average([uploads[k].params for k in ids], weights.tolist()))
