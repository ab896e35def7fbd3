"""O-pFGL (Yan et al., 2025): one-shot personalised federated graph learning.

In its single round every client uploads class-wise statistics of its propagated features
(eqs. 4-7, optionally enlarged by homophily-guided reliable node expansion, HRE), in the
clear or under pairwise-mask secure aggregation. The server pools them (eq. 8) and
generates a small surrogate graph matching them (eqs. 9-11). Each client then trains a
model on the surrogate graph (stage 1) and fine-tunes it on its own graph with
node-adaptive distillation from the stage-1 model (stage 2, eqs. 14-17).

Its own part: :mod:`.secure_aggregation` (pairwise-mask secure aggregation of the statistics).
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fglrepro.components.class_statistics import (
    ClassStatistics,
    ClassSums,
    class_statistics,
    pool_statistics,
    pool_sums,
    propagate_features,
)
from fglrepro.components.surrogate_graph import (
    LINK_PREDICTORS,
    SurrogateGraph,
    SurrogateSettings,
    dense_normalized_adjacency,
    generate_surrogate_graph,
)
from fglrepro.config import ConfigError, choice
from fglrepro.fl.clients import ClientData
from fglrepro.fl.engine import (
    BestValidation,
    ClientBatch,
    StackedForward,
    StackedGCN,
    validation_accuracy,
)
from fglrepro.fl.kernel_optimizer import KernelOptimizer
from fglrepro.fl.losses import kl_divergence
from fglrepro.fl.method import FederatedMethod, Federation, Upload
from fglrepro.fl.training import check_finite, make_optimizer, train_best_validation, train_steps
from fglrepro.methods import register
from fglrepro.methods.opfgl.secure_aggregation import mask_vector, unmask_sum
from fglrepro.models import GCN
from fglrepro.sparse import is_symmetric

#: Ablation variants (paper Fig. 3 plus stage 1 alone):
#: ``full`` the method; ``ft`` stage 2 with cross-entropy only; ``ft_focal`` stage 2 with
#: focal loss only; ``ft_fixed_gamma`` distillation with the same ``fixed_gamma`` for every
#: node; ``no_hre`` the method without reliable node expansion; ``global`` stage 1 only
#: (the generalised model M_G).
VARIANTS = ("full", "ft", "ft_focal", "ft_fixed_gamma", "no_hre", "global")


@dataclass(frozen=True)
class OPFGLHparams:
    """Defaults: the authors' code (Youth-49/O-pFGL ``main.py`` and ``run_main.sh``, Cora /
    CiteSeer Louvain+ scripts) unless noted; per-dataset values are set by the study.

    Attributes:
        hops: propagation depth h of eq. 4 (1 in all scripts).
        lp_iterations, lp_alpha: label propagation for HRE and gamma (2, 0.9).
        confidence_threshold: HRE f_th (code default 0.95; Cora script 1.0).
        degree_threshold: HRE d_th, minimum degree (code default 0 = off; Cora 20, CiteSeer 3).
        top_k: HRE keeps classes with the top_k largest H(c) (1 on Planetoid; 0 = no HRE).
        nodes_per_class: surrogate nodes per class (1 for Cora/CiteSeer/PubMed).
        node_rate: if > 0, instead ceil(node_rate * labelled nodes of the class) nodes
            (e.g. 0.0025 on ogbn-arxiv).
        link_predictor: g_theta design, one of ``mlp`` (the paper's), ``direct``,
            ``inner_product`` (Table 10).
        predictor_hidden: MLP width (128).
        delta: edge threshold (0.01).
        alignment_weight, smoothness_weight: loss weights (10, 0.1).
        surrogate_iterations: generation steps (3000).
        predictor_steps, feature_steps: steps per cycle (10 predictor, then 40 features).
        predictor_lr, feature_lr: Adam learning rates (1e-3, 5e-3).
        stage1_lr, stage1_steps: training on the surrogate graph (1e-4, up to 3000 steps).
        finetune_lr, finetune_steps: stage 2 (5e-5 in the Cora/CiteSeer scripts, code
            default 1e-4; up to 3000 steps).
        eval_every, patience: both stages keep the model with the best local validation
            accuracy, checked every ``eval_every`` steps, and stop after ``patience``
            checks without improvement (100, 10 in the scripts; code default 5).
        beta: gamma scale of eq. 17 (0.2).
        gamma_min, gamma_max: clamp range of gamma (Louvain+ scripts: no lower bound,
            upper 0.15 on Cora and 0.2 on CiteSeer).
        variant: ablation, one of :data:`VARIANTS`.
        fixed_gamma: gamma of every node in ``ft_fixed_gamma`` (not given in the paper;
            0.1, the middle of the clamp range).
        focal_gamma: focusing parameter of ``ft_focal`` (2, Lin et al.'s default).
        secure_aggregation: upload pairwise-masked sums instead of plain statistics.
    """

    hops: int = 1
    lp_iterations: int = 2
    lp_alpha: float = 0.9
    confidence_threshold: float = 0.95
    degree_threshold: int = 0
    top_k: int = 1
    nodes_per_class: int = 1
    node_rate: float = 0.0
    link_predictor: str = "mlp"
    predictor_hidden: int = 128
    delta: float = 0.01
    alignment_weight: float = 10.0
    smoothness_weight: float = 0.1
    surrogate_iterations: int = 3000
    predictor_steps: int = 10
    feature_steps: int = 40
    predictor_lr: float = 1e-3
    feature_lr: float = 5e-3
    stage1_lr: float = 1e-4
    stage1_steps: int = 3000
    finetune_lr: float = 5e-5
    finetune_steps: int = 3000
    eval_every: int = 100
    patience: int = 10
    beta: float = 0.2
    gamma_min: float = 0.0
    gamma_max: float = 0.2
    variant: str = "full"
    fixed_gamma: float = 0.1
    focal_gamma: float = 2.0
    secure_aggregation: bool = False

    def __post_init__(self) -> None:
        choice(self.variant, VARIANTS, "hparams of opfgl.variant")
        choice(self.link_predictor, LINK_PREDICTORS, "hparams of opfgl.link_predictor")
        if self.gamma_min > self.gamma_max:
            raise ConfigError(
                f"hparams of opfgl: gamma_min = {self.gamma_min} exceeds gamma_max = {self.gamma_max}"
            )

    def surrogate_settings(self) -> SurrogateSettings:
        return SurrogateSettings(
            link_predictor=self.link_predictor, hidden=self.predictor_hidden, delta=self.delta,
            iterations=self.surrogate_iterations, predictor_steps=self.predictor_steps,
            feature_steps=self.feature_steps, predictor_lr=self.predictor_lr,
            feature_lr=self.feature_lr, alignment_weight=self.alignment_weight,
            smoothness_weight=self.smoothness_weight, hops=self.hops,
        )


def label_propagation(client: ClientData, num_layers: int, alpha: float) -> Tensor:
    """Soft labels ``[n, C]`` propagated from the training labels; rows that received
    nothing become uniform.

    PyG's ``LabelPropagation`` (``num_layers`` steps of ``alpha D^-1/2 A D^-1/2 Y + (1 -
    alpha) Y_0`` without self-loops, entries clamped to [0, 1]) with the same operations, so
    the same values bit for bit (``tests/test_opfgl_batched.py`` checks it), written here so
    that a training process does not import PyG, which costs seconds per job.
    """
    seeds = F.one_hot(client.y, client.num_classes).float()
    out = torch.zeros_like(seeds)
    out[client.train_mask] = seeds[client.train_mask]
    src, dst = client.edge_index
    degree = seeds.new_zeros(client.num_nodes).scatter_add_(0, dst, seeds.new_ones(dst.numel()))
    inv_sqrt = degree.pow_(-0.5)
    inv_sqrt.masked_fill_(inv_sqrt == float("inf"), 0)
    weight = inv_sqrt[src] * inv_sqrt[dst]
    residual = (1 - alpha) * out
    for _ in range(num_layers):
        messages = weight.view(-1, 1) * out.index_select(0, src)
        out = torch.zeros_like(out).scatter_add_(0, dst.view(-1, 1).expand_as(messages), messages)
        out.mul_(alpha).add_(residual)
        out.clamp_(0.0, 1.0)
    empty = out.sum(dim=1) == 0
    out[empty] = 1.0 / client.num_classes
    return out


def class_homophily(client: ClientData) -> Tensor:
    """Eqs. 1-2: ``H [C]``, per class the sum over its training nodes of the share of
    training neighbours with the same label (0 for a node without training neighbours)."""
    src, dst = client.edge_index
    both = client.train_mask[src] & client.train_mask[dst]
    same = both & (client.y[src] == client.y[dst])
    zeros = client.x.new_zeros(client.num_nodes)
    neighbours = zeros.index_add(0, src, both.float())
    agreeing = zeros.index_add(0, src, same.float())
    node = torch.where(neighbours > 0, agreeing / neighbours.clamp(min=1), zeros)
    train = client.train_mask
    return client.x.new_zeros(client.num_classes).index_add(0, client.y[train], node[train])


def reliable_nodes(
    client: ClientData, soft: Tensor, homophily: Tensor, confidence: float, min_degree: int, top_k: int,
) -> Tensor:
    """Eq. 6, HRE: ``[n]`` mask of non-training nodes with degree >= ``min_degree``,
    normalised soft-label confidence >= ``confidence`` and predicted class among the
    ``top_k`` classes of largest ``homophily``."""
    if top_k == 0:
        return torch.zeros_like(client.train_mask)
    probs = soft / (soft.sum(dim=1, keepdim=True) + 1e-9)
    conf, predicted = probs.max(dim=1)
    major = torch.topk(homophily, min(top_k, homophily.numel())).indices
    degree = torch.bincount(client.edge_index[0], minlength=client.num_nodes)
    return (conf >= confidence) & torch.isin(predicted, major) & ~client.train_mask & (degree >= min_degree)


def distillation_weights(soft: Tensor, homophily: Tensor, beta: float, low: float, high: float) -> Tensor:
    """Eqs. 16-17: ``gamma [n] = clamp(beta * soft @ w_dist, low, high)`` with
    ``w_dist[c] = 1 / (1 + log(H(c) + 1))``."""
    w_dist = 1.0 / (1.0 + torch.log(homophily + 1.0))
    return (beta * soft @ w_dist).clamp(min=low, max=high)


def distillation_loss(student_logits: Tensor, teacher_logits: Tensor, gamma: Tensor) -> Tensor:
    """Eq. 15 as in the authors' code: ``sum_i gamma_i KL(p_teacher,i || p_student,i) / n``
    over all ``n`` local nodes (logits ``[n, C]``, ``gamma [n]``)."""
    kl = kl_divergence(teacher_logits, student_logits, reduction="none", log_target=False).sum(dim=1)
    return (gamma * kl).sum() / student_logits.size(0)


def focal_terms(log_pt: Tensor, gamma: float) -> Tensor:
    """``[n]`` focal loss ``-(1 - p_t)^gamma log p_t`` (Lin et al., 2017) of each node from
    the log-probability ``log_pt [n]`` of its label."""
    return -(1 - log_pt.exp()) ** gamma * log_pt


def focal_loss(logits: Tensor, labels: Tensor, gamma: float) -> Tensor:
    """Mean focal loss of ``[n, C]`` logits."""
    return focal_terms(F.log_softmax(logits, dim=1).gather(1, labels.unsqueeze(1)).squeeze(1), gamma).mean()


def batched_training_possible(federation: Federation) -> bool:
    """Whether the clients' two training stages can run batched (:meth:`OPFGL.train_batched`):
    not under ``train.engine: sequential``, and every client a GCN of the federation's
    architecture without jumping knowledge, on a symmetric adjacency (what
    :class:`~fglrepro.fl.engine.StackedGCN` runs). Heterogeneous clients (``model.clients``)
    train one by one: their models cannot be stacked."""
    model = federation.model
    return (federation.train.engine != "sequential" and not federation.heterogeneous and type(model) is GCN
            and model.jk is None and all(is_symmetric(c.adj) for c in federation.clients))


@register("opfgl")
class OPFGL(FederatedMethod):
    """One upload of class statistics, one download of a surrogate graph, then two-stage
    personalised training; ``eval_model`` is client k's personalised model (before the
    download, or for a client not sampled: its untrained initial model). Requires
    ``train.rounds = 1``. Uploads report loss 0: no model is trained before the upload.

    Unless ``train.engine`` is ``sequential``, the server generates the surrogate graph on
    its fast path (see :func:`~fglrepro.components.surrogate_graph.generate_surrogate_graph`) and,
    when :func:`batched_training_possible`, the participants' two stages run batched
    (:meth:`train_batched`); both agree with the sequential reference up to float rounding.
    The steps of each stage stay a sequence (each starts from the parameters the last left);
    what is batched is the clients. The server's surrogate-graph generation (3000 steps on one
    small graph, :mod:`fglrepro.components.surrogate_graph`) is one problem and stays a sequence too.
    """

    label = "O-pFGL"
    Hparams = OPFGLHparams
    heterogeneous_models = True
    one_shot = True

    def __init__(self, federation: Federation, hparams: OPFGLHparams) -> None:
        super().__init__(federation, hparams)
        self.soft_labels: dict[int, Tensor] = {}
        self.homophily: dict[int, Tensor] = {}
        self.round_participants: list[int] = []
        self.session_seed = 0
        self.self_seeds: dict[int, int] = {}
        self.pooled: ClassStatistics | None = None
        self.surrogate: SurrogateGraph | None = None
        #: the clients' GCN in stacked form when their training runs batched, else None
        self.stacked = StackedGCN(federation.model) if batched_training_possible(federation) else None

    def participants(self, round_: int) -> list[int]:
        """The base sample; also draws this round's secure-aggregation seeds (always, so
        that plain and secure runs consume the generator alike)."""
        self.round_participants = super().participants(round_)
        seeds = torch.randint(0, 2**62, (len(self.round_participants) + 1,),
                              generator=self.federation.generator).tolist()
        self.session_seed = seeds[0]
        self.self_seeds = dict(zip(self.round_participants, seeds[1:]))
        return self.round_participants

    def client_update(self, k: int, round_: int) -> Upload:
        hp, client = self.hparams, self.clients[k]
        soft = label_propagation(client, hp.lp_iterations, hp.lp_alpha)
        homophily = class_homophily(client)
        self.soft_labels[k], self.homophily[k] = soft, homophily
        labels, keep = client.y.clone(), client.train_mask.clone()
        if hp.variant != "no_hre":
            extra = reliable_nodes(client, soft, homophily, hp.confidence_threshold,
                                   hp.degree_threshold, hp.top_k)
            labels[extra] = soft[extra].argmax(dim=1)
            keep |= extra
        features = propagate_features(client.x, client.adj, hp.hops)
        labelled = torch.bincount(client.y[client.train_mask], minlength=client.num_classes)
        stats = class_statistics(features[keep], labels[keep], client.num_classes, labelled)
        return Upload(params={}, extras=self.payload(k, stats), weight=float(client.num_nodes), loss=0.0)

    def payload(self, k: int, stats: ClassStatistics) -> dict[str, Tensor]:
        """What client ``k`` sends: counts (int64 ``[C]``), means and variances (float32
        ``[C, D]``) in the clear, or its pairwise-masked :class:`ClassSums` vector (int64)
        and the seed of its personal mask."""
        if not self.hparams.secure_aggregation:
            return {"count": stats.count.long(), "labelled": stats.labelled.long(),
                    "mean": stats.mean.float(), "var": stats.var.float()}
        masked = mask_vector(ClassSums.of(stats).to_vector(), k, self.round_participants,
                             self.session_seed, self.self_seeds[k])
        return {"masked_sums": masked, "self_mask_seed": torch.tensor([self.self_seeds[k]])}

    def server_update(self, round_: int, uploads: dict[int, Upload]) -> None:
        num_classes = self.clients[0].num_classes
        ups = list(uploads.values())
        if self.hparams.secure_aggregation:
            total = unmask_sum([u.extras["masked_sums"] for u in ups],
                               [int(u.extras["self_mask_seed"]) for u in ups])
            self.pooled = pool_sums(ClassSums.from_vector(total, num_classes))
        else:
            self.pooled = pool_statistics([
                ClassStatistics(u.extras["count"].double(), u.extras["mean"].double(),
                                u.extras["var"].double(), (u.extras["count"] > 0).double(),
                                u.extras["labelled"].double())
                for u in ups
            ])
        hp = self.hparams
        if hp.node_rate > 0:
            sizes = [math.ceil(hp.node_rate * float(n)) for n in self.pooled.labelled]
        else:
            sizes = [hp.nodes_per_class] * num_classes
        self.surrogate = generate_surrogate_graph(
            self.pooled, sizes, self.clients[0].x.size(1), hp.surrogate_settings(),
            self.federation.generator, self.clients[0].x.device,
            fast=self.federation.train.engine != "sequential",
        )
        if self.stacked is not None:
            self.train_batched(list(uploads))

    def download_bytes(self, k: int) -> int:
        """The surrogate graph: features, dense weighted adjacency and labels."""
        return self.surrogate.num_bytes if self.surrogate is not None else 0

    def on_download(self, k: int, round_: int) -> None:
        """Client ``k``'s two stages (on the batched path they already ran for all
        participants at the end of :meth:`server_update`). Stage 1 gives the model the
        surrogate graph as it takes it (:meth:`SurrogateGraph.graph_for`: a GAT its weighted
        edges, a GCN the normalised weighted operator)."""
        if self.stacked is not None:
            return
        hp, client, graph, model = self.hparams, self.clients[k], self.surrogate, self.states[k].model
        structure = graph.graph_for(model)
        train = self.federation.train
        train_best_validation(
            model, make_optimizer(model, replace(train, lr=hp.stage1_lr)), client, hp.stage1_steps, hp.patience,
            objective=lambda: F.cross_entropy(model(graph.x, structure), graph.y), eval_every=hp.eval_every,
        )
        if hp.variant == "global":
            return
        model.eval()
        with torch.no_grad():
            teacher = model(client.x, client.adj)
        gamma = self.node_gamma(k)
        mask = client.train_mask

        def stage2_loss() -> Tensor:
            logits = model(client.x, client.adj)
            if hp.variant == "ft_focal":
                loss = focal_loss(logits[mask], client.y[mask], hp.focal_gamma)
            else:
                loss = F.cross_entropy(logits[mask], client.y[mask])
            if gamma is not None:
                loss = loss + distillation_loss(logits, teacher, gamma)
            return loss

        train_best_validation(
            model, make_optimizer(model, replace(train, lr=hp.finetune_lr)), client, hp.finetune_steps,
            hp.patience, objective=stage2_loss, eval_every=hp.eval_every,
        )

    def node_gamma(self, k: int) -> Tensor | None:
        """Distillation weights ``[n]`` of client ``k``'s nodes for the variant, or None
        when stage 2 does not distil."""
        hp = self.hparams
        if hp.variant in ("ft", "ft_focal"):
            return None
        if hp.variant == "ft_fixed_gamma":
            return self.clients[k].x.new_full((self.clients[k].num_nodes,), hp.fixed_gamma)
        return distillation_weights(self.soft_labels[k], self.homophily[k], hp.beta,
                                    hp.gamma_min, hp.gamma_max)

    def train_batched(self, ks: list[int]) -> None:
        """:meth:`on_download` for all participants ``ks`` at once, up to float rounding.

        Stage 1: the clients start from the same initial model (a homogeneous federation) and
        minimise the same loss on the same surrogate graph, so their runs are one run until
        each stops. It is trained once (fused Adam, the dense adjacency of the small graph)
        and checked every ``eval_every`` steps on every client's validation nodes together;
        each client keeps its best checked state and stops after ``patience`` checks without
        a new best. With dropout, the clients share one draw of masks instead of one each.

        Stage 2: every client fine-tunes from its stage-1 state on its own graph, all at
        once on the disjoint union of their graphs (:class:`~fglrepro.fl.engine.StackedGCN`,
        each client's loss its own); every client still in the union steps at every step, so
        one fused Adam over the stacked parameters, with one step count, is each client's
        own Adam; clients that stop leave the union, and their rows the optimiser state, at
        that check. The steps of one client stay a sequence (each starts from the last).
        """
        hp = self.hparams
        batch = ClientBatch.of([self.clients[k] for k in ks], ks)
        models = [self.states[k].model for k in ks]
        params = self.surrogate_stage_batched(models[0], batch)
        if hp.variant != "global":
            params = self.finetune_stage_batched(params, batch)
        self.stacked.scatter(params, models)

    def surrogate_stage_batched(self, model: nn.Module, batch: ClientBatch) -> list[Tensor]:
        """Stage 1 from the clients' common initial ``model`` (left unchanged); returns
        each client's best state, stacked ``[m, ...]`` in the engine layout."""
        hp, graph, m = self.hparams, self.surrogate, batch.num_clients
        model = copy.deepcopy(model)
        adj = dense_normalized_adjacency(graph.weights)
        optimizer = KernelOptimizer.of(model.parameters(), replace(self.federation.train, lr=hp.stage1_lr), fused=True)
        tracker = BestValidation(m, hp.patience, graph.x.device)
        everyone = torch.arange(m, device=graph.x.device)

        def for_everyone(shared: list[Tensor]) -> list[Tensor]:
            return [p.unsqueeze(0).expand(m, *p.shape) for p in shared]

        for step in range(1, hp.stage1_steps + 1):
            train_steps(optimizer, [model], 1, lambda: F.cross_entropy(model(graph.x, adj), graph.y))
            if step % hp.eval_every:
                continue
            shared = self.stacked.single(model)
            accuracy = validation_accuracy(self.stacked, shared, batch)
            if not tracker.check(accuracy, for_everyone(shared), everyone).any():
                break
        return tracker.result(for_everyone(self.stacked.single(model)))

    def finetune_stage_batched(self, start: list[Tensor], batch: ClientBatch) -> list[Tensor]:
        """Stage 2 from the stacked stage-1 states ``start``; returns each client's best
        state, stacked ``[m, ...]``."""
        hp = self.hparams
        with torch.no_grad():
            teacher = F.softmax(self.stacked.forward(start, batch, training=False).logits, dim=-1)
        gammas = [self.node_gamma(k) for k in batch.clients]
        gamma = None if gammas[0] is None else torch.cat(gammas)
        params = [p.detach().clone().requires_grad_(True) for p in start]
        optimizer = KernelOptimizer.of(params, replace(self.federation.train, lr=hp.finetune_lr), fused=True)
        tracker = BestValidation(batch.num_clients, hp.patience, teacher.device)
        rows = torch.arange(batch.num_clients, device=teacher.device)
        for step in range(1, hp.finetune_steps + 1):
            total = self.finetune_losses(self.stacked.forward(params, batch, training=True), teacher, gamma).sum()
            for param, grad in zip(params, torch.autograd.grad(total, params)):
                param.grad = grad
            optimizer.step()
            check_finite(total.item())
            if step % hp.eval_every:
                continue
            going = tracker.check(validation_accuracy(self.stacked, params, batch), params, rows)
            if not going.any():
                break
            if not going.all():
                nodes = going[batch.batch]
                teacher, gamma = teacher[nodes], None if gamma is None else gamma[nodes]
                rows, params = rows[going], optimizer.select_rows(going)
                positions = [batch.clients[i] for i in going.nonzero().flatten().tolist()]
                batch = ClientBatch.of([self.clients[k] for k in positions], positions)
        return tracker.result(params)

    def finetune_losses(self, out: StackedForward, teacher: Tensor, gamma: Tensor | None) -> Tensor:
        """``[m]`` each client's stage-2 loss (``stage2_loss`` of :meth:`on_download`) from a
        batched forward pass and the stage-1 model's probabilities ``teacher [N, C]``."""
        batch, train = out.batch, out.batch.train_mask
        log_probs = F.log_softmax(out.logits, dim=-1)
        log_pt = log_probs[train].gather(1, batch.y[train].unsqueeze(1)).squeeze(1)
        terms = focal_terms(log_pt, self.hparams.focal_gamma) if self.hparams.variant == "ft_focal" else -log_pt
        counts = torch.bincount(batch.batch[train], minlength=batch.num_clients).clamp_min(1)
        losses = batch.per_client_sum(terms, train) / counts
        if gamma is not None:
            kl = F.kl_div(log_probs, teacher, reduction="none").sum(dim=1)
            losses = losses + batch.per_client_sum(gamma * kl) / batch.sizes
        return losses
