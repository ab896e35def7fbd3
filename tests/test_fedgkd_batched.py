"""FedGKD's batched fast path (vectorised engine): the participants' distillations as one
problem, the stacked personalised models, against the per-client computation."""

from __future__ import annotations

import pytest
import torch
from test_engine import federation

from fglrepro.fl.engine import StackedGCN
from fglrepro.methods import build_method, resolve_method
from fglrepro.methods.fedgkd.graph_distillation import (
    DistillSettings,
    _Gram,
    broadcast_graph,
    distill_graph,
    distill_graphs,
)
from fglrepro.models import GCN

SETTINGS = DistillSettings(steps=5, lr=0.2, gamma=0.75, tau_g=1.0)


def random_gcns(count: int, num_features: int, num_classes: int, readout: bool) -> list[GCN]:
    torch.manual_seed(0)
    return [GCN(num_features, 16, num_classes, layers=2, dropout=0.5, readout=readout) for _ in range(count)]


@pytest.mark.parametrize("readout", [True, False])
def test_batched_distillation_equals_one_client_at_a_time(readout):
    """Same broadcast, same Gumbel draws (client by client, step by step): every client's
    X_s, y_s, last adjacency and H_s agree with :func:`distill_graph`'s."""
    models = random_gcns(4, num_features=12, num_classes=3, readout=readout)
    x0, y0 = broadcast_graph(4, 3, 12, torch.Generator().manual_seed(1))
    generator = torch.Generator().manual_seed(2)
    alone = [distill_graph(model, x0, y0, 3, SETTINGS, generator) for model in models]
    stacked = StackedGCN(models[0])
    params = stacked.gather(models)
    together = distill_graphs(stacked, params, x0, y0, 3, SETTINGS, torch.Generator().manual_seed(2))
    assert together.x.shape == (4, 12, 12) and together.hidden.shape == (4, 12, alone[0].hidden.size(1))
    for k, graph in enumerate(alone):
        assert torch.equal(together.adj[k], graph.adj)
        assert torch.allclose(together.x[k], graph.x, atol=1e-5)
        assert torch.allclose(together.labels[k], graph.labels, atol=1e-5)
        assert torch.allclose(together.hidden[k], graph.hidden, atol=1e-5)
    assert not torch.allclose(together.x[0], together.x[1], atol=1e-2)  # each client its own problem
    assert all(torch.equal(p, q) for p, q in zip(params, stacked.gather(models)))  # models untouched


def test_gram_product_has_the_gradient_of_autograd():
    x = torch.randn(3, 5, 4, dtype=torch.float64, requires_grad=True)
    weights = torch.randn(3, 5, 5, dtype=torch.float64)
    expected = torch.autograd.grad((x @ x.transpose(1, 2) * weights).sum(), x)[0]
    assert torch.allclose(torch.autograd.grad((_Gram.apply(x) * weights).sum(), x)[0], expected)


def fedgkd(graph, engine, participation=1.0):
    fed = federation(graph, clients=4, readout=True, engine=engine, participation=participation)
    return build_method(resolve_method("fedgkd", {"tau_s": 9.0, "nodes_per_class": 3}), fed)


@pytest.mark.parametrize("participation", [1.0, 0.5])
def test_fast_round_equals_the_sequential_round(sbm, participation):
    """Two rounds on the engine (dropout masks drawn in the sequential order, batched
    distillation, stacked W̄_i) against the per-client reference: the same task features,
    aggregation weights and personalised models up to float rounding."""
    ref, fast = fedgkd(sbm, None, participation), fedgkd(sbm, "sequential", participation)
    assert fast.batched_distillation and not ref.batched_distillation
    for round_ in (1, 2):
        ks = ref.participants(round_)
        assert fast.participants(round_) == ks
        torch.manual_seed(round_)  # the same dropout masks
        ref_uploads = ref.client_updates(ks, round_)
        torch.manual_seed(round_)
        fast_uploads = fast.client_updates(ks, round_)
        for k in ks:
            assert torch.allclose(fast_uploads[k].extras["task_feature"], ref_uploads[k].extras["task_feature"],
                                  atol=1e-4)
            assert fast_uploads[k].loss == pytest.approx(ref_uploads[k].loss, rel=1e-5)
        ref.server_update(round_, ref_uploads)
        fast.server_update(round_, fast_uploads)
        assert torch.allclose(fast.weights, ref.weights, atol=1e-6)
        for a, b in zip(fast.states, ref.states):
            for p, q in zip(a.received.parameters(), b.received.parameters()):
                assert torch.allclose(p, q, atol=1e-5)
