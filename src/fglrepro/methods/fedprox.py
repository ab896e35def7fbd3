"""FedProx (Li et al., 2020): FedAvg plus a proximal term to the received global model."""

from __future__ import annotations

from dataclasses import dataclass

from fglrepro.fl.aggregation import parameters_of
from fglrepro.fl.losses import proximal_term
from fglrepro.fl.method import ParameterAveraging
from fglrepro.fl.training import ExtraLoss
from fglrepro.methods import register


@dataclass(frozen=True)
class FedProxHparams:
    """mu: weight of ``mu/2 * ||w - w_global||^2`` (OpenFGL default 0.01)."""

    mu: float = 0.01


@register("fedprox")
class FedProx(ParameterAveraging):
    """Local loss = CE + mu/2 ||w - w_t||^2, with w_t the model received this round."""

    label = "FedProx"
    Hparams = FedProxHparams

    def extra_loss(self, k: int) -> ExtraLoss:
        reference = parameters_of(self.global_model)
        mu = self.hparams.mu
        return lambda model: 0.5 * mu * proximal_term(model, reference)
