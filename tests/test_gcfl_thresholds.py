"""GCFL / GCFL+ split thresholds: absolute (the GCFL code's) and relative to round 1's update norm."""

from __future__ import annotations

import pytest
import torch
from conftest import make_sbm
from helpers import make_method

from fglrepro.config import ConfigError, EvalConfig, ModelConfig, TrainConfig, from_dict
from fglrepro.fl.clients import build_clients
from fglrepro.fl.loop import run_federation
from fglrepro.fl.method import Federation, Upload
from fglrepro.methods import build_method, get_method, resolve_method
from fglrepro.methods.gcfl_plus.clustering import split_criterion
from fglrepro.models import build_model
from fglrepro.partition.data import Partition

RELATIVE = {"threshold": "relative", "clustering": "cosine", "warmup_rounds": 5}


def class_partition(data, groups: list[list[int]], same_masks: bool) -> Partition:
    """Client k holds every node whose label is in ``groups[k]``; half of them train, a quarter
    each validate and test. ``same_masks``: clients with the same nodes get the same split."""
    gen = torch.Generator().manual_seed(0)
    nodes, draws = [], {}
    for classes in groups:
        nodes.append(torch.nonzero(torch.isin(data.y, torch.tensor(classes))).view(-1))
        key = tuple(classes) if same_masks else len(nodes)
        draws.setdefault(key, torch.rand(len(nodes[-1]), generator=gen))
        nodes[-1] = (nodes[-1], draws[key])
    return Partition(
        num_nodes=data.num_nodes, client_nodes=[n for n, _ in nodes],
        train_mask=[r < 0.5 for _, r in nodes], val_mask=[(r >= 0.5) & (r < 0.75) for _, r in nodes],
        test_mask=[r >= 0.75 for _, r in nodes], graphless=torch.zeros(len(groups), dtype=torch.bool),
    )


def gcfl_on(groups: list[list[int]], hparams: dict, rounds: int, same_masks: bool = False):
    """GCFL+ trained ``rounds`` rounds (Adam, lr 0.05, 2 local epochs) on a 4-class SBM graph
    split by :func:`class_partition`."""
    data = make_sbm(num_blocks=4, block_size=30)
    torch.manual_seed(0)
    clients = build_clients(data, class_partition(data, groups, same_masks), torch.device("cpu"))
    model = build_model(ModelConfig(hidden=16), data.num_features, data.num_classes)
    federation = Federation(clients=clients, model=model, train=TrainConfig(rounds=rounds, local_epochs=2, lr=0.05),
                            generator=torch.Generator().manual_seed(0))
    method = build_method(resolve_method("gcfl_plus", hparams), federation)
    run_federation(method, rounds, EvalConfig(model="global"))
    return method


def test_relative_thresholds_split_clients_with_disjoint_labels_into_their_groups():
    method = gcfl_on([[0, 1]] * 3 + [[2, 3]] * 3, RELATIVE, rounds=30)
    assert method.splits, "no split on a partition with disjoint labels"
    _, first, second = method.splits[0]
    assert {tuple(first), tuple(second)} == {(0, 1, 2), (3, 4, 5)}


def test_relative_thresholds_never_split_clients_holding_the_same_data():
    method = gcfl_on([[0, 1, 2, 3]] * 6, RELATIVE, rounds=30, same_masks=True)
    assert method.splits == [] and method.clusters == [list(range(6))]


def test_absolute_thresholds_never_split_the_disjoint_labels_with_adam():
    """The GCFL code's eps1 = 0.05 in parameter units: Adam's updates stay above it."""
    method = gcfl_on([[0, 1]] * 3 + [[2, 3]] * 3, {**RELATIVE, "threshold": "absolute"}, rounds=30)
    assert method.splits == []


def hand_uploads(method, updates: torch.Tensor) -> dict[int, Upload]:
    """Uploads whose parameters are each client's received model plus its row of ``updates [K, d]``."""
    uploads = {}
    for k, row in enumerate(updates):
        params, start = {}, 0
        for name, p in method.states[k].received.named_parameters():
            params[name] = p.detach() + row[start:start + p.numel()].view_as(p)
            start += p.numel()
        uploads[k] = Upload(params=params, weight=1.0)
    return uploads


def splits_of_scaled_updates(threshold: str, scale: float) -> list:
    """Splits after round 1 (random updates: the reference) and round 2 (two opposite groups
    plus noise), every update multiplied by ``scale``."""
    method = make_method(make_sbm(), "gcfl_plus", {"threshold": threshold, "clustering": "cosine", "warmup_rounds": 1},
                         num_clients=3)
    method.clusters = [[0, 1, 2]]
    gen = torch.Generator().manual_seed(0)
    d = sum(p.numel() for p in method.global_model.parameters())
    first = torch.randn(3, d, generator=gen) * 1e-2
    direction = torch.randn(d, generator=gen) * 1e-2
    second = torch.tensor([[1.0], [-1.0], [1.0]]) * direction + 1e-3 * torch.randn(3, d, generator=gen)
    second[1] *= 2.0  # the lone client's update balances the other two: the mean update is noise
    for round_, updates in ((1, first), (2, second)):
        method.server_update(round_, hand_uploads(method, scale * updates))
    return [(r, a, b) for r, a, b in method.splits]


def test_relative_thresholds_do_not_change_when_every_update_is_scaled():
    reference = splits_of_scaled_updates("relative", 1.0)
    assert reference == [(2, [0, 2], [1])]
    for scale in (1e-3, 1e3):
        assert splits_of_scaled_updates("relative", scale) == reference


def test_absolute_thresholds_depend_on_the_scale_of_the_updates():
    assert splits_of_scaled_updates("absolute", 1e-3) == []  # every update below eps2
    assert splits_of_scaled_updates("absolute", 1.0) == [(2, [0, 2], [1])]
    assert splits_of_scaled_updates("absolute", 1e3) == []  # the mean update above eps1


@pytest.mark.parametrize("values, expected", [
    ({}, (0.05, 0.1)),
    ({"threshold": "absolute"}, (0.05, 0.1)),
    ({"threshold": "relative"}, (0.32, 0.63)),
    ({"threshold": "relative", "eps1": 0.2}, (0.2, 0.63)),
])
def test_each_threshold_mode_has_its_own_default_eps(values, expected):
    hp = from_dict(get_method("gcfl_plus").Hparams, values, "hparams of gcfl_plus")
    assert (hp.eps1, hp.eps2) == expected


def test_unknown_threshold_mode_names_the_valid_ones():
    with pytest.raises(ConfigError, match=r"hparams.threshold = 'scaled'.*\['absolute', 'relative'\]"):
        from_dict(get_method("gcfl_plus").Hparams, {"threshold": "scaled"}, "hparams of gcfl_plus")


def test_split_criterion_is_the_gcfl_rule():
    updates = torch.tensor([[3.0, 0.0], [-3.0, 0.0], [0.0, 0.3]])  # mean norm 0.1, max norm 3
    assert split_criterion(updates, eps1=0.2, eps2=1.0)
    assert not split_criterion(updates, eps1=0.05, eps2=1.0)  # federation not stationary enough
    assert not split_criterion(updates, eps1=0.2, eps2=3.5)  # no client moving enough
    assert split_criterion(updates, eps1=0.2, eps2=1.0, scale=1.0) == split_criterion(
        10 * updates, eps1=0.2, eps2=1.0, scale=10.0)
