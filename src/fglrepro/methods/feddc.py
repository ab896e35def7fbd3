"""FedDC (Gao et al., CVPR 2022): local drift decoupling and correction."""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor

from fglrepro.config import ConfigError
from fglrepro.fl.aggregation import parameters_of, weighted_average
from fglrepro.fl.control_variates import (
    ControlVariates, linear_correction, pack_upload, unpack_upload, zeros_like_parameters,
)
from fglrepro.fl.losses import proximal_term
from fglrepro.fl.method import Federation, ParameterAveraging, Upload
from fglrepro.fl.training import ExtraLoss
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
    Hparams = FedDCHparams

    def __init__(self, federation: Federation, hparams: FedDCHparams) -> None:
        super().__init__(federation, hparams)
        if federation.train.local_epochs < 1:
            raise ConfigError(f"feddc needs train.local_epochs >= 1 (got {federation.train.local_epochs})")
        self.variates = ControlVariates(self.global_model, len(self.clients))
        self.drifts = [zeros_like_parameters(self.global_model) for _ in self.clients]
        self.total_nodes = float(sum(c.num_nodes for c in self.clients))

    def extra_loss(self, k: int) -> ExtraLoss:
        received = parameters_of(self.global_model)
        anchor = {n: received[n] - h for n, h in self.drifts[k].items()}
        direction = self.variates.correction(k)
        alpha = self.hparams.alpha
        return lambda model: (
            0.5 * alpha * proximal_term(model, anchor) + linear_correction(model, direction)
        )

    def client_update(self, k: int, round_: int) -> Upload:
        start = parameters_of(self.global_model)
        upload = super().client_update(k, round_)
        local = upload.tensors
        train = self.federation.train
        delta = self.variates.update_client(k, start, local, train.local_epochs, train.lr)
        drift = self.drifts[k]
        for n in drift:
            drift[n] = drift[n] + (local[n] - start[n])
        upload.tensors = pack_upload({n: local[n] + drift[n] for n in local}, delta)
        return upload

    def aggregate(self, uploads: dict[int, Upload]) -> dict[str, Tensor]:
        corrected = [unpack_upload(u.tensors)[0] for u in uploads.values()]
        return weighted_average(corrected, [u.weight for u in uploads.values()])

    def server_update(self, round_: int, uploads: dict[int, Upload]) -> None:
        super().server_update(round_, uploads)
        deltas = {k: unpack_upload(u.tensors)[1] for k, u in uploads.items()}
        self.variates.update_server(deltas, {k: u.weight / self.total_nodes for k, u in uploads.items()})

    def download_bytes(self, k: int) -> int:
        return 2 * super().download_bytes(k)
