"""The contract between a federated method and the shared round loop.

A method is a subclass of :class:`FederatedMethod` registered under a name in
:mod:`fglrepro.methods`. Each round the loop (:func:`fglrepro.fl.loop.run_federation`)
calls :meth:`~FederatedMethod.participants`, :meth:`~FederatedMethod.client_updates` (by
default :meth:`~FederatedMethod.client_update` for each participant: ``receive``, local
steps of ``local_objective``, ``upload``), :meth:`~FederatedMethod.server_update` with the
uploads, :meth:`~FederatedMethod.on_download` for each participant, and
:meth:`~FederatedMethod.eval_model` to pick the model tested on each client; after the last
round (also after an early stop) :meth:`~FederatedMethod.on_run_end`.

Clients keep their models in :class:`ClientState` containers owned by the framework
(``Federation.states``); what they send is a typed :class:`Upload`. What a method can do is
declared in :class:`Capabilities` and checked against the study before any job runs.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, ClassVar, Protocol

import torch
from torch import Tensor, nn

from fglrepro.config import EvalConfig, ModelConfig, TrainConfig
from fglrepro.fl.aggregation import load_parameters, parameters_of, weighted_average
from fglrepro.fl.clients import ClientData
from fglrepro.fl.communication import module_bytes, tensor_bytes
from fglrepro.fl.ticker import Ticker
from fglrepro.fl.training import cross_entropy_loss, make_optimizer, train_steps

if TYPE_CHECKING:
    from fglrepro.fl.kernel_optimizer import KernelOptimizer

#: A local objective: the loss of one step, computed from the current client state.
Objective = Callable[[], Tensor]
#: An additional term of the local loss as a function of the model being trained.
ExtraLoss = Callable[[nn.Module], Tensor]


class BatchEngine(Protocol):
    """What the contract asks of an engine that trains the participants as one batched
    computation (:class:`fglrepro.fl.engine.VectorisedEngine` implements it; the engine
    builds on the contract, never the other way round)."""

    def client_updates(self, method: FederatedMethod, ks: list[int], round_: int) -> dict[int, Upload]:
        """:meth:`FederatedMethod.client_update` of the participants ``ks`` at once."""

    def load_rows(self, ks: list[int], models: list[nn.Module]) -> None:
        """Load ``models[i]`` into participant ``ks[i]``'s local model."""


@dataclass(frozen=True)
class NoHparams:
    """A method without hyperparameters of its own."""


@dataclass
class Upload:
    """What a client sends to the server in one round.

    Attributes:
        params: model parameters (named as in the client's model) the server aggregates.
        extras: side data the method needs (control-variate increments, embeddings,
            statistics, reliabilities), never aggregated as model parameters.
        peer: messages the server relays to other clients, ``{receiver: {name: tensor}}``.
        weight: aggregation weight, the client's node count n_k.
        loss: last local training loss.
    """

    params: dict[str, Tensor]
    extras: dict[str, Tensor] = field(default_factory=dict)
    peer: dict[int, dict[str, Tensor]] = field(default_factory=dict)
    weight: float = 1.0
    loss: float = float("nan")

    @property
    def num_bytes(self) -> int:
        """Bytes sent: parameters, side data and peer messages."""
        peer = [t for message in self.peer.values() for t in message.values()]
        return tensor_bytes([*self.params.values(), *self.extras.values(), *peer])


@dataclass
class ClientState:
    """What one client keeps between rounds.

    Attributes:
        model: the client's own model, trained locally (tested at ``evaluation.model: local``).
        optimizer: its local optimiser, kept across rounds; ``None`` until the first local
            step (the default :meth:`FederatedMethod.client_update` then makes the study's
            optimiser over ``model`` and ``modules``; the vectorised engine keeps its own).
        received: the model the client holds from the server after a round (tested at
            ``evaluation.model: global``); ``None`` while it has none.
        modules: further per-client modules a method trains or keeps (e.g. a copilot
            model, a graph learner).
    """

    model: nn.Module
    optimizer: KernelOptimizer | None = None
    received: nn.Module | None = None
    modules: dict[str, nn.Module] = field(default_factory=dict)


@dataclass(frozen=True)
class Capabilities:
    """What a method (with its hyperparameters) can do; wrappers derive theirs from the base.

    Attributes:
        global_model: clients hold a server model to test (``evaluation.model: global``).
        server_models: the server keeps models that clients receive, which a server-side
            plug-in (FedTAD) can refine.
        heterogeneous: clients may have different architectures (``model.clients``,
            ``model.graphless``).
        one_shot: a single communication round (``train.rounds`` must be 1).
        vectorised: the local step can run on the vectorised engine (homogeneous GCNs).
    """

    global_model: bool = True
    server_models: bool = False
    heterogeneous: bool = False
    one_shot: bool = False
    vectorised: bool = False


@dataclass(frozen=True)
class RunSetup:
    """The study blocks a method's protocol limits are checked against."""

    train: TrainConfig
    model: ModelConfig
    evaluation: EvalConfig


@dataclass
class Federation:
    """Everything a method is constructed with.

    Attributes:
        clients: the K client graphs.
        model: an initialised model; methods copy it for the server.
        train: local schedule and optimiser.
        generator: seeded RNG for the method's own random choices.
        states: one :class:`ClientState` per client, each starting from the client's initial
            model (``model`` or its own from ``client_models``).
        client_models: heterogeneous zoo: client k's initialised model (``None``: every
            client starts from ``model``).
        engine: the vectorised engine for methods whose capabilities allow it, else ``None``.
    """

    clients: list[ClientData]
    model: nn.Module
    train: TrainConfig
    generator: torch.Generator
    client_models: list[nn.Module] | None = None
    engine: BatchEngine | None = None
    states: list[ClientState] = field(init=False)

    def __post_init__(self) -> None:
        self.states = [ClientState(model=self.client_model(k)) for k in range(len(self.clients))]

    @property
    def heterogeneous(self) -> bool:
        return self.client_models is not None

    def client_model(self, k: int) -> nn.Module:
        """A fresh copy of client ``k``'s initial model."""
        return copy.deepcopy(self.model if self.client_models is None else self.client_models[k])


class FederatedMethod:
    """Base class of all methods. Subclasses set ``Hparams``, declare their capabilities as
    class attributes, and override hooks."""

    Hparams: ClassVar[type] = NoHparams
    has_global_model: ClassVar[bool] = True
    has_server_models: ClassVar[bool] = False
    heterogeneous_models: ClassVar[bool] = False
    one_shot: ClassVar[bool] = False
    vectorised: ClassVar[bool] = False

    def __init__(self, federation: Federation, hparams) -> None:
        self.federation = federation
        self.clients = federation.clients
        self.states = federation.states
        self.hparams = hparams
        self.caps = self.capabilities(hparams)

    # ---- declarations checked before any job runs ----------------------------------------

    @classmethod
    def capabilities(cls, hparams) -> Capabilities:
        """What this method can do with ``hparams`` (class attributes by default)."""
        return Capabilities(
            global_model=cls.has_global_model, server_models=cls.has_server_models,
            heterogeneous=cls.heterogeneous_models, one_shot=cls.one_shot, vectorised=cls.vectorised,
        )

    @classmethod
    def check_protocol(cls, hparams, setup: RunSetup) -> None:
        """Raise :class:`ConfigError` if the study's protocol is outside this method's limits
        (beyond the generic capability checks); nothing by default."""

    # ---- one round -------------------------------------------------------------------------

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

    def client_updates(self, ks: list[int], round_: int) -> dict[int, Upload]:
        """Local work of the participants ``ks`` and their uploads (clients returning no
        upload are left out). On the vectorised engine all of them train as one batched
        computation; otherwise :meth:`client_update` runs for each in turn (a slow round logs how
        many are done, :class:`~fglrepro.fl.ticker.Ticker`)."""
        engine = self.federation.engine
        if engine is not None and self.caps.vectorised:
            return engine.client_updates(self, ks, round_)
        uploads, ticker = {}, Ticker(f"round {round_}, clients updated", len(ks))
        for k in ks:
            uploads[k] = self.client_update(k, round_)
            ticker.tick()
        return {k: u for k, u in uploads.items() if u is not None}

    def client_update(self, k: int, round_: int) -> Upload | None:
        """Client ``k``'s round: :meth:`receive`, ``train.local_epochs`` steps of
        :meth:`local_objective` on its state's modules, :meth:`upload`."""
        self.receive(k, round_)
        state = self.states[k]
        modules = [state.model, *state.modules.values()]
        if state.optimizer is None:
            state.optimizer = make_optimizer(nn.ModuleList(modules), self.federation.train)
        loss = train_steps(state.optimizer, modules, self.federation.train.local_epochs,
                           self.local_objective(k, round_))
        return self.upload(k, round_, loss)

    def receive(self, k: int, round_: int) -> None:
        """Client ``k`` takes what the server sent before training; nothing by default."""

    def local_objective(self, k: int, round_: int) -> Objective:
        """The loss of one local step of client ``k`` in this round (built once per round,
        called once per step; it may run any forward passes of the client's modules).
        Default: cross-entropy of ``states[k].model`` plus :meth:`extra_loss`."""
        model, client = self.states[k].model, self.clients[k]
        extra = self.extra_loss(k, round_)
        if extra is None:
            return lambda: cross_entropy_loss(model, client)
        return lambda: cross_entropy_loss(model, client) + extra(model)

    def extra_loss(self, k: int, round_: int) -> ExtraLoss | None:
        """A term added to the cross-entropy of the default objective (none by default)."""
        return None

    def batched_receive(self, ks: list[int], round_: int, engine: BatchEngine) -> None:
        """:meth:`receive` for the participants ``ks`` on the vectorised engine (each in turn
        by default; a method may batch work it does there)."""
        for k in ks:
            self.receive(k, round_)

    def batched_extra_loss(self, ks: list[int], round_: int, engine: BatchEngine) -> Callable[..., Tensor] | None:
        """The batched form of what :meth:`local_objective` adds to the cross-entropy, for
        the participants ``ks`` on the vectorised engine (none by default): a
        :data:`fglrepro.fl.engine.BatchedTerms`, ``(forward pass, stacked parameters) -> [m]``."""
        return None

    @classmethod
    def check_batched_terms(cls) -> None:
        """Refuse a vectorised method whose local loss is more than the default but which
        gives no :meth:`batched_extra_loss` (the engine would silently train without it)."""
        custom = (cls.local_objective is not FederatedMethod.local_objective
                  or cls.extra_loss is not FederatedMethod.extra_loss)
        if custom and cls.batched_extra_loss is FederatedMethod.batched_extra_loss:
            raise TypeError(f"{cls.__name__} declares vectorised = True but changes its local loss without "
                            "batched_extra_loss")

    def upload(self, k: int, round_: int, loss: float) -> Upload | None:
        """What client ``k`` sends after training: its model's parameters."""
        return Upload(params=parameters_of(self.states[k].model), weight=float(self.clients[k].num_nodes),
                      loss=loss)

    def server_update(self, round_: int, uploads: dict[int, Upload]) -> None:
        raise NotImplementedError

    def on_download(self, k: int, round_: int) -> None:
        """Client ``k``'s work after receiving the server's reply in ``round_`` (called by
        the loop for every participant after :meth:`server_update`); nothing by default."""

    def on_run_end(self, last_round: int) -> bool:
        """Client work after the last round (also when early stopping ended the run).
        Returns True when it changed the models that are tested (the loop then tests them
        again for the last round); nothing by default."""
        return False

    def download_bytes(self, k: int) -> int:
        """Bytes client ``k`` receives after a round: the model it holds from the server."""
        return module_bytes(self.states[k].received)

    def eval_model(self, k: int, stage: str) -> nn.Module:
        """Model tested on client ``k``: ``stage="local"`` right after local training,
        ``stage="global"`` after the server step (what the client holds from the server,
        its own model while it holds none)."""
        state = self.states[k]
        return state.received if stage == "global" and state.received is not None else state.model

    def server_models(self) -> list[nn.Module]:
        """The distinct server-side models that clients receive (one global model, one per
        cluster, or one per client), for server-side plug-ins such as FedTAD's
        distillation to refine in place after :meth:`server_update`. Empty by default."""
        return []

    def teacher_model(self, k: int, upload: Upload) -> nn.Module:
        """Client ``k``'s uploaded local model rebuilt on the server (a distillation
        teacher): ``upload.params`` loaded into a copy of k's initial model."""
        model = self.federation.client_model(k)
        load_parameters(model, upload.params)
        return model


class ParameterAveraging(FederatedMethod):
    """FedAvg skeleton: clients start from the server model, train locally, and the
    server averages parameters with weights n_k.

    Hooks for variants: :meth:`receive` (what a client takes from the server),
    :meth:`extra_loss` (a term added to the local loss), :meth:`aggregate` and
    :meth:`post_aggregate` (server-side post-processing).
    """

    has_server_models = True

    def __init__(self, federation: Federation, hparams) -> None:
        super().__init__(federation, hparams)
        self.global_model = copy.deepcopy(federation.model)
        for state in self.states:
            state.received = self.global_model

    def receive(self, k: int, round_: int) -> None:
        """Load the model client ``k`` holds from the server into its local model."""
        load_parameters(self.states[k].model, dict(self.states[k].received.named_parameters()))

    def batched_receive(self, ks: list[int], round_: int, engine: BatchEngine) -> None:
        """:meth:`receive` for all participants with one copy per parameter."""
        if type(self).receive is not ParameterAveraging.receive:
            return super().batched_receive(ks, round_, engine)
        engine.load_rows(ks, [self.states[k].received for k in ks])

    def aggregate(self, uploads: dict[int, Upload]) -> dict[str, Tensor]:
        """Weighted parameter average of the uploads (FedAvg, weights n_k / N)."""
        ups = list(uploads.values())
        return weighted_average([u.params for u in ups], [u.weight for u in ups])

    def post_aggregate(self, round_: int, uploads: dict[int, Upload]) -> None:
        """Server-side step after averaging (none by default)."""

    def server_update(self, round_: int, uploads: dict[int, Upload]) -> None:
        load_parameters(self.global_model, self.aggregate(uploads))
        self.post_aggregate(round_, uploads)

    def server_models(self) -> list[nn.Module]:
        return [self.global_model]


def check_capabilities(name: str, caps: Capabilities, setup: RunSetup) -> list[str]:
    """Problems of running a method with capabilities ``caps`` under ``setup`` (empty if none)."""
    problems = []
    if setup.model.heterogeneous and not caps.heterogeneous:
        problems.append(f"method {name!r} needs the same architecture on every client; "
                        "remove model.clients and model.graphless")
    if setup.evaluation.model == "global" and not caps.global_model:
        problems.append(f"method {name!r} has no global model to evaluate; set evaluation.model to 'local'")
    if caps.one_shot and setup.train.rounds != 1:
        problems.append(f"method {name!r} is one-shot: train.rounds must be 1, got {setup.train.rounds}")
    if setup.train.engine == "vectorised":
        reason = vectorised_obstacle(caps, setup.model)
        if reason:
            problems.append(f"train.engine = 'vectorised' is not possible: {reason}; use 'auto' or 'sequential'")
    return problems


def vectorised_obstacle(caps: Capabilities, model: ModelConfig) -> str | None:
    """Why the vectorised engine cannot run a method with ``caps`` on ``model``, or None."""
    if not caps.vectorised:
        return "the method has no vectorised local step"
    if model.heterogeneous:
        return "clients have different architectures"
    if model.arch != "gcn":
        return f"model.arch {model.arch!r} (the engine runs 'gcn')"
    if model.jk is not None:
        return "model.jk (the engine runs the GCN without jumping knowledge)"
    return None

