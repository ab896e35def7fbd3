"""ReNode: PageRank conflict, cosine-annealed weights, the limits in which it is Local / FedAvg, and
the vectorised engine against the sequential path."""

from __future__ import annotations

import math

import pytest
import torch
from helpers import hand_client, make_method, one_round
from test_engine import max_parameter_gap, run, val_curve

from fglrepro.config import ModelConfig
from fglrepro.methods.renode import (
    ReNodeHparams,
    cosine_rank_weights,
    pagerank_propagate,
    renode_weights,
    totoro,
)

NO_DROPOUT = ModelConfig(hidden=16, dropout=0.0)


def parameter_gap(a, b) -> float:
    """Largest parameter difference between the clients' models of methods ``a`` and ``b``."""
    return max((p - q).abs().max().item() for sa, sb in zip(a.states, b.states)
               for p, q in zip(sa.model.parameters(), sb.model.parameters()))


def two_cliques() -> "ClientData":  # noqa: F821 - a ClientData
    """Nodes 0-3 (class 0) and 4-6 (class 1) in two cliques joined by the edge 3-4; node 3 is
    the class-0 node next to class 1, node 0 the one farthest from it."""
    edges = [(a, b) for a in range(4) for b in range(4) if a != b]
    edges += [(a, b) for a in range(4, 7) for b in range(4, 7) if a != b] + [(3, 4), (4, 3)]
    return hand_client(torch.eye(7), [0, 0, 0, 0, 1, 1, 1], [list(e) for e in zip(*edges)], [True] * 7)


def test_pagerank_iteration_matches_the_dense_inverse():
    client = two_cliques()
    dense = client.adj.to_dense()
    exact = 0.15 * torch.linalg.inv(torch.eye(7) - 0.85 * dense)
    x = torch.randn(7, 3, generator=torch.Generator().manual_seed(0))
    assert torch.allclose(pagerank_propagate(client.adj, x, 0.15, 200), exact @ x, atol=1e-5)


def test_conflict_is_highest_at_the_class_boundary():
    client = two_cliques()
    conflict = totoro(client, 0.15, 100)
    # class 0: node 3 (joined to class 1) conflicts most, nodes 0-2 (symmetric) equally less
    assert conflict[3] > conflict[0]
    assert conflict[0] == pytest.approx(conflict[1]) and conflict[1] == pytest.approx(conflict[2])
    # class 1: node 4 (joined to class 0) conflicts most
    assert conflict[4] > conflict[5]


def test_cosine_weights_span_base_to_base_plus_scale_by_rank():
    scores = torch.tensor([0.3, 0.1, 0.9, 0.5, 0.7])
    weights = cosine_rank_weights(scores, 0.5, 1.0)
    # least conflict (0.1) gets 1.5, most (0.9) gets 0.5, the middle rank 1.0
    assert weights.tolist() == pytest.approx([0.5 + 0.5 * (1 + math.cos(math.pi / 4)), 1.5, 0.5, 1.0,
                                              0.5 + 0.5 * (1 + math.cos(3 * math.pi / 4))])
    assert torch.all(weights[scores.argsort()][:-1] > weights[scores.argsort()][1:])


def test_boundary_nodes_get_the_smallest_weights():
    weights = renode_weights(two_cliques(), ReNodeHparams())
    assert weights[3] < weights[0] and weights[4] < weights[5]
    assert weights.min() == pytest.approx(0.5) and weights.max() == pytest.approx(1.5)


@pytest.mark.parametrize("federated,simpler", [(False, "local"), (True, "fedavg")])
def test_unit_weights_reduce_to_the_cross_entropy_method(cora, federated, simpler):
    """w_min = w_max = 1: ReNode trains as Local (or FedAvg with ``federated``), up to the float
    rounding of a weighted sum against a mean."""
    hparams = {"base_weight": 1.0, "scale_weight": 0.0, "federated": federated}
    methods = [make_method(cora, name, params, rounds=2, model=NO_DROPOUT)
               for name, params in (("renode", hparams), ("fedavg" if federated else "local", None))]
    for method in methods:
        for round_ in (1, 2):
            one_round(method, round_)
    assert parameter_gap(*methods) < 1e-6


def test_reweighting_changes_training(cora):
    methods = [make_method(cora, name, rounds=1, model=NO_DROPOUT) for name in ("renode", "local")]
    for method in methods:
        one_round(method, 1)
    assert parameter_gap(*methods) > 1e-3


def test_local_renode_sends_nothing(cora):
    method = make_method(cora, "renode", rounds=1)
    uploads = method.client_updates(list(range(3)), 1)
    assert all(u.params == {} for u in uploads.values())
    assert method.server_models() == []


@pytest.mark.parametrize("federated", [False, True])
def test_engine_reproduces_the_sequential_path(cora, federated):
    hparams = {"federated": federated}
    ref, ref_history = run(cora, "renode", hparams, dropout=0.0)
    vec, vec_history = run(cora, "renode", hparams, engine="sequential", dropout=0.0)
    assert max_parameter_gap(ref, vec) < 1e-5
    assert val_curve(vec_history) == pytest.approx(val_curve(ref_history), abs=1e-6)
