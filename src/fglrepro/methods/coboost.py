"""Co-Boost (Dai et al., 2024): DENSE with the ensemble and the synthetic data improving
each other, adapted to node classification as O-pFGL (2025) adapts it (generated node
features, FedTAD's kNN pseudo graph).

Each epoch, after DENSE's generator steps:

- hard samples: every generated node moves by ``hard_eps`` along the sign of the gradient
  of the ensemble-student KL (one fast-gradient step that increases the disagreement);
- ensemble weights: one signed gradient step of size ``weight_lr`` on the cross-entropy of
  the weighted ensemble on the hard samples, then projection onto the simplex
  (non-negative, summing to 1);
- the students are distilled on the generated and the hard nodes together.

The fast path is DENSE's (stacked teachers, dense pseudo graphs, fused optimisers).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fglrepro.components.generator import Teachers, knn_pseudo_graph
from fglrepro.config import ConfigError
from fglrepro.fl.losses import kl_divergence
from fglrepro.fl.method import Federation
from fglrepro.methods import register
from fglrepro.methods.dense import DENSE, DENSEHparams


@dataclass(frozen=True)
class CoBoostHparams(DENSEHparams):
    """DENSE's settings plus:

    hard_eps: step of the hard-sample perturbation, in units of the generated features'
        standard deviation.
    weight_lr: step of the signed update of the ensemble weights.
    """

    hard_eps: float = 0.1
    weight_lr: float = 0.01

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.hard_eps < 0 or self.weight_lr < 0:
            raise ConfigError(f"hparams.hard_eps and weight_lr must be >= 0, got {self.hard_eps}, {self.weight_lr}")


def project_to_simplex(weights: Tensor) -> Tensor:
    """``[K]`` non-negative weights summing to 1 (uniform if all are clipped to 0)."""
    weights = weights.clamp_min(0.0)
    total = weights.sum()
    return weights / total if total > 0 else torch.full_like(weights, 1.0 / weights.numel())


@register("coboost")
class CoBoost(DENSE):
    """DENSE with learnable ensemble weights and hard-sample mining (module docstring)."""

    label = "Co-Boost"
    Hparams = CoBoostHparams

    def __init__(self, federation: Federation, hparams: CoBoostHparams) -> None:
        super().__init__(federation, hparams)
        self.weights: Tensor | None = None

    def ensemble_weights(self, num_teachers: int) -> Tensor:
        if self.weights is None or self.weights.numel() != num_teachers:
            self.weights = super().ensemble_weights(num_teachers)
        return self.weights

    def distillation_batch(self, students: list[nn.Module], teachers: Teachers, x: Tensor, adj: Tensor
                           ) -> tuple[Tensor, Tensor]:
        hard = self.hard_samples(students, teachers, x, adj)
        self.update_weights(teachers, hard, knn_pseudo_graph(hard, self.hparams.knn, self.dense_graph))
        both = torch.cat([x, hard])
        return both, knn_pseudo_graph(both, self.hparams.knn, self.dense_graph)

    def hard_samples(self, students: list[nn.Module], teachers: Teachers, x: Tensor, adj: Tensor) -> Tensor:
        """``[B, F]``: ``x + eps·std(x)·sign(∇_x KL(ensemble ‖ mean student))`` on the fixed graph ``adj``."""
        x = x.detach().requires_grad_(True)
        with torch.enable_grad():
            ens = self.ensemble(teachers, x, adj)
            student = torch.stack([s(x, adj) for s in students]).mean(0)
            (grad,) = torch.autograd.grad(kl_divergence(ens, student), x)
        return (x + self.hparams.hard_eps * x.std() * grad.sign()).detach()

    def update_weights(self, teachers: Teachers, x: Tensor, adj: Tensor) -> None:
        """One signed gradient step on the weighted ensemble's cross-entropy to the requested labels."""
        labels = self.pseudo_labels
        with torch.no_grad():
            logits = teachers(x, adj)
        weights = self.ensemble_weights(len(teachers)).clone().requires_grad_(True)
        with torch.enable_grad():
            loss = F.cross_entropy(torch.einsum("k,kbc->bc", weights, logits), labels)
            (grad,) = torch.autograd.grad(loss, weights)
        self.weights = project_to_simplex(weights.detach() - self.hparams.weight_lr * grad.sign())
