"""FedDC (Gao et al., CVPR 2022): local drift decoupling and correction."""

from __future__ import annotations

from dataclasses import dataclass

from fglrepro.components.control_variates import (
    ControlVariates,
    check_local_steps,
    linear_correction,
    stacked_linear_correction,
    zeros_like_parameters,
)
from fglrepro.fl.aggregation import parameters_of
from fglrepro.fl.communication import module_bytes
from fglrepro.fl.engine import BatchedTerms, VectorisedEngine
from fglrepro.fl.losses import proximal_term, stacked_proximal_term
from fglrepro.fl.method import ExtraLoss, Federation, ParameterAveraging, RunSetup, Upload
from fglrepro.methods import register


@dataclass(frozen=True)
class FedDCHparams:
    """alpha: weight of the drift penalty ``alpha/2 ||theta_k + h_k - w||^2`` (0.01, the
    FedDC authors' code default ``alpha_coef``; OpenFGL's default is 0.1)."""

    alpha: float = 0.01


@register("feddc")
class FedDC(ParameterAveraging):
    """Each client keeps a local drift ``h_k`` (sum of its past updates ``theta_k - w``)
    and a control variate ``c_k``. Local loss::

        CE + alpha/2 ||theta + h_k - w||^2 + <theta, c - c_k>

    i.e. a penalty tying ``theta + h_k`` to the received model ``w`` and the gradient
    correction by the difference of global and local update directions (SCAFFOLD
    option-II variates, as in the FedDC authors' code). After training
    ``h_k += theta_k - w``; the client uploads ``theta_k + h_k`` and ``Δc_k``; the server
    sets ``w`` to the n_k-weighted mean of ``theta_k + h_k`` over participants and
    ``c <- c + sum_{k in S} (n_k / N) Δc_k``.
    """

    label = "FedDC"
    vectorised = True
    Hparams = FedDCHparams

    def __init__(self, federation: Federation, hparams: FedDCHparams) -> None:
        super().__init__(federation, hparams)
        self.variates = ControlVariates(self.global_model, len(self.clients))
        self.drifts = [zeros_like_parameters(self.global_model) for _ in self.clients]
        self.total_nodes = float(sum(c.num_nodes for c in self.clients))

    @classmethod
    def check_protocol(cls, hparams: FedDCHparams, setup: RunSetup) -> None:
        check_local_steps("feddc", setup.train.local_epochs)

    def extra_loss(self, k: int, round_: int) -> ExtraLoss:
        received = parameters_of(self.global_model)
        anchor = {n: received[n] - h for n, h in self.drifts[k].items()}
        direction = self.variates.correction(k)
        alpha = self.hparams.alpha
        return lambda model: (
            0.5 * alpha * proximal_term(model, anchor) + linear_correction(model, direction)
        )

    def batched_extra_loss(self, ks: list[int], round_: int, engine: VectorisedEngine) -> BatchedTerms:
        received = parameters_of(self.global_model)
        anchors = engine.stack([{n: received[n] - h for n, h in self.drifts[k].items()} for k in ks])
        directions = engine.stack([self.variates.correction(k) for k in ks])
        alpha = self.hparams.alpha
        return lambda out, params: (
            0.5 * alpha * stacked_proximal_term(params, anchors) + stacked_linear_correction(params, directions)
        )

    def upload(self, k: int, round_: int, loss: float) -> Upload:
        """``theta_k + h_k`` (after ``h_k += theta_k - w``) and the variate increment ``Δc_k``."""
        upload = super().upload(k, round_, loss)
        local = upload.params
        start = parameters_of(self.global_model)
        train = self.federation.train
        delta = self.variates.update_client(k, start, local, train.local_epochs, train.lr)
        drift = self.drifts[k]
        for n in drift:
            drift[n] = drift[n] + (local[n] - start[n])
        upload.params = {n: local[n] + drift[n] for n in local}
        upload.extras = delta
        return upload

    def server_update(self, round_: int, uploads: dict[int, Upload]) -> None:
        super().server_update(round_, uploads)
        deltas = {k: u.extras for k, u in uploads.items()}
        self.variates.update_server(deltas, {k: u.weight / self.total_nodes for k, u in uploads.items()})

    def download_bytes(self, k: int) -> int:
        """The model ``w`` and the server variate ``c``."""
        return 2 * module_bytes(self.global_model)
