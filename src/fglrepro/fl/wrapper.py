"""Methods that run around another method (FedTAD's server distillation, local
fine-tuning after the download): the base method does the federated work and the
wrapper adds a step, with no special case in the round loop."""

from __future__ import annotations

from torch import nn

from fglrepro.config import ConfigError, from_dict
from fglrepro.fl.method import FederatedMethod, Federation, Upload


class MethodWrapper(FederatedMethod):
    """Delegates every hook to ``self.base``, the method named by ``hparams.base`` built
    with ``hparams.base_hparams``; subclasses override the hooks they extend."""

    def __init__(self, federation: Federation, hparams) -> None:
        from fglrepro.methods import get_method

        super().__init__(federation, hparams)
        if hparams.base == self.name:
            raise ConfigError(f"hparams.base = {hparams.base!r} is not valid: a method cannot wrap itself")
        base_cls = get_method(hparams.base)
        base_hparams = from_dict(base_cls.Hparams, hparams.base_hparams, f"hparams.base_hparams of {hparams.base}")
        self.base = base_cls(federation, base_hparams)
        self.clients = self.base.clients  # the graphs the loop evaluates on (FedSage+ mends them)
        self.has_global_model = self.base.has_global_model

    def participants(self, round_: int) -> list[int]:
        return self.base.participants(round_)

    def client_update(self, k: int, round_: int) -> Upload | None:
        return self.base.client_update(k, round_)

    def server_update(self, round_: int, uploads: dict[int, Upload]) -> None:
        self.base.server_update(round_, uploads)

    def on_download(self, k: int, round_: int) -> None:
        self.base.on_download(k, round_)

    def download_bytes(self, k: int) -> int:
        return self.base.download_bytes(k)

    def eval_model(self, k: int, stage: str) -> nn.Module:
        return self.base.eval_model(k, stage)

    def server_models(self) -> list[nn.Module]:
        return self.base.server_models()

    def teacher_model(self, k: int, upload: Upload) -> nn.Module:
        return self.base.teacher_model(k, upload)
