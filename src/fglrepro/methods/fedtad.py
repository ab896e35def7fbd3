"""FedTAD (Zhu et al., IJCAI 2024): topology-aware data-free knowledge distillation.

Client side, once: class-wise knowledge reliability ϕ_k (eq. 3-5) from topology-aware
node embeddings, uploaded with the client's first model. Server side, every round:
the base method aggregates (FedAvg by default), then the adversarial distillation of
eq. 6-11 refines every server-side model with the uploaded local models as teachers,
each teacher weighted per class by ϕ_k^c / Σ_j ϕ_j^c over the round's participants.

FedTAD wraps its base method, so it plugs in after any method that exposes
``server_models()`` (Table 3: GCFL+, Fed-PUB, FedSage+, FedGTA), without changes to the
round loop. Defaults are the authors' code (zyl24/FedTAD, ``train_fedtad.py``); where the
code and the paper differ both are selectable (``divergence``, ``diversity``).

Fast path (``train.engine`` not ``sequential``): the teachers run side by side as one pass
(:class:`~fglrepro.components.generator.Teachers`; the clients' reliabilities ϕ_k and the per-node
weights are computed once per client and once per round, the teachers' stacked weights once
per round), the pseudo graph is a dense ``[B, B]`` operator when the server model is a GCN,
the diversity loss visits each pair of pseudo nodes once, and the generator's and server
model's Adam are torch's fused kernel without a ``torch.optim`` object
(:class:`~fglrepro.fl.kernel_optimizer.KernelOptimizer`); see :mod:`fglrepro.components.generator`.
The I epochs, and the generator and student steps inside them, stay a sequence: each step
starts from the generator and student the previous one left, so they cannot be batched. What
remains is mostly the dense products with the F-wide generated features (generator head,
teachers' and student's first layers: about 5 GFLOP per round on Cora-10).
"""

from __future__ import annotations

import dataclasses
import weakref
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fglrepro.components.generator import (
    DIVERSITY_LOSSES,
    Teachers,
    balanced_labels,
    dense_graph_fits,
    distill_students,
    diversity_loss,
    knn_pseudo_graph,
    seeded_generator,
    uploaded_teachers,
)
from fglrepro.components.topology import return_probabilities, sampled_walk_ids
from fglrepro.config import ConfigError, choice
from fglrepro.fl.clients import ClientData, normalized_adjacency
from fglrepro.fl.kernel_optimizer import KernelOptimizer
from fglrepro.fl.losses import kl_divergence
from fglrepro.fl.method import Capabilities, FederatedMethod, Federation, Upload
from fglrepro.fl.wrapper import MethodWrapper
from fglrepro.methods import register

#: Name of the reliability vector ϕ_k in the side data of a client's first upload.
RELIABILITY = "fedtad.reliability"
RELIABILITIES = ("topology", "equal", "labelled")


@dataclass(frozen=True)
class FedTADHparams:
    """FedTAD settings; defaults from the authors' code unless noted.

    base, base_hparams: method whose aggregation FedTAD post-processes and its hparams.
    reliability: ``topology`` (eq. 5), ``equal`` (ϕ = 1, FedTAD-eq) or ``labelled``
        (ϕ^c = number of labelled nodes of class c, FedTAD-nv).
    walk_length: p, longest random walk of the topology embedding (eq. 3).
    reliability_noise: r; each uploaded ϕ_k^c becomes ``max(0, ϕ (1 + r ε))``, ε ~ N(0, 1)
        (Table 2's "10 % noise" row: r = 0.1).
    pseudo_graph: ``generated`` (eq. 6-7) or ``real`` (the union of the clients' graphs,
        FedTAD-r-eq with ``reliability: equal``; no generator; distilled on the training nodes,
        weighted by their labels).
    num_pseudo_nodes: B, split evenly over classes. knn: k of the pseudo graph (eq. 7).
    noise_dim: size of the generator's noise z.
    distill_epochs, generator_steps, distill_steps: I, I_g, I_d of Algorithm 1.
    lr_generator, lr_distill, weight_decay: Adam of the generator and of the server model(s).
    lambda_sem, lambda_div: λ1, λ2 of eq. 11 (code 1; the paper searches 1e-3 .. 1e-1).
    weight_diverg: weight of L_diverg in the generator's objective (0 removes it, Fig. 4b).
    divergence: ``l1`` (code: mean |logit difference|) or ``kl`` (eq. 10, KL(global ‖ local)).
    diversity: ``noise_l1`` (code: mode-seeking loss on noise and feature distances) or
        ``cosine`` (eq. 9).
    fidelity: ``paper`` (the equations above), or ``code``: where the authors' code departs
        from the paper, the topology part of ``h_i`` is the ids of the nodes its "random
        walks" visit (:func:`~fglrepro.components.topology.sampled_walk_ids`), and the teachers, and
        the global model during generator steps, keep dropout active (its GCN applies dropout
        unconditionally). The code's whole protocol also tests with dropout
        (``evaluation.dropout: true``) and partitions with python-louvain
        (``partition.options.library``).
    """

    base: str = "fedavg"
    base_hparams: dict = field(default_factory=dict)
    reliability: str = "topology"
    walk_length: int = 5
    reliability_noise: float = 0.0
    pseudo_graph: str = "generated"
    num_pseudo_nodes: int = 100
    knn: int = 5
    noise_dim: int = 32
    distill_epochs: int = 5
    generator_steps: int = 1
    distill_steps: int = 5
    lr_generator: float = 1e-3
    lr_distill: float = 1e-3
    weight_decay: float = 5e-4
    lambda_sem: float = 1.0
    lambda_div: float = 1.0
    weight_diverg: float = 1.0
    divergence: str = "l1"
    diversity: str = "noise_l1"
    fidelity: str = "paper"

    def __post_init__(self) -> None:
        choice(self.fidelity, ("paper", "code"), "hparams.fidelity")
        choice(self.reliability, RELIABILITIES, "hparams.reliability")
        choice(self.pseudo_graph, ("generated", "real"), "hparams.pseudo_graph")
        choice(self.divergence, ("l1", "kl"), "hparams.divergence")
        choice(self.diversity, DIVERSITY_LOSSES, "hparams.diversity")


def class_reliability(client: ClientData, topology: Tensor, chunk: int = 1 << 20) -> Tensor:
    """Class-wise knowledge reliability ϕ ``[C]`` of one client (eq. 3-5).

    ``h_i = x_i ‖ topology_i`` (``topology [n, t]``; the paper's: the return probabilities
    ``[T^1_ii .. T^p_ii]``); for each labelled node i the mean cosine
    similarity of ``h_i`` with its neighbours, counting i itself (similarity 1) as the
    authors' code does so that isolated labelled nodes are defined:
    ``(1 + Σ_{j∈N(i)} s(h_i, h_j)) / (1 + |N(i)|)``; ϕ^c sums it over labelled nodes of class c.
    Sparse: one pass over the edges leaving labelled nodes, in chunks of ``chunk`` edges.
    """
    n = client.num_nodes
    h = F.normalize(torch.cat([client.x.float(), topology.to(client.x.device)], dim=1), dim=1)
    src, dst = client.edge_index
    keep = client.train_mask[src] & (src != dst)
    src, dst = src[keep], dst[keep]
    similarity = torch.zeros(n, device=h.device)
    for start in range(0, src.numel(), chunk):
        s, d = src[start:start + chunk], dst[start:start + chunk]
        similarity.index_add_(0, s, (h[s] * h[d]).sum(dim=1))
    degree = torch.bincount(src, minlength=n).float()
    homophily = (1.0 + similarity) / (1.0 + degree)
    labelled = client.train_mask
    return torch.zeros(client.num_classes, device=h.device).index_add_(
        0, client.y[labelled], homophily[labelled]
    )


def labelled_counts(client: ClientData) -> Tensor:
    """``[C]`` number of labelled (training) nodes per class."""
    return torch.bincount(client.y[client.train_mask], minlength=client.num_classes).float()


def per_node_weights(reliability: Tensor, labels: Tensor) -> Tensor:
    """``[K, B]`` weight of pseudo node i for teacher k: ``ϕ̄_k^{y_i} / |V̂_{y_i}|``.

    ``reliability [K, C]`` is normalised per class over the K teachers (eq. 8); dividing by
    the class size turns the per-class sums of eq. 8/10 into the code's per-class means.
    """
    total = reliability.sum(dim=0, keepdim=True)
    share = torch.where(total > 0, reliability / total.clamp_min(1e-12), torch.zeros_like(reliability))
    class_size = torch.bincount(labels, minlength=reliability.size(1)).clamp_min(1).float()
    return share[:, labels] / class_size[labels]


def divergence(kind: str, student: Tensor, teachers: Tensor) -> Tensor:
    """``[K, B]`` per-node divergence of ``student [B, C]`` from each of ``teachers [K, B, C]``."""
    if kind == "l1":
        return (student.unsqueeze(0) - teachers).abs().mean(dim=-1)
    return kl_divergence(student.unsqueeze(0), teachers, reduction="none").sum(dim=-1)


@register("fedtad")
class FedTAD(MethodWrapper):
    """FedTAD around a base method (FedAvg by default); see the module docstring."""

    label = "FedTAD"
    Hparams = FedTADHparams

    def __init__(self, federation: Federation, hparams: FedTADHparams, base: FederatedMethod) -> None:
        super().__init__(federation, hparams, base)
        device = federation.clients[0].x.device
        self.rng = torch.Generator().manual_seed(federation.generator.initial_seed() + 1)
        self.reliability = [self._client_reliability(c) for c in federation.clients]
        self.uploaded: set[int] = set()
        self.server_reliability: dict[int, Tensor] = {}
        num_classes = federation.clients[0].num_classes
        if hparams.pseudo_graph == "generated":
            self.generator = seeded_generator(
                num_classes, federation.clients[0].x.size(1), hparams.noise_dim, self.rng, device
            )
            self.generator_optimizer = KernelOptimizer(
                self.generator.parameters(), lr=hparams.lr_generator, weight_decay=hparams.weight_decay,
                fused=self.fast or None,
            )
            self.pseudo_labels = balanced_labels(hparams.num_pseudo_nodes, num_classes, device)
        else:
            self.real_x, self.real_adj, self.real_train, self.pseudo_labels = self._real_graph()
        self.distill_optimizers: weakref.WeakKeyDictionary[nn.Module, KernelOptimizer] = (
            weakref.WeakKeyDictionary()
        )

    def _client_reliability(self, client: ClientData) -> Tensor:
        """ϕ_k as the client uploads it (variant and noise applied)."""
        kind = self.hparams.reliability
        if kind == "topology":
            n, walks = client.num_nodes, self.hparams.walk_length
            if self.hparams.fidelity == "code":
                topology = sampled_walk_ids(client.edge_index, n, walks, self.rng)
            else:
                topology = return_probabilities(client.edge_index, n, walks)
            phi = class_reliability(client, topology)
        elif kind == "labelled":
            phi = labelled_counts(client)
        else:
            phi = torch.ones(client.num_classes, device=client.x.device)
        if self.hparams.reliability_noise > 0:
            eps = torch.randn(phi.shape, generator=self.rng).to(phi.device)
            phi = (phi * (1.0 + self.hparams.reliability_noise * eps)).clamp_min(0.0)
        return phi

    def _real_graph(self) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """Disjoint union of the clients' graphs: features ``[N, F]``, adjacency, the union's
        training nodes ``[M]`` and their labels ``[M]`` (the only labels distillation sees)."""
        clients = self.federation.clients
        offsets = torch.cumsum(torch.tensor([0] + [c.num_nodes for c in clients]), 0).tolist()
        edges = torch.cat([c.edge_index + off for c, off in zip(clients, offsets)], dim=1)
        x = torch.cat([c.x for c in clients])
        train = torch.cat([c.train_mask for c in clients]).nonzero().view(-1)
        labels = torch.cat([c.y[c.train_mask] for c in clients])
        return x, normalized_adjacency(edges, offsets[-1]), train, labels

    @classmethod
    def wrap_capabilities(cls, hparams: FedTADHparams, base: Capabilities) -> Capabilities:
        """The base's: FedTAD needs server-side models to distil into (around ``dense`` with
        ``student: personal`` it distils into each client's own, possibly heterogeneous,
        uploaded model)."""
        if not base.server_models:
            raise ConfigError(
                f"hparams.base = {hparams.base!r} has no server-side model for FedTAD to distil into; "
                "use a method that aggregates models (e.g. fedavg)"
            )
        return base

    def client_updates(self, ks: list[int], round_: int) -> dict[int, Upload]:
        """The base's uploads; a client's first one also carries its reliability ϕ_k."""
        uploads = self.base.client_updates(ks, round_)
        for k, upload in uploads.items():
            if k not in self.uploaded:
                self.uploaded.add(k)
                upload.extras = {**upload.extras, RELIABILITY: self.reliability[k]}
        return uploads

    def server_update(self, round_: int, uploads: dict[int, Upload]) -> None:
        base_uploads = {}
        for k, upload in uploads.items():
            if RELIABILITY in upload.extras:
                self.server_reliability[k] = upload.extras[RELIABILITY]
            extras = {n: t for n, t in upload.extras.items() if n != RELIABILITY}
            base_uploads[k] = dataclasses.replace(upload, extras=extras)
        self.base.server_update(round_, base_uploads)
        if self.hparams.distill_epochs == 0 or not base_uploads:
            return
        teachers = uploaded_teachers(self.base, base_uploads, self.hparams.fidelity == "code", self.fast)
        reliability = torch.stack([self.server_reliability[k] for k in base_uploads])
        weights = per_node_weights(reliability, self.pseudo_labels)
        if self.hparams.pseudo_graph == "real":  # only training nodes carry a label, hence a weight
            weights = weights.new_zeros(weights.size(0), self.real_x.size(0)).index_copy_(1, self.real_train, weights)
        for model in self.base.server_models():
            self._distill(model, teachers, weights)

    @property
    def fast(self) -> bool:
        """Whether the fast path runs (``train.engine`` is not ``sequential``)."""
        return self.federation.train.engine != "sequential"

    def _optimizer(self, model: nn.Module) -> KernelOptimizer:
        """The server model's distillation Adam, kept across rounds as in the authors' code
        (torch's fused implementation on the fast path)."""
        if model not in self.distill_optimizers:
            self.distill_optimizers[model] = KernelOptimizer(
                model.parameters(), lr=self.hparams.lr_distill, weight_decay=self.hparams.weight_decay,
                fused=self.fast or None,
            )
        return self.distill_optimizers[model]

    def __getstate__(self) -> dict:
        """Picklable (a run's checkpoint): the weak dictionary of optimisers goes as its pairs."""
        state = self.__dict__.copy()
        state["distill_optimizers"] = list(self.distill_optimizers.items())
        return state

    def __setstate__(self, state: dict) -> None:
        pairs = state.pop("distill_optimizers")
        self.__dict__.update(state)
        self.distill_optimizers = weakref.WeakKeyDictionary(pairs)

    def _distill(self, student: nn.Module, teachers: Teachers, weights: Tensor) -> None:
        """I epochs of I_g generator steps (maximise eq. 11) then I_d student steps (minimise it)."""
        hp = self.hparams
        labels = self.pseudo_labels
        dense = self.fast and dense_graph_fits(teachers, [student])

        def draw_batch() -> tuple[Tensor, Tensor]:
            if hp.pseudo_graph == "real":
                return self.real_x, self.real_adj
            z = torch.randn(labels.numel(), hp.noise_dim, generator=self.rng).to(labels.device)
            for _ in range(hp.generator_steps):
                self._generator_step(z, student, teachers, weights, dense)
            with torch.no_grad():
                x = self.generator(z, labels)
            return x, knn_pseudo_graph(x, hp.knn, dense)

        distill_students(
            [student], [self._optimizer(student)], hp.distill_epochs, hp.distill_steps, draw_batch,
            targets=teachers,
            student_loss=lambda logits, target: (weights * divergence(hp.divergence, logits, target)).sum(),
        )

    def _generator_step(self, z: Tensor, student: nn.Module, teachers: Teachers, weights: Tensor,
                        dense: bool = False) -> None:
        """One generator update: minimise λ1 L_sem + λ2 L_div - w L_diverg (eq. 8-11), on the
        pseudo graph as a dense operator if ``dense``."""
        hp = self.hparams
        labels = self.pseudo_labels
        self.generator.train()
        student.train(self.hparams.fidelity == "code").requires_grad_(False)
        self.generator_optimizer.zero_grad(set_to_none=True)
        x = self.generator(z, labels)
        adj = knn_pseudo_graph(x.detach(), hp.knn, dense)
        teacher_logits = teachers(x, adj)
        ce = F.cross_entropy(
            teacher_logits.flatten(0, 1), labels.repeat(len(teachers)), reduction="none"
        ).view(len(teachers), -1)
        loss_sem = (weights * ce).sum()
        loss_diverg = (weights * divergence(hp.divergence, student(x, adj), teacher_logits.detach())).sum()
        loss_div = diversity_loss(hp.diversity, z, x, self.fast)
        loss = hp.lambda_sem * loss_sem + hp.lambda_div * loss_div - hp.weight_diverg * loss_diverg
        loss.backward()
        self.generator_optimizer.step()
