"""Methods that run around another method (FedTAD's server distillation, local
fine-tuning after the last round): the base method does the federated work and the
wrapper adds a step, with no special case in the round loop.

The base is built first (by :func:`fglrepro.methods.build_method`, from ``hparams.base``
and ``hparams.base_hparams``) and handed to the wrapper; a wrapper's capabilities are
derived from its base's (:meth:`MethodWrapper.wrap_capabilities`).
"""

from __future__ import annotations

from torch import nn

from fglrepro.fl.method import Capabilities, FederatedMethod, Federation, Upload


class MethodWrapper(FederatedMethod):
    """Delegates every hook to ``self.base``; subclasses override the hooks they extend."""

    def __init__(self, federation: Federation, hparams, base: FederatedMethod) -> None:
        super().__init__(federation, hparams)
        self.base = base
        self.caps = self.wrap_capabilities(hparams, base.caps)
        self.clients = base.clients  # the graphs the loop evaluates on (FedSage+ mends them)

    @classmethod
    def prepare(cls, federation: Federation, hparams) -> None:
        """Change the federation (e.g. the clients' graphs) before the base method is built;
        nothing by default."""

    @classmethod
    def wrap_capabilities(cls, hparams, base: Capabilities) -> Capabilities:
        """The capabilities of this wrapper around a base with ``base``; raises
        :class:`~fglrepro.config.ConfigError` if it cannot wrap such a base. The base's by
        default."""
        return base

    def participants(self, round_: int) -> list[int]:
        return self.base.participants(round_)

    def client_updates(self, ks: list[int], round_: int) -> dict[int, Upload]:
        return self.base.client_updates(ks, round_)

    def client_update(self, k: int, round_: int) -> Upload | None:
        return self.base.client_update(k, round_)

    def server_update(self, round_: int, uploads: dict[int, Upload]) -> None:
        self.base.server_update(round_, uploads)

    def on_download(self, k: int, round_: int) -> None:
        self.base.on_download(k, round_)

    def on_run_end(self, last_round: int) -> bool:
        return self.base.on_run_end(last_round)

    def download_bytes(self, k: int) -> int:
        return self.base.download_bytes(k)

    def eval_model(self, k: int, stage: str) -> nn.Module:
        return self.base.eval_model(k, stage)

    def server_models(self) -> list[nn.Module]:
        return self.base.server_models()

    def teacher_model(self, k: int, upload: Upload) -> nn.Module:
        return self.base.teacher_model(k, upload)
