"""Shared test helpers: build a method on a small federation the way ``fgl-train`` does,
run single rounds of it, and ask the registry why a setting is refused."""

from __future__ import annotations

import dataclasses
import re

import torch

from fglrepro.config import ConfigError, EvalConfig, ModelConfig, TrainConfig
from fglrepro.fl.clients import ClientData, build_clients, normalized_adjacency
from fglrepro.fl.method import FederatedMethod, Federation, RunSetup, Upload
from fglrepro.methods import build_method, check_method, resolve_method
from fglrepro.models import build_model
from fglrepro.partition.build import PartitionSpec, build_partition

#: The partition of every method test: Metis, stratified 40 % train / 30 % val per client.
SPEC = PartitionSpec("metis", "stratified", 0.4, 0.3)
#: Local schedule of the method tests unless a test overrides a field.
TRAIN = {"rounds": 3, "local_epochs": 2, "lr": 0.05}


def train_config(**train) -> TrainConfig:
    """:data:`TRAIN` with the given fields replaced."""
    return TrainConfig(**{**TRAIN, **train})


def method_problems(name: str, hparams: dict | None = None, model: ModelConfig | None = None,
                    evaluation: EvalConfig | None = None, **train) -> list[str]:
    """Why ``fgl-train`` would refuse method ``name`` with ``hparams`` under the given study
    blocks (:func:`fglrepro.methods.check_method`; empty if it would run it)."""
    setup = RunSetup(train_config(**train), model or ModelConfig(hidden=16), evaluation or EvalConfig())
    return check_method(resolve_method(name, hparams), setup)


def assert_refused(problems: list[str], pattern: str) -> None:
    """Some problem in ``problems`` matches the regular expression ``pattern``."""
    assert any(re.search(pattern, p) for p in problems), (pattern, problems)


def make_method(
    data, name: str, hparams: dict | None = None, *, seed: int = 0, num_clients: int = 3,
    model: ModelConfig | None = None, evaluation: EvalConfig | None = None, unbalanced: bool = False,
    partition: PartitionSpec = SPEC, **train,
) -> FederatedMethod:
    """Method ``name`` with ``hparams`` on a ``num_clients``-client partition of ``data``
    (``partition``, by default :data:`SPEC`).

    Built as ``fgl-train`` builds it: :func:`~fglrepro.methods.resolve_method`, then
    :func:`~fglrepro.methods.check_method` (its problems raise :class:`ConfigError`; checked
    against ``evaluation``, by default ``evaluation.model: local``, which every method
    supports), then :func:`~fglrepro.methods.build_method`. ``torch`` is seeded with
    ``seed`` first (dropout draws), so methods built just before their runs draw alike.
    The federation has no engine: the sequential reference path.

    ``model`` defaults to a GCN of width 16; with ``model.clients`` every client gets its
    own architecture. ``train`` overrides fields of :data:`TRAIN`. ``unbalanced``: client 0
    keeps only its first 15 nodes, so ``n_k / N != 1 / K``.
    """
    torch.manual_seed(seed)
    spec = resolve_method(name, hparams)
    config = model or ModelConfig(hidden=16)
    schedule = train_config(**train)
    problems = check_method(spec, RunSetup(schedule, config, evaluation or EvalConfig(model="local")))
    if problems:
        raise ConfigError("; ".join(problems))
    part = build_partition(data, partition, num_clients, seed=seed)
    if unbalanced:
        part = dataclasses.replace(part, **{
            field: [getattr(part, field)[0][:15]] + getattr(part, field)[1:]
            for field in ("client_nodes", "train_mask", "val_mask", "test_mask")
        })
    clients = build_clients(data, part, torch.device("cpu"))
    net = build_model(config, data.num_features, data.num_classes)
    zoo = [build_model(config.for_client(k, client.graphless), data.num_features, data.num_classes)
           for k, client in enumerate(clients)] if config.heterogeneous else None
    federation = Federation(clients=clients, model=net, train=schedule,
                            generator=torch.Generator().manual_seed(seed), client_models=zoo)
    return build_method(spec, federation)


def one_round(method: FederatedMethod, round_: int) -> dict[int, Upload]:
    """One round as the loop runs it, without evaluation: the participants' local updates,
    the server step, and each participant's download; returns the uploads."""
    uploads = method.client_updates(method.participants(round_), round_)
    method.server_update(round_, uploads)
    for k in uploads:
        method.on_download(k, round_)
    return uploads


def all_clients(method: FederatedMethod, round_: int) -> dict[int, Upload]:
    """Every client's local update in ``round_`` (no server step)."""
    return method.client_updates(list(range(len(method.clients))), round_)


def client_models(method: FederatedMethod) -> list[torch.nn.Module]:
    """Each client's own model (``states[k].model``)."""
    return [state.model for state in method.states]


def received_models(method: FederatedMethod) -> list[torch.nn.Module | None]:
    """The model each client holds from the server (``states[k].received``)."""
    return [state.received for state in method.states]


def same_parameters(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    """Bit-for-bit equal parameters, in order."""
    return all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))


def hand_client(x: torch.Tensor, y: list[int], edge_index: list[list[int]], train: list[bool],
                val: list[bool] | None = None, test: list[bool] | None = None, num_classes: int = 2) -> ClientData:
    """A small client written out by hand (no validation or test nodes unless given)."""
    n = x.size(0)
    edges = torch.tensor(edge_index)
    none = torch.zeros(n, dtype=torch.bool)
    return ClientData(
        x=x, y=torch.tensor(y), edge_index=edges, adj=normalized_adjacency(edges, n),
        train_mask=torch.tensor(train), val_mask=none if val is None else torch.tensor(val),
        test_mask=none if test is None else torch.tensor(test), global_ids=torch.arange(n),
        num_classes=num_classes,
    )
