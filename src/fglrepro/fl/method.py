"""The hooks a federated method implements around the shared round loop.

A method is a subclass of :class:`FederatedMethod` registered under a name in
:mod:`fglrepro.methods`. The loop (:func:`fglrepro.fl.loop.run_federation`) calls, each
round: :meth:`~FederatedMethod.participants`, :meth:`~FederatedMethod.client_update` for
each participant, :meth:`~FederatedMethod.server_update` with their uploads, and
:meth:`~FederatedMethod.eval_model` to pick the model tested on each client.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import Tensor, nn

from fglrepro.config import ConfigError, TrainConfig
from fglrepro.fl.aggregation import load_parameters, parameters_of, weighted_average
from fglrepro.fl.clients import ClientData
from fglrepro.fl.training import ExtraLoss, make_optimizer, train_epochs


@dataclass(frozen=True)
class NoHparams:
    """A method without hyperparameters of its own."""


@dataclass
class Upload:
    """What a client sends to the server in one round.

    Attributes:
        tensors: named payload tensors (counted for communication cost).
        weight: aggregation weight, the client's node count n_k.
        loss: last local training loss.
    """

    tensors: dict[str, Tensor]
    weight: float
    loss: float

    @property
    def num_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.tensors.values())


@dataclass
class Federation:
    """Everything a method is constructed with.

    Attributes:
        clients: the K client graphs.
        model: an initialised model; methods copy it for the server and each client.
        train: local schedule and optimiser.
        generator: seeded RNG for the method's own random choices.
        client_models: heterogeneous zoo: client k's initialised model (``None``: every
            client starts from ``model``).
    """

    clients: list[ClientData]
    model: nn.Module
    train: TrainConfig
    generator: torch.Generator
    client_models: list[nn.Module] | None = None

    @property
    def heterogeneous(self) -> bool:
        return self.client_models is not None

    def client_model(self, k: int) -> nn.Module:
        """A fresh copy of client ``k``'s initial model."""
        return copy.deepcopy(self.model if self.client_models is None else self.client_models[k])


class FederatedMethod:
    """Base class of all methods. Subclasses set ``Hparams`` and override hooks."""

    Hparams: ClassVar[type] = NoHparams
    #: False for methods without a model that clients receive from the server.
    has_global_model: ClassVar[bool] = True
    #: True for methods that work when clients have different architectures.
    heterogeneous_models: ClassVar[bool] = False

    def __init__(self, federation: Federation, hparams) -> None:
        if federation.heterogeneous and not self.heterogeneous_models:
            from fglrepro.methods import heterogeneous_methods

            raise ConfigError(
                f"method {getattr(self, 'name', type(self).__name__)!r} needs the same architecture on "
                f"every client; remove model.clients or use one of {heterogeneous_methods()}"
            )
        self.federation = federation
        self.clients = federation.clients
        self.hparams = hparams

    def participants(self, round_: int) -> list[int]:
        """Clients taking part in ``round_``: all of them, or with ``train.participation``
        below 1 a uniform sample of ``max(1, round(participation * K))`` clients."""
        num_clients = len(self.clients)
        fraction = self.federation.train.participation
        if fraction >= 1.0:
            return list(range(num_clients))
        count = max(1, round(fraction * num_clients))
        order = torch.randperm(num_clients, generator=self.federation.generator)
        return sorted(order[:count].tolist())

    def client_update(self, k: int, round_: int) -> Upload | None:
        raise NotImplementedError

    def server_update(self, round_: int, uploads: dict[int, Upload]) -> None:
        raise NotImplementedError

    def on_download(self, k: int, round_: int) -> None:
        """Client ``k``'s work after receiving the server's reply in ``round_`` (called by
        the loop for every participant after :meth:`server_update`); nothing by default."""

    def download_bytes(self, k: int) -> int:
        """Bytes client ``k`` receives from the server after a round (0 by default)."""
        return 0

    def eval_model(self, k: int, stage: str) -> nn.Module:
        """Model tested on client ``k``: ``stage="local"`` right after local training,
        ``stage="global"`` after the server step (what the client receives)."""
        raise NotImplementedError

    def server_models(self) -> list[nn.Module]:
        """The distinct server-side models that clients receive (one global model, one per
        cluster, or one per client), for server-side plug-ins such as FedTAD's
        distillation to refine in place after :meth:`server_update`. Empty by default."""
        return []

    def teacher_model(self, k: int, upload: Upload) -> nn.Module:
        """Client ``k``'s uploaded local model rebuilt on the server (a distillation
        teacher). The default loads ``upload.tensors`` into a copy of k's initial model."""
        model = self.federation.client_model(k)
        load_parameters(model, upload.tensors)
        return model


class ParameterAveraging(FederatedMethod):
    """FedAvg skeleton: clients start from the server model, train locally, and the
    server averages parameters with weights n_k.

    Hooks for variants: :meth:`receive` (what a client takes from the server),
    :meth:`extra_loss` (a term added to the local loss), :meth:`aggregate` and
    :meth:`post_aggregate` (server-side post-processing, e.g. distillation).
    """

    def __init__(self, federation: Federation, hparams) -> None:
        super().__init__(federation, hparams)
        self.global_model = copy.deepcopy(federation.model)
        self.local_models = [copy.deepcopy(federation.model) for _ in self.clients]
        self.optimizers = [make_optimizer(m, federation.train) for m in self.local_models]

    def receive(self, k: int) -> None:
        """Load the server model into client ``k``'s model."""
        load_parameters(self.local_models[k], parameters_of(self.global_model))

    def extra_loss(self, k: int) -> ExtraLoss | None:
        """Additional local loss term for client ``k`` (none by default)."""
        return None

    def client_update(self, k: int, round_: int) -> Upload:
        self.receive(k)
        model = self.local_models[k]
        loss = train_epochs(
            model, self.optimizers[k], self.clients[k], self.federation.train.local_epochs,
            self.extra_loss(k),
        )
        return Upload(tensors=parameters_of(model), weight=float(self.clients[k].num_nodes), loss=loss)

    def aggregate(self, uploads: dict[int, Upload]) -> dict[str, Tensor]:
        """Weighted parameter average of the uploads (FedAvg, weights n_k / N)."""
        ups = list(uploads.values())
        return weighted_average([u.tensors for u in ups], [u.weight for u in ups])

    def post_aggregate(self, round_: int, uploads: dict[int, Upload]) -> None:
        """Server-side step after averaging (none by default)."""

    def server_update(self, round_: int, uploads: dict[int, Upload]) -> None:
        load_parameters(self.global_model, self.aggregate(uploads))
        self.post_aggregate(round_, uploads)

    def eval_model(self, k: int, stage: str) -> nn.Module:
        return self.global_model if stage == "global" else self.local_models[k]

    def server_models(self) -> list[nn.Module]:
        return [self.global_model]

    def download_bytes(self, k: int) -> int:
        return sum(p.numel() * p.element_size() for p in self.global_model.parameters())


def require_global_model(method: FederatedMethod, name: str, stage: str) -> None:
    """Raise if the evaluation protocol asks for a global model the method lacks."""
    if stage == "global" and not method.has_global_model:
        raise ConfigError(
            f"method {name!r} has no global model to evaluate; "
            "set evaluation.model to 'local' for it"
        )
