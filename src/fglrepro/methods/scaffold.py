"""SCAFFOLD (Karimireddy et al., 2020): local gradients corrected by control variates."""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor

from fglrepro.components.control_variates import (
    ControlVariates,
    check_local_steps,
    linear_correction,
    stacked_linear_correction,
)
from fglrepro.fl.aggregation import parameters_of
from fglrepro.fl.communication import module_bytes
from fglrepro.fl.engine import BatchedTerms, VectorisedEngine
from fglrepro.fl.method import ExtraLoss, Federation, ParameterAveraging, RunSetup, Upload
from fglrepro.methods import register


@dataclass(frozen=True)
class ScaffoldHparams:
    """server_lr: global step size eta_g, ``x <- x + eta_g * (avg_k y_k - x)`` (1 in the
    SCAFFOLD paper's experiments; OpenFGL's SCAFFOLD has no step size, i.e. 1)."""

    server_lr: float = 1.0


@register("scaffold")
class Scaffold(ParameterAveraging):
    """Local loss = CE + <w, c - c_k> (gradient corrected by ``c - c_k``); after local
    training ``c_k`` is refreshed by option II with S = ``local_epochs`` full-batch steps
    and the local ``lr``; the server moves ``x`` towards the n_k-weighted mean of the
    uploaded ``y_k`` and sets ``c <- c + (1/K) sum_{k in S} Δc_k``.

    Each participant uploads ``y_k`` and ``Δc_k`` and downloads ``x`` and ``c``.
    """

    label = "SCAFFOLD"
    vectorised = True
    Hparams = ScaffoldHparams

    def __init__(self, federation: Federation, hparams: ScaffoldHparams) -> None:
        super().__init__(federation, hparams)
        self.variates = ControlVariates(self.global_model, len(self.clients))

    @classmethod
    def check_protocol(cls, hparams: ScaffoldHparams, setup: RunSetup) -> None:
        check_local_steps("scaffold", setup.train.local_epochs)

    def extra_loss(self, k: int, round_: int) -> ExtraLoss:
        direction = self.variates.correction(k)
        return lambda model: linear_correction(model, direction)

    def batched_extra_loss(self, ks: list[int], round_: int, engine: VectorisedEngine) -> BatchedTerms:
        directions = engine.stack([self.variates.correction(k) for k in ks])
        return lambda out, params: stacked_linear_correction(params, directions)

    def upload(self, k: int, round_: int, loss: float) -> Upload:
        """The trained model ``y_k`` and the variate increment ``Δc_k`` (option II, from the
        received model, which the server has not changed during the round)."""
        upload = super().upload(k, round_, loss)
        train = self.federation.train
        start = parameters_of(self.global_model)
        upload.extras = self.variates.update_client(k, start, upload.params, train.local_epochs, train.lr)
        return upload

    def aggregate(self, uploads: dict[int, Upload]) -> dict[str, Tensor]:
        average = super().aggregate(uploads)
        eta = self.hparams.server_lr
        if eta == 1.0:
            return average
        current = parameters_of(self.global_model)
        return {n: current[n] + eta * (average[n] - current[n]) for n in average}

    def server_update(self, round_: int, uploads: dict[int, Upload]) -> None:
        super().server_update(round_, uploads)
        deltas = {k: u.extras for k, u in uploads.items()}
        share = 1.0 / len(self.clients)
        self.variates.update_server(deltas, {k: share for k in deltas})

    def download_bytes(self, k: int) -> int:
        """The model ``x`` and the server variate ``c``."""
        return 2 * module_bytes(self.global_model)
