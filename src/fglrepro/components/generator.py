"""Server-side data-free pieces shared by generator-based distillation (FedTAD, DENSE,
Co-Boost): a class-conditional feature generator, balanced pseudo labels, the kNN
pseudo graph, diversity losses, the teachers as one function, and the distillation loop.

Fast path (``train.engine`` not ``sequential``): :class:`Teachers` runs the K uploaded GCNs
side by side on the one pseudo graph (:func:`side_by_side_logits`: the K first layers as one
``[F, K*H]`` product, every propagation of the K hidden states as one ``[B, K*H]`` product),
the pseudo graph is a dense ``[B, B]`` operator (``knn_pseudo_graph(..., dense=True)``: for a
hundred nodes cheaper than building and multiplying a sparse one), and
:func:`noise_diversity_loss` visits each pair of nodes once (``torch.pdist``, about 7x
faster than ``torch.cdist`` with p = 1 on CPU, forward and backward). All agree with the
sequential forms up to float rounding. The steps themselves stay sequential: each generator
or student step starts from the parameters the previous one left, so the generator and
student loops cannot be batched; what remains per step is dominated by the dense products
with the ``F``-wide generated features (generator head, the teachers' and students' first
layers), which no reordering removes.
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fglrepro.fl.clients import normalized_adjacency
from fglrepro.fl.engine import StackedGCN
from fglrepro.fl.kernel_optimizer import KernelOptimizer
from fglrepro.fl.method import FederatedMethod, Upload
from fglrepro.fl.training import Diverged
from fglrepro.models import GCN, bernoulli_dropout, propagate_once


class ConditionalGenerator(nn.Module):
    """``x̂ = P(z, y)``: label embedding ``[C]`` ‖ noise ``[noise_dim]`` -> MLP with Tanh
    -> node features ``[feat_dim]`` (FedTAD code: widths 64, 128, 256, label embedding C x C).

    Args:
        num_classes: C.
        feat_dim: F, feature size of the generated nodes.
        noise_dim: size of z.
        hidden: widths of the hidden layers.
    """

    def __init__(
        self, num_classes: int, feat_dim: int, noise_dim: int = 32, hidden: tuple[int, ...] = (64, 128, 256),
    ) -> None:
        super().__init__()
        self.noise_dim = noise_dim
        self.label_embedding = nn.Embedding(num_classes, num_classes)
        widths = [noise_dim + num_classes, *hidden]
        layers: list[nn.Module] = []
        for a, b in zip(widths[:-1], widths[1:]):
            layers += [nn.Linear(a, b), nn.Tanh()]
        self.body = nn.Sequential(*layers)
        self.head = nn.Linear(widths[-1], feat_dim)

    def forward(self, z: Tensor, labels: Tensor) -> Tensor:
        """``z [B, noise_dim]``, ``labels [B]`` -> features ``[B, F]``."""
        return self.head(self.body(torch.cat([self.label_embedding(labels), z], dim=-1)))


def seeded_generator(num_classes: int, feat_dim: int, noise_dim: int, rng: torch.Generator,
                     device: torch.device) -> ConditionalGenerator:
    """A :class:`ConditionalGenerator` initialised from a seed drawn from ``rng``, leaving
    torch's global random stream as it was."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(int(torch.randint(2**31, (1,), generator=rng)))
        return ConditionalGenerator(num_classes, feat_dim, noise_dim).to(device)


def balanced_labels(num_nodes: int, num_classes: int, device: torch.device | None = None) -> Tensor:
    """``[num_nodes]`` labels, ``num_nodes // C`` per class in order, the remainder on the
    last class (FedTAD code)."""
    per_class = torch.full((num_classes,), num_nodes // num_classes, dtype=torch.long)
    per_class[-1] += num_nodes - int(per_class.sum())
    return torch.repeat_interleave(torch.arange(num_classes), per_class).to(device)


@torch.no_grad()
def knn_pseudo_graph(x: Tensor, k: int, dense: bool = False) -> Tensor:
    """GCN-normalised adjacency ``[B, B]`` of the kNN graph on cosine similarity, sparse CSR
    or (``dense``) a dense tensor with the same values.

    Each node links to its ``k`` most similar nodes (itself included, as the similarity
    of a node with itself is maximal); the graph is symmetrised and self-loops added.
    The structure is constant: no gradient flows through it.
    """
    n = x.size(0)
    unit = F.normalize(x, dim=1)
    neighbours = (unit @ unit.t()).topk(min(k, n), dim=1).indices
    linked = torch.zeros(n, n, dtype=torch.bool, device=x.device).scatter_(1, neighbours, True)
    linked = (linked | linked.t()).fill_diagonal_(False)
    if not dense:
        return normalized_adjacency(linked.nonzero().t(), n)
    with_loops = linked.fill_diagonal_(True).float()
    inv_sqrt = with_loops.sum(dim=1).pow_(-0.5)
    return inv_sqrt.view(-1, 1) * with_loops * inv_sqrt.view(1, -1)


def noise_diversity_loss(z: Tensor, x: Tensor, fast: bool = False) -> Tensor:
    """Mode-seeking diversity (FedTAD code): ``exp(-mean_ij ||z_i - z_j||²_mean · |x_i - x_j|_mean)``.

    Small when pairs of noise vectors far apart generate features far apart.
    ``z [B, Z]``, ``x [B, F]`` -> scalar. ``fast``: the same mean from the pairs ``i < j``
    (the terms are symmetric and zero for ``i = j``), up to float rounding.
    """
    if fast:
        noise_dist = torch.pdist(z).pow(2) / z.size(1)
        feature_dist = torch.pdist(x, p=1) / x.size(1)
        return torch.exp(-2.0 * (noise_dist * feature_dist).sum() / x.size(0) ** 2)
    noise_dist = torch.cdist(z, z).pow(2) / z.size(1)
    feature_dist = torch.cdist(x, x, p=1) / x.size(1)
    return torch.exp(-(noise_dist * feature_dist).mean())


def cosine_diversity_loss(x: Tensor) -> Tensor:
    """Mean pairwise cosine similarity of generated features (FedTAD eq. 9). ``x [B, F]`` -> scalar."""
    unit = F.normalize(x, dim=1)
    return (unit @ unit.t()).mean()


DIVERSITY_LOSSES = ("noise_l1", "cosine")


def diversity_loss(kind: str, z: Tensor, x: Tensor, fast: bool = False) -> Tensor:
    """The diversity loss named ``kind`` (one of :data:`DIVERSITY_LOSSES`); ``fast`` as in
    :func:`noise_diversity_loss`."""
    return noise_diversity_loss(z, x, fast) if kind == "noise_l1" else cosine_diversity_loss(x)


def stackable(models: list[nn.Module]) -> bool:
    """Whether ``models`` are GCNs of one architecture without jumping knowledge, the
    models :class:`~fglrepro.fl.engine.StackedGCN` runs."""
    first = models[0]
    layout = [(name, p.shape) for name, p in first.named_parameters()]
    return all(
        type(m) is GCN and m.jk is None and m.dropout == first.dropout
        and [(name, p.shape) for name, p in m.named_parameters()] == layout
        for m in models
    )


def side_by_side_logits(model: StackedGCN, params: list[Tensor], first_weight: Tensor, x: Tensor, adj: Tensor,
                        training: bool) -> Tensor:
    r"""K GCNs of ``model``'s architecture (``params`` stacked ``[K, ...]``, engine layout) on
    one graph ``(x [B, F], adj [B, B])`` -> logits ``[K, B, C]``.

    The K hidden states lie side by side, ``H_l = [H_l^1 \| .. \| H_l^K]`` ``[B, K*D]``, so
    that each propagation :math:`\hat{A} H_l` is one product for all K, and the first layer is
    one product :math:`X [W_1^1 \| .. \| W_1^K]` with ``first_weight`` ``[F, K*H]`` (the first
    weights side by side); later layers multiply each teacher's block by its own weight (``bmm``).
    Dropout (``training``) draws one mask for all.
    """
    count, nodes = params[0].size(0), x.size(0)
    h = x @ first_weight
    for i in range(model.num_convs):
        weight, bias = (params[j] for j in model.layers[i])
        if i > 0:
            h = torch.bmm(h.view(nodes, count, -1).transpose(0, 1), weight).transpose(0, 1).reshape(nodes, -1)
        h = propagate_once(adj, h) + bias.reshape(-1)
        if i < model.num_convs - 1 or model.readout:
            h = F.relu(h)
            if training and model.dropout > 0:
                h = bernoulli_dropout(h, model.dropout)
    if model.readout:
        weight, bias = (params[j] for j in model.layers[-1])
        return torch.baddbmm(bias.unsqueeze(1), h.view(nodes, count, -1).transpose(0, 1), weight)
    return h.view(nodes, count, -1).transpose(0, 1)


class Teachers:
    """Frozen models as one function ``(x [B, F], adj [B, B]) -> logits [K, B, C]``.

    With ``batched`` and :func:`stackable` models, their parameters are stacked once and each
    call runs them side by side (:func:`side_by_side_logits`); otherwise each model runs in
    turn (the sequential path, and models of any other kind). Dropout is on when the (first)
    model is in training mode (the authors' FedTAD code).

    Args:
        models: the K teachers; their parameters must not change while this is used.
        batched: allow the stacked pass.
    """

    def __init__(self, models: list[nn.Module], batched: bool = False) -> None:
        self.models = models
        self.count, self.training = len(models), models[0].training
        self.stacked = StackedGCN(models[0]) if batched and stackable(models) else None
        self._stack(self.stacked.gather(models) if self.stacked is not None else [])

    @classmethod
    def stacked_from(cls, template: nn.Module, params: list[dict[str, Tensor]], training: bool) -> "Teachers":
        """Teachers of ``template``'s architecture (:func:`stackable`) holding ``params`` (one
        complete parameter dict each), stacked without building a model per teacher."""
        teachers = cls.__new__(cls)
        teachers.models, teachers.count, teachers.training = [], len(params), training
        teachers.stacked = StackedGCN(template)
        teachers._stack(teachers.stacked.gather(params))
        return teachers

    def _stack(self, params: list[Tensor]) -> None:
        """Keep the stacked ``params`` and the first-layer weights side by side ``[F, K*H]``."""
        self.params = params
        if params:
            first = params[self.stacked.layers[0][0]]
            self.first_weight = first.permute(1, 0, 2).reshape(first.size(1), -1).contiguous()

    def __len__(self) -> int:
        return self.count

    def __call__(self, x: Tensor, adj: Tensor) -> Tensor:
        if self.stacked is None:
            return torch.stack([m(x, adj) for m in self.models])
        return side_by_side_logits(self.stacked, self.params, self.first_weight, x, adj, self.training)


def dense_graph_fits(teachers: Teachers, students: list[nn.Module]) -> bool:
    """Whether the teachers and ``students`` all take a dense pseudo graph: stacked teachers
    (:func:`side_by_side_logits`) or GCNs, whose layers multiply a dense operator as well as a
    sparse one (other architectures read edges from a sparse one)."""
    return all(isinstance(m, GCN) for m in [*teachers.models, *students])


def uploaded_teachers(method: FederatedMethod, uploads: dict[int, Upload], training: bool, batched: bool
                      ) -> Teachers:
    """The uploaded local models as frozen :class:`Teachers` (in training mode if ``training``),
    rebuilt by ``method.teacher_model``. With ``batched``, when that is the default rebuild
    (the federation's model holding a complete upload), they are stacked straight from the
    uploads without building a model per teacher."""
    template = method.federation.model
    names = {name for name, _ in template.named_parameters()}
    if (batched and method.federation.client_models is None and stackable([template])
            and type(method).teacher_model is FederatedMethod.teacher_model
            and all(names <= set(u.params) for u in uploads.values())):
        return Teachers.stacked_from(template, [u.params for u in uploads.values()], training)
    models = [method.teacher_model(k, u).train(training).requires_grad_(False) for k, u in uploads.items()]
    return Teachers(models, batched)


def distill_students(
    students: list[nn.Module], optimizers: list[KernelOptimizer], epochs: int, steps: int,
    draw_batch: Callable[[], tuple[Tensor, Tensor]], targets: Callable[[Tensor, Tensor], Tensor],
    student_loss: Callable[[Tensor, Tensor], Tensor], clip_norm: float = 0.0,
) -> None:
    """The loop of data-free distillation, in place: each of ``epochs`` draws a batch, the
    graph ``(x [B, F], adj [B, B])`` returned by ``draw_batch`` (which runs the epoch's
    generator steps), takes the teachers' ``targets(x, adj)`` without gradient, then gives
    every student ``steps`` optimiser steps on ``student_loss(student(x, adj), targets)``
    in training mode, each gradient clipped to L2 norm ``clip_norm`` if it is positive
    (:func:`torch.nn.utils.clip_grad_norm_`). A student whose last loss of an epoch is not finite raises
    :class:`~fglrepro.fl.training.Diverged` naming the student and the epoch (otherwise the run
    would go on with NaN weights and fail later, where the cause is not visible)."""
    for epoch in range(epochs):
        x, adj = draw_batch()
        with torch.no_grad():
            target = targets(x, adj)
        for index, (student, optimizer) in enumerate(zip(students, optimizers)):
            student.train().requires_grad_(True)
            loss = None
            for _ in range(steps):
                optimizer.zero_grad(set_to_none=True)
                loss = student_loss(student(x, adj), target)
                loss.backward()
                if clip_norm > 0:
                    torch.nn.utils.clip_grad_norm_(student.parameters(), clip_norm)
                optimizer.step()
            if loss is not None and not torch.isfinite(loss.detach()):
                raise Diverged(f"server distillation: student {index}'s loss became {loss.item()} in "
                               f"distillation epoch {epoch + 1} of {epochs}")
