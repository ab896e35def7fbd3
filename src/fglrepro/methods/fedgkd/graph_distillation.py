"""FedGKD's client-side dynamic graph dataset distillation (Pan et al., NeurIPS 2023 GLFrontiers,
section 5.2.3 and Algorithm 2).

Each round the server broadcasts ``X0 [mC, D] ~ N(0, 1)`` and labels ``y0`` with m nodes per
class; each client learns ``X_s`` (from ``X0``) and soft labels ``y_s`` (from ``onehot(y0)``)
that its just-trained model fits (eq. 4). The distilled graph's edges are straight-through
binary-concrete samples of ``P[A_uv = 1] = sigmoid(<x_u, x_v> - gamma)`` (eq. 5-6).

The distillation runs in float64 (:data:`DTYPE`; the model's parameters are cast, the Gumbel noise
is drawn as before and cast): its hard edge threshold and Adam's normalised steps turn float32
rounding differences between machines (e.g. AVX2 vs AVX-512 kernels of ``log_softmax``) into
differences of up to ~1e-3 in X_s, which FedGKD's server step then spreads over every model; in
float64 they stay ~1e-12 and vanish when the task feature is rounded to float32 for the upload.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fglrepro.components.generator import balanced_labels
from fglrepro.components.surrogate_graph import dense_normalized_adjacency

if TYPE_CHECKING:
    from fglrepro.fl.engine import StackedGCN


#: dtype of the distillation (X_s, y_s, the model's forward pass on the distilled graph).
DTYPE = torch.float64


@dataclass(frozen=True)
class DistillSettings:
    """Distillation schedule: ``steps`` (E_d) Adam steps with learning rate ``lr`` on X_s and y_s;
    edge sparsity ``gamma`` and Gumbel temperature ``tau_g`` of eq. 6."""

    steps: int
    lr: float
    gamma: float
    tau_g: float


def broadcast_graph(per_class: int, num_classes: int, num_features: int,
                    generator: torch.Generator) -> tuple[Tensor, Tensor]:
    """The server's initial distilled graph: ``X0 [mC, D]`` with N(0, 1) entries drawn from
    ``generator`` and labels ``y0 [mC]``, ``per_class`` (m) nodes of each class."""
    num_nodes = per_class * num_classes
    x0 = torch.randn(num_nodes, num_features, generator=generator)
    return x0, balanced_labels(num_nodes, num_classes)


def gumbel_noise(shape: tuple[int, ...], generator: torch.Generator) -> Tensor:
    """Standard Gumbel samples ``-log(-log u)``, ``u ~ U(0, 1)``, drawn from ``generator``."""
    u = torch.rand(shape, generator=generator).clamp_(1e-10, 1.0 - 1e-10)
    return -torch.log(-torch.log(u))


def sample_edges(x: Tensor, gamma: float, tau_g: float, generator: torch.Generator) -> Tensor:
    r"""Straight-through sample of the distilled graph's adjacency ``P [n, n]`` (eq. 5-6):

    .. math:: p_{uv} = \sigma\big((\langle x_u, x_v\rangle - \gamma + \omega - \omega')/\tau_g\big),
        \quad \omega, \omega' \sim \mathrm{Gumbel}(0, 1),

    forward ``1[p_uv > 1/2]`` (a 0/1 matrix), backward the gradient of ``p_uv``. Pairs ``u < v``
    are sampled once and mirrored (a symmetric graph); the diagonal is 0 (self-loops come with
    the normalisation). Symmetry and the zero diagonal are our choices (not stated in paper).

    Args:
        x: ``[n, D]`` node features (differentiable).
    """
    n = x.size(0)
    noise = gumbel_noise((2, n * (n - 1) // 2), generator).to(x.device, x.dtype)
    return straight_through_edges(x @ x.T, noise, gamma, tau_g)


def straight_through_edges(inner: Tensor, noise: Tensor, gamma: float, tau_g: float) -> Tensor:
    """:func:`sample_edges` from the inner products ``inner [..., n, n]`` of the node features
    (``X X^T``, differentiable) and the Gumbel ``noise [..., 2, n(n-1)/2]`` (row 0 omega, row 1
    omega', pairs in :func:`torch.triu_indices` order), for one graph or a batch of graphs;
    ``[..., n, n]``."""
    n = inner.size(-1)
    rows, cols = torch.triu_indices(n, n, offset=1, device=inner.device)
    logits = inner[..., rows, cols] - gamma
    soft = torch.sigmoid((logits + noise[..., 0, :] - noise[..., 1, :]) / tau_g)
    hard = (soft > 0.5).to(soft.dtype)
    upper = hard + (soft - soft.detach())  # exactly 0/1 forward, the gradient of soft backward
    adj = inner.new_zeros(inner.shape)
    adj[..., rows, cols] = upper
    return adj + adj.transpose(-1, -2)


class _Gram(torch.autograd.Function):
    """``X X^T`` for ``X [m, n, D]``, its gradient ``(G + G^T) X`` as one batched product
    (autograd's two products, one per factor, cost twice as much)."""

    @staticmethod
    def forward(ctx, x: Tensor) -> Tensor:
        ctx.save_for_backward(x)
        return torch.bmm(x, x.transpose(1, 2))

    @staticmethod
    def backward(ctx, grad: Tensor) -> Tensor:
        (x,) = ctx.saved_tensors
        return torch.bmm(grad + grad.transpose(1, 2), x)


def soft_cross_entropy(logits: Tensor, targets: Tensor) -> Tensor:
    """``-mean_u sum_c y_uc log softmax(logits)_uc`` for soft targets ``[n, C]``."""
    return -(targets * F.log_softmax(logits, dim=-1)).sum(dim=-1).mean()


def project_to_simplex_rows(y: Tensor) -> None:
    """Keep every row of ``y [..., n, C]`` a distribution: negative entries to 0, rows rescaled
    to sum 1 (a row that became all zero is set uniform); in place."""
    y.clamp_(min=0.0)
    sums = y.sum(dim=-1, keepdim=True)
    y.copy_(torch.where(sums > 0, y / sums.clamp(min=1e-12), torch.full_like(y, 1.0 / y.size(-1))))


def adam_update(param: Tensor, grad: Tensor, state: dict[str, Tensor], step: int, lr: float,
                betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8) -> None:
    """One Adam step on ``param`` in place (``state`` holds its moments ``m``, ``v``; ``step``
    counts from 1). Written out because constructing a ``torch.optim.Adam`` for two tensors
    costs more than the few distillation steps themselves."""
    m, v = state["m"], state["v"]
    m.mul_(betas[0]).add_(grad, alpha=1 - betas[0])
    v.mul_(betas[1]).addcmul_(grad, grad, value=1 - betas[1])
    denom = (v / (1 - betas[1] ** step)).sqrt_().add_(eps)
    param.addcdiv_(m, denom, value=-lr / (1 - betas[0] ** step))


@dataclass
class DistilledGraph:
    """A client's distilled graph after E_d steps (with a leading client dimension ``[m, ...]``
    when several clients distilled together, :func:`distill_graphs`).

    Attributes:
        x: ``[mC, D]`` features X_s. labels: ``[mC, C]`` soft labels y_s. adj: ``[mC, mC]``
        0/1 adjacency of the last step. hidden: ``[mC, d]`` embedding H_s of the model's GNN
        layers (the READOUT input) on ``(x, adj)``, eq. 7.
    """

    x: Tensor
    labels: Tensor
    adj: Tensor
    hidden: Tensor


@dataclass
class _Problem:
    """What differs between one client's distillation and a batch of them.

    Attributes:
        forward: ``(X_s, P) -> (H_s, logits)``, the fixed model on the distilled graph (raw
            0/1 adjacency P). loss: ``(logits, y_s) -> `` the loss to differentiate.
        gram: ``X_s -> X_s X_s^T``. noise: ``() ->`` the next edge sample's Gumbel noise.
    """

    forward: Callable[[Tensor, Tensor], tuple[Tensor, Tensor]]
    loss: Callable[[Tensor, Tensor], Tensor]
    gram: Callable[[Tensor], Tensor]
    noise: Callable[[], Tensor]


def distill_graph(model: nn.Module, x0: Tensor, y0: Tensor, num_classes: int, settings: DistillSettings,
                  generator: torch.Generator) -> DistilledGraph:
    """Eq. 4 with the client's just-trained ``model`` fixed: learn ``X_s`` (from ``x0 [mC, D]``)
    and soft labels ``y_s`` (from ``onehot(y0)``) minimising the soft cross-entropy of
    ``model(X_s, norm(P(X_s)))`` against ``y_s``, with a fresh straight-through edge sample at
    each of ``settings.steps`` Adam steps (Algorithm 2); y_s is kept on the probability simplex
    by projection after each step. The model runs in evaluation mode (no dropout) with its
    parameters cast to :data:`DTYPE` (the model is not changed); the returned graph is in
    :data:`DTYPE`. Optimiser, learning rate, projection and evaluation mode are our choices (not
    stated in paper)."""
    was_training = model.training
    model.eval()
    weights = {name: t.detach().to(DTYPE) if t.is_floating_point() else t
               for name, t in [*model.named_parameters(), *model.named_buffers()]}
    num_pairs = x0.size(0) * (x0.size(0) - 1) // 2
    try:
        problem = _Problem(
            forward=lambda x, adj: torch.func.functional_call(model, weights, (x, dense_normalized_adjacency(adj)),
                                                              {"return_hidden": True}),
            loss=soft_cross_entropy, gram=lambda x: x @ x.T,
            noise=lambda: gumbel_noise((2, num_pairs), generator).to(x0.device, DTYPE),
        )
        return _distill(problem, x0.to(DTYPE), F.one_hot(y0, num_classes).to(DTYPE), settings)
    finally:
        model.train(was_training)


def distill_graphs(model: StackedGCN, params: list[Tensor], x0: Tensor, y0: Tensor, num_classes: int,
                   settings: DistillSettings, generator: torch.Generator) -> DistilledGraph:
    """:func:`distill_graph` for m clients' GCNs at once: their problems share ``x0 [mC, D]``
    and ``y0``, so X_s ``[m, mC, D]`` and y_s ``[m, mC, C]`` are optimised together (batched
    products, one backward pass of the sum of the clients' losses, each client's gradient its
    own; ``X_s X_s^T`` with a one-product gradient). The Gumbel noise is drawn client by
    client, step by step, from ``generator``: the numbers :func:`distill_graph` draws for the
    same clients in turn, so both agree up to float64 rounding.

    Args:
        model: the clients' architecture; ``params`` its parameters stacked over the m clients
            (engine layout, :class:`~fglrepro.fl.engine.StackedGCN`; not changed).
    """
    m, n = params[0].size(0), x0.size(0)
    params = [p.detach().to(DTYPE) for p in params]
    noise = gumbel_noise((m, settings.steps + 1, 2, n * (n - 1) // 2), generator).to(x0.device, DTYPE)
    draws = iter(noise.unbind(dim=1))
    normalise = torch.vmap(dense_normalized_adjacency)
    problem = _Problem(forward=lambda x, adj: dense_stacked_gcn(model, params, x, normalise(adj)),
                       loss=batched_soft_cross_entropy, gram=_Gram.apply, noise=lambda: next(draws))
    labels0 = F.one_hot(y0, num_classes).to(DTYPE)
    return _distill(problem, x0.to(DTYPE).expand(m, -1, -1), labels0.expand(m, -1, -1), settings)


def _distill(problem: _Problem, x0: Tensor, labels0: Tensor, settings: DistillSettings) -> DistilledGraph:
    """The distillation loop of :func:`distill_graph` on ``x0 [..., mC, D]`` and soft labels
    ``labels0 [..., mC, C]``."""
    x = x0.clone().requires_grad_(True)
    labels = labels0.clone().requires_grad_(True)
    states = [{"m": torch.zeros_like(t), "v": torch.zeros_like(t)} for t in (x, labels)]
    for step in range(1, settings.steps + 1):
        adj = straight_through_edges(problem.gram(x), problem.noise(), settings.gamma, settings.tau_g)
        loss = problem.loss(problem.forward(x, adj)[1], labels)
        grads = torch.autograd.grad(loss, [x, labels])
        with torch.no_grad():
            for tensor, grad, state in zip((x, labels), grads, states):
                adam_update(tensor, grad, state, step, settings.lr)
            project_to_simplex_rows(labels)
    with torch.no_grad():
        adj = straight_through_edges(problem.gram(x), problem.noise(), settings.gamma, settings.tau_g)
        hidden, _ = problem.forward(x, adj)
    return DistilledGraph(x=x.detach(), labels=labels.detach(), adj=adj.detach(), hidden=hidden.detach())


def batched_soft_cross_entropy(logits: Tensor, targets: Tensor) -> Tensor:
    """Sum over graphs of :func:`soft_cross_entropy` for ``[m, n, C]`` logits and targets."""
    return -(targets * F.log_softmax(logits, dim=-1)).sum(dim=-1).mean(dim=-1).sum()


def dense_stacked_gcn(model: StackedGCN, params: list[Tensor], x: Tensor, adj: Tensor) -> tuple[Tensor, Tensor]:
    """The GCN of :class:`~fglrepro.models.GCN` in evaluation mode (no dropout) for m clients
    on m dense graphs: ``x [m, n, D]``, normalised ``adj [m, n, n]`` (differentiable), client
    k's parameters row k of ``params`` (engine layout). Returns ``(hidden, logits)`` as
    ``GCN.forward(..., return_hidden=True)``: hidden ``[m, n, d]`` is the input of the last
    layer (the READOUT input), logits ``[m, n, C]``."""
    h = hidden = x
    for i in range(model.num_convs):
        weight, bias = (params[j] for j in model.layers[i])
        hidden = h
        h = torch.baddbmm(bias.unsqueeze(1), adj, torch.bmm(h, weight))
        if i < model.num_convs - 1 or model.readout:
            h = F.relu(h)
    if model.readout:
        hidden = h
        weight, bias = (params[j] for j in model.layers[-1])
        h = torch.baddbmm(bias.unsqueeze(1), h, weight)
    return hidden, h
