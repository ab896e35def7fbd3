"""Server-side generation of a small surrogate graph matching pooled class statistics
(O-pFGL eqs. 9-11, following the SimGC-style condensation of the authors' code).

Node features ``X' [n', F]`` start from N(0, 1); the weighted adjacency ``A' [n', n']`` comes
from a link predictor (eq. 9): ``sigmoid((g(x_i||x_j) + g(x_j||x_i)) / 2)``, diagonal zeroed,
weights below ``delta`` set to 0 (the surviving edges keep their weight, as in the authors'
code, so that gradients reach the predictor). ``X'`` and the predictor minimise
``alignment_weight * L_align + smoothness_weight * L_smt`` in cycles of predictor steps
followed by feature steps.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from functools import partial

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fglrepro.components.class_statistics import ClassStatistics, propagate_features
from fglrepro.config import choice
from fglrepro.fl.communication import tensor_bytes
from fglrepro.fl.kernel_optimizer import KernelOptimizer
from fglrepro.models import WeightedEdges

#: The link-predictor designs of the paper's Table 10.
LINK_PREDICTORS = ("mlp", "direct", "inner_product")


class MLPLinkPredictor(nn.Module):
    """The paper's g_theta: MLP ``[x_i || x_j] (2F) -> hidden -> hidden -> 1`` with
    BatchNorm + ReLU, scoring all ``n'^2`` ordered pairs. BatchNorm always uses the batch
    statistics of the pairs (the authors never switch it to eval mode).

    With ``factorised`` the first layer is applied to the nodes rather than the pairs:
    ``W [x_i || x_j] + b = (W_i x_i + b) + W_j x_j`` for the two column blocks ``W_i, W_j
    [hidden, F]`` of ``W``, ``n'`` times fewer products (same values up to float rounding);
    one product with ``W`` viewed as ``[2 hidden, F]`` (rows ``W_i[r], W_j[r]`` interleaved)
    gives both.
    """

    def __init__(self, num_features: int, hidden: int = 128, factorised: bool = False) -> None:
        super().__init__()
        self.factorised = factorised
        self.net = nn.Sequential(
            nn.Linear(2 * num_features, hidden), nn.BatchNorm1d(hidden), nn.ReLU(),
            nn.Linear(hidden, hidden), nn.BatchNorm1d(hidden), nn.ReLU(),
            nn.Linear(hidden, 1),
        )

    def forward(self, x: Tensor) -> Tensor:
        """``x [n, F]`` -> symmetrised pair scores ``[n, n]`` (before the sigmoid)."""
        n = x.size(0)
        if self.factorised:
            first = self.net[0]
            width = first.out_features
            halves = F.linear(x, first.weight.view(2 * width, -1)).view(n, width, 2)
            hidden = (halves[:, :, 0] + first.bias).unsqueeze(1) + halves[:, :, 1].unsqueeze(0)
            scores = self.net[1:](hidden.view(n * n, width)).view(n, n)
        else:
            pairs = torch.cat([x.repeat_interleave(n, dim=0), x.repeat(n, 1)], dim=1)
            scores = self.net(pairs).view(n, n)
        return (scores + scores.T) / 2


class DirectAdjacency(nn.Module):
    """Table 10 "directly optimize A'": a free ``[n, n]`` score matrix, symmetrised
    (initialised N(0, 1) from ``generator``)."""

    def __init__(self, num_nodes: int, generator: torch.Generator) -> None:
        super().__init__()
        self.scores = nn.Parameter(torch.randn(num_nodes, num_nodes, generator=generator))

    def forward(self, x: Tensor) -> Tensor:
        return (self.scores + self.scores.T) / 2


class InnerProductAdjacency(nn.Module):
    """Table 10 "A' = <x_i, x_j>": cosine similarity of the features, used as the edge
    weight directly (no sigmoid, so ``delta`` keeps the pairs with similarity >= delta);
    has no parameters, only ``X'`` is learned."""

    def forward(self, x: Tensor) -> Tensor:
        unit = F.normalize(x, dim=1)
        return unit @ unit.T


def edge_weights(predictor: nn.Module, x: Tensor, delta: float) -> Tensor:
    """Eq. 9: weighted adjacency ``[n, n]``: symmetric, zero diagonal, entries < delta -> 0."""
    scores = predictor(x)
    weights = scores if isinstance(predictor, InnerProductAdjacency) else torch.sigmoid(scores)
    weights = weights * (1 - torch.eye(x.size(0), dtype=weights.dtype, device=weights.device))
    return weights * (weights >= delta)


def dense_normalized_adjacency(weights: Tensor) -> Tensor:
    """``D^-1/2 (W + I) D^-1/2`` of a dense weighted adjacency ``W [..., n, n]`` with zero
    diagonal (dense ``[..., n, n]``, differentiable; a batch of graphs on leading dimensions)."""
    with_loops = weights + torch.eye(weights.size(-1), dtype=weights.dtype, device=weights.device)
    inv_sqrt = with_loops.sum(dim=-1).pow(-0.5)
    return inv_sqrt.unsqueeze(-1) * with_loops * inv_sqrt.unsqueeze(-2)


def kink_safe_sqrt(value: Tensor) -> Tensor:
    """``sqrt(value)`` for ``value >= 0`` with gradient 0 where ``value`` is 0 instead of NaN (``0 * inf``),
    as ``torch.std``'s own gradient: the standard deviation of a class's surrogate features has a kink
    where they are equal in a dimension (two nodes per class meet there while matching a target std
    of 0). The same values and gradients, bit for bit, wherever ``value > 0``."""
    positive = value > 0
    return torch.where(positive, value, torch.ones_like(value)).sqrt() * positive


def alignment_loss(features: Tensor, labels: Tensor, target: ClassStatistics) -> Tensor:
    """Eq. 10 as in the authors' code: ``sum_c lambda_c (MSE(mu'_c, mu_c) + MSE(s'_c, s_c))``
    with ``lambda_c = N^c / sum N``, MSE averaged over the D dimensions and ``s`` the
    standard deviation; the std term is skipped for classes with one surrogate node, and
    classes absent from ``target`` (count 0) are skipped.

    Args:
        features: ``[n', D]`` propagated surrogate features.
        labels: ``[n']`` surrogate labels.
        target: pooled statistics, ``mean``/``var`` ``[C, D]``.
    """
    share = (target.count / target.count.sum()).to(features.device)
    loss = features.new_zeros(())
    for c in range(target.count.numel()):
        rows = features[labels == c]
        if target.count[c] == 0 or rows.size(0) == 0:
            continue
        term = F.mse_loss(rows.mean(dim=0), target.mean[c].to(rows))
        if rows.size(0) > 1:
            term = term + F.mse_loss(rows.std(dim=0), target.var[c].sqrt().to(rows))
        loss = loss + share[c].to(rows.dtype) * term
    return loss


class BatchedAlignment:
    """:func:`alignment_loss` of all classes at once (the same value up to float rounding),
    its label-dependent parts computed once.

    Args:
        labels: ``[n']`` surrogate labels.
        target: pooled statistics, ``mean``/``var`` ``[C, D]``, on the features' device and dtype.
    """

    def __init__(self, labels: Tensor, target: ClassStatistics) -> None:
        self.labels = labels
        self.members = F.one_hot(labels, target.count.numel()).T.to(target.mean.dtype)  # [C, n']
        sizes = self.members.sum(dim=1)
        self.inverse_sizes = 1.0 / sizes.clamp(min=1).unsqueeze(1)
        self.target_mean = target.mean
        # the std term: classes with several nodes, their members, 1 / (size - 1), target std
        self.several = (sizes > 1).nonzero().flatten()
        self.several_members = self.members[self.several]
        self.several_inverse = 1.0 / (sizes[self.several] - 1).unsqueeze(1)
        self.target_std = target.var[self.several].sqrt()
        used = (target.count > 0) & (sizes > 0)
        self.weights = torch.where(used, target.count / target.count.sum(), 0.0)  # lambda_c, 0 if skipped

    def __call__(self, features: Tensor) -> Tensor:
        """``features [n', D]`` (propagated) -> the loss (scalar)."""
        means = self.members @ features * self.inverse_sizes
        terms = (means - self.target_mean).pow(2).mean(dim=1)
        if self.several.numel():
            spread = self.several_members @ (features - means[self.labels]).pow(2) * self.several_inverse
            terms = terms.index_add(0, self.several, (kink_safe_sqrt(spread) - self.target_std).pow(2).mean(dim=1))
        return (self.weights * terms).sum()


def smoothness_loss(x: Tensor, weights: Tensor) -> Tensor:
    """Eq. 11 as in the authors' code: ``sum_ij A'_ij k(x_i, x_j) / sum_ij A'_ij`` with
    ``k = mean_d exp(-(x_id - x_jd)^2 / 2)`` (the per-dimension mean keeps the kernel away
    from 0 in high dimension); 0 for a graph without edges.

    Args:
        x: ``[n, F]`` surrogate features.
        weights: ``[n, n]`` weighted adjacency.
    """
    total = weights.sum()
    if total == 0:
        return total
    kernel = torch.exp(-0.5 * (x.unsqueeze(1) - x.unsqueeze(0)) ** 2).mean(dim=2)
    return (weights * kernel).sum() / total


class UpperSmoothness:
    """:func:`smoothness_loss` over the pairs ``i < j`` of ``num_nodes`` nodes only: weights
    and kernel are symmetric and the diagonal of the weights is zero, so the ratio is the
    same (up to float rounding) with half the kernel evaluations."""

    def __init__(self, num_nodes: int, device: torch.device | None = None) -> None:
        self.first, self.second = torch.triu_indices(num_nodes, num_nodes, offset=1, device=device)

    def __call__(self, x: Tensor, weights: Tensor) -> Tensor:
        """``x [n, F]``, ``weights [n, n]`` -> the loss (scalar)."""
        upper = weights[self.first, self.second]
        total = upper.sum()
        if total == 0:
            return total
        kernel = torch.exp(-0.5 * (x[self.first] - x[self.second]) ** 2).mean(dim=1)
        return (upper * kernel).sum() / total


@dataclass(frozen=True)
class SurrogateSettings:
    """Generation schedule (defaults: the authors' code / SimGC).

    Attributes:
        link_predictor: one of :data:`LINK_PREDICTORS`.
        hidden: width of the MLP predictor (128).
        delta: edge threshold (0.01).
        iterations: optimisation steps in all (3000).
        predictor_steps, feature_steps: each cycle of ``predictor_steps + feature_steps``
            iterations first updates the predictor, then X' (10 + 40).
        predictor_lr, feature_lr: Adam learning rates (1e-3, 5e-3).
        alignment_weight, smoothness_weight: loss weights (10, 0.1).
        hops: feature propagation depth h of eq. 4 (1).
    """

    link_predictor: str = "mlp"
    hidden: int = 128
    delta: float = 0.01
    iterations: int = 3000
    predictor_steps: int = 10
    feature_steps: int = 40
    predictor_lr: float = 1e-3
    feature_lr: float = 5e-3
    alignment_weight: float = 10.0
    smoothness_weight: float = 0.1
    hops: int = 1


@dataclass
class SurrogateGraph:
    """The graph the server sends: ``x [n', F]``, weighted adjacency ``weights [n', n']``
    (symmetric, zero diagonal), labels ``y [n']``."""

    x: Tensor
    weights: Tensor
    y: Tensor

    def normalized_adjacency(self) -> Tensor:
        """Sparse CSR GCN operator ``D^-1/2 (A' + I) D^-1/2`` for ``model(x, adj)``."""
        return dense_normalized_adjacency(self.weights).to_sparse_csr()

    def graph_for(self, model: nn.Module) -> Tensor | WeightedEdges:
        """The graph ``model`` takes, ``model(x, graph_for(model))``: the weighted edges of
        ``A'`` for a model that reads edge weights (GAT, :attr:`~fglrepro.models.PyGNet.takes_edge_weights`),
        else :meth:`normalized_adjacency`. A model that reads only the pattern of the operator
        would see every pair above ``delta`` (all pairs, as a rule) as an edge of weight 1."""
        if getattr(model, "takes_edge_weights", False):
            return WeightedEdges.of_dense(self.weights)
        return self.normalized_adjacency()

    @property
    def num_bytes(self) -> int:
        return tensor_bytes((self.x, self.weights, self.y))


def build_link_predictor(
    name: str, num_nodes: int, num_features: int, hidden: int, generator: torch.Generator,
    factorised: bool = False,
) -> nn.Module:
    """The predictor named ``name`` (one of :data:`LINK_PREDICTORS`); ``factorised`` as
    :class:`MLPLinkPredictor`."""
    choice(name, LINK_PREDICTORS, "link_predictor")
    if name == "mlp":
        return MLPLinkPredictor(num_features, hidden, factorised)
    if name == "direct":
        return DirectAdjacency(num_nodes, generator)
    return InnerProductAdjacency()


def generate_surrogate_graph(
    target: ClassStatistics, nodes_per_class: list[int], num_features: int,
    settings: SurrogateSettings, generator: torch.Generator, device: torch.device | None = None,
    fast: bool = False,
) -> SurrogateGraph:
    """Optimise, on ``device``, a surrogate graph with ``nodes_per_class[c]`` nodes of class
    ``c`` whose propagated features match ``target`` (pooled statistics of dimension
    (h+1) F); random initial values come from the CPU ``generator``.

    ``fast`` computes the same steps up to float rounding with fewer operations: the MLP
    predictor's first layer factorised (:class:`MLPLinkPredictor`), the alignment loss of all
    classes at once (:class:`BatchedAlignment`), the smoothness kernel of each unordered pair
    once (:class:`UpperSmoothness`), gradients only for what the step updates, fused Adam,
    and no predictor steps for a predictor without parameters (they change nothing).
    """
    labels = torch.repeat_interleave(torch.arange(len(nodes_per_class)), torch.tensor(nodes_per_class))
    x = nn.Parameter(torch.randn(labels.numel(), num_features, generator=generator).to(device))
    predictor = build_link_predictor(settings.link_predictor, labels.numel(), num_features,
                                     settings.hidden, generator, factorised=fast).to(device)
    labels = labels.to(device)
    target = ClassStatistics(**{
        f.name: getattr(target, f.name).to(device, torch.float32) for f in fields(target)
    })
    fused = True if fast else None
    feature_opt = KernelOptimizer([x], lr=settings.feature_lr, fused=fused)
    predictor_params = list(predictor.parameters())
    predictor_opt = (KernelOptimizer(predictor_params, lr=settings.predictor_lr, fused=fused)
                     if predictor_params else None)
    if fast:
        align, smoothness = BatchedAlignment(labels, target), UpperSmoothness(labels.numel(), device)
    else:
        align, smoothness = partial(alignment_loss, labels=labels, target=target), smoothness_loss
    cycle = settings.predictor_steps + settings.feature_steps
    for step in range(settings.iterations):
        predictor_step = step % cycle < settings.predictor_steps
        optimizer, updated = (predictor_opt, predictor_params) if predictor_step else (feature_opt, [x])
        if fast and optimizer is None:
            continue
        if not fast:
            feature_opt.zero_grad(set_to_none=True)
            if predictor_opt is not None:
                predictor_opt.zero_grad(set_to_none=True)
        weights = edge_weights(predictor, x, settings.delta)
        propagated = propagate_features(x, dense_normalized_adjacency(weights), settings.hops)
        loss = (settings.alignment_weight * align(propagated)
                + settings.smoothness_weight * smoothness(x, weights))
        if fast:
            for param, grad in zip(updated, torch.autograd.grad(loss, updated)):
                param.grad = grad
        else:
            loss.backward()
        if optimizer is not None:
            optimizer.step()
    with torch.no_grad():
        weights = edge_weights(predictor, x, settings.delta)
    return SurrogateGraph(x.detach().clone(), weights.detach().clone(), labels)
