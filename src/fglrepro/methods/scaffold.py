"""SCAFFOLD (Karimireddy et al., 2020): local gradients corrected by control variates."""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor

from fglrepro.config import ConfigError
from fglrepro.fl.aggregation import parameters_of, weighted_average
from fglrepro.fl.control_variates import ControlVariates, linear_correction, pack_upload, unpack_upload
from fglrepro.fl.method import Federation, ParameterAveraging, Upload
from fglrepro.fl.training import ExtraLoss
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
    Hparams = ScaffoldHparams

    def __init__(self, federation: Federation, hparams: ScaffoldHparams) -> None:
        super().__init__(federation, hparams)
        if federation.train.local_epochs < 1:
            raise ConfigError(
                f"scaffold needs train.local_epochs >= 1 (got {federation.train.local_epochs})"
            )
        self.variates = ControlVariates(self.global_model, len(self.clients))

    def extra_loss(self, k: int) -> ExtraLoss:
        direction = self.variates.correction(k)
        return lambda model: linear_correction(model, direction)

    def client_update(self, k: int, round_: int) -> Upload:
        start = parameters_of(self.global_model)
        upload = super().client_update(k, round_)
        train = self.federation.train
        delta = self.variates.update_client(k, start, upload.tensors, train.local_epochs, train.lr)
        upload.tensors = pack_upload(upload.tensors, delta)
        return upload

    def aggregate(self, uploads: dict[int, Upload]) -> dict[str, Tensor]:
        models = [unpack_upload(u.tensors)[0] for u in uploads.values()]
        average = weighted_average(models, [u.weight for u in uploads.values()])
        eta = self.hparams.server_lr
        if eta == 1.0:
            return average
        current = parameters_of(self.global_model)
        return {n: current[n] + eta * (average[n] - current[n]) for n in average}

    def server_update(self, round_: int, uploads: dict[int, Upload]) -> None:
        super().server_update(round_, uploads)
        deltas = {k: unpack_upload(u.tensors)[1] for k, u in uploads.items()}
        share = 1.0 / len(self.clients)
        self.variates.update_server(deltas, {k: share for k in deltas})

    def download_bytes(self, k: int) -> int:
        return 2 * super().download_bytes(k)
