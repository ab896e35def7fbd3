"""FedGKD's client-side dynamic graph dataset distillation (Pan et al., NeurIPS 2023 GLFrontiers,
section 5.2.3 and Algorithm 2).

Each round the server broadcasts ``X0 [mC, D] ~ N(0, 1)`` and labels ``y0`` with m nodes per
class; each client learns ``X_s`` (from ``X0``) and soft labels ``y_s`` (from ``onehot(y0)``)
that its just-trained model fits (eq. 4). The distilled graph's edges are straight-through
binary-concrete samples of ``P[A_uv = 1] = sigmoid(<x_u, x_v> - gamma)`` (eq. 5-6).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fglrepro.fl.generator import balanced_labels
from fglrepro.fl.surrogate_graph import dense_normalized_adjacency


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
    rows, cols = torch.triu_indices(n, n, offset=1, device=x.device)
    logits = (x @ x.T)[rows, cols] - gamma
    noise = gumbel_noise((2, rows.numel()), generator).to(x.device, x.dtype)
    soft = torch.sigmoid((logits + noise[0] - noise[1]) / tau_g)
    hard = (soft > 0.5).to(soft.dtype)
    upper = hard + (soft - soft.detach())  # exactly 0/1 forward, the gradient of soft backward
    adj = x.new_zeros(n, n).index_put((rows, cols), upper)
    return adj + adj.T


def soft_cross_entropy(logits: Tensor, targets: Tensor) -> Tensor:
    """``-mean_u sum_c y_uc log softmax(logits)_uc`` for soft targets ``[n, C]``."""
    return -(targets * F.log_softmax(logits, dim=-1)).sum(dim=-1).mean()


def project_to_simplex_rows(y: Tensor) -> None:
    """Keep every row of ``y`` a distribution: negative entries to 0, rows rescaled to sum 1
    (a row that became all zero is set uniform); in place."""
    y.clamp_(min=0.0)
    sums = y.sum(dim=1, keepdim=True)
    y.copy_(torch.where(sums > 0, y / sums.clamp(min=1e-12), torch.full_like(y, 1.0 / y.size(1))))


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
    """A client's distilled graph after E_d steps.

    Attributes:
        x: ``[mC, D]`` features X_s. labels: ``[mC, C]`` soft labels y_s. adj: ``[mC, mC]``
        0/1 adjacency of the last step. hidden: ``[mC, d]`` embedding H_s of the model's GNN
        layers (the READOUT input) on ``(x, adj)``, eq. 7.
    """

    x: Tensor
    labels: Tensor
    adj: Tensor
    hidden: Tensor


def distill_graph(model: nn.Module, x0: Tensor, y0: Tensor, num_classes: int, settings: DistillSettings,
                  generator: torch.Generator) -> DistilledGraph:
    """Eq. 4 with the client's just-trained ``model`` fixed: learn ``X_s`` (from ``x0 [mC, D]``)
    and soft labels ``y_s`` (from ``onehot(y0)``) minimising the soft cross-entropy of
    ``model(X_s, norm(P(X_s)))`` against ``y_s``, with a fresh straight-through edge sample at
    each of ``settings.steps`` Adam steps (Algorithm 2); y_s is kept on the probability simplex
    by projection after each step. The model runs in evaluation mode (no dropout) and its
    parameters are not changed. Optimiser, learning rate, projection and evaluation mode are
    our choices (not stated in paper)."""
    was_training = model.training
    model.eval()
    params = list(model.parameters())
    flags = [p.requires_grad for p in params]
    for p in params:
        p.requires_grad_(False)
    x = x0.clone().requires_grad_(True)
    labels = F.one_hot(y0, num_classes).to(x0.dtype).requires_grad_(True)
    states = [{"m": torch.zeros_like(t), "v": torch.zeros_like(t)} for t in (x, labels)]
    try:
        for step in range(1, settings.steps + 1):
            adj = sample_edges(x, settings.gamma, settings.tau_g, generator)
            loss = soft_cross_entropy(model(x, dense_normalized_adjacency(adj)), labels)
            grads = torch.autograd.grad(loss, [x, labels])
            with torch.no_grad():
                for tensor, grad, state in zip((x, labels), grads, states):
                    adam_update(tensor, grad, state, step, settings.lr)
                project_to_simplex_rows(labels)
        with torch.no_grad():
            adj = sample_edges(x, settings.gamma, settings.tau_g, generator)
            hidden, _ = model(x, dense_normalized_adjacency(adj), return_hidden=True)
    finally:
        for p, flag in zip(params, flags):
            p.requires_grad_(flag)
        model.train(was_training)
    return DistilledGraph(x=x.detach(), labels=labels.detach(), adj=adj.detach(), hidden=hidden.detach())
