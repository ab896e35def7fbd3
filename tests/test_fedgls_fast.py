"""FedGLS fast path: the batched local epochs agree with the per-client sequential ones."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from conftest import make_sbm
from helpers import make_method, one_round

from fglrepro.components.graph_learning import GraphLearner
from fglrepro.config import EvalConfig, ModelConfig
from fglrepro.methods.fedgls import SPARSE_BELOW
from fglrepro.partition.build import PartitionSpec

HALF = PartitionSpec("metis", "stratified", 0.4, 0.3, graphless_ratio=0.5)


@pytest.fixture
def bow():
    """Sparse non-negative features (about 6 % non-zeros, no ties in the similarities)."""
    data = make_sbm(num_features=32)
    data.x = (data.x - 1.5).clamp_min(0.0)
    return data


def test_sparse_graph_learner_equals_the_dense_one_with_its_gradient(bow):
    x = bow.x[:60]
    assert x.count_nonzero() < SPARSE_BELOW * x.numel()
    dense, sparse = GraphLearner(x.size(1), 5), GraphLearner(x.size(1), 5, sparse=True)
    with torch.no_grad():
        for w in (*dense.parameters(), *sparse.parameters()):
            w.uniform_(0.5, 1.5, generator=torch.Generator().manual_seed(0))
    outputs = [learner(x) for learner in (dense, sparse)]
    torch.testing.assert_close(outputs[1], outputs[0], rtol=1e-5, atol=1e-6)
    probe = torch.randn(60, 60, generator=torch.Generator().manual_seed(1))
    for out in outputs:
        (out * probe).sum().backward()
    for a, b in zip(dense.parameters(), sparse.parameters()):
        torch.testing.assert_close(b.grad, a.grad, rtol=1e-5, atol=1e-6)


def fedgls(data, engine: str, participation: float):
    model = ModelConfig(hidden=16, readout=True, dropout=0.0)  # dropout off: both paths draw alike
    return make_method(data, "fedgls", {"k": 5}, model=model, evaluation=EvalConfig(model="global"),
                       num_clients=4, partition=HALF, engine=engine, participation=participation,
                       local_epochs=3)


@pytest.mark.parametrize("participation", [1.0, 0.5])
def test_batched_epochs_agree_with_the_sequential_path(bow, participation):
    fast, slow = fedgls(bow, "auto", participation), fedgls(bow, "sequential", participation)
    learners = [s.modules["learner"] for s in fast.states if "learner" in s.modules]
    assert learners and all(learner.sparse for learner in learners)
    for round_ in (1, 2, 3):  # optimiser states and learned graphs carried across rounds
        fast_uploads, slow_uploads = one_round(fast, round_), one_round(slow, round_)
        assert fast_uploads.keys() == slow_uploads.keys()
        for k, upload in fast_uploads.items():
            assert upload.loss == pytest.approx(slow_uploads[k].loss, rel=1e-5)
            for name, p in upload.params.items():
                torch.testing.assert_close(p, slow_uploads[k].params[name], rtol=1e-5, atol=1e-6)
    for a, b in zip(fast.clients, slow.clients):
        torch.testing.assert_close(a.adj, b.adj, rtol=1e-5, atol=1e-6)
    for name, p in fast.global_encoder.named_parameters():
        torch.testing.assert_close(p, dict(slow.global_encoder.named_parameters())[name], rtol=1e-5, atol=1e-6)


def test_the_batched_encoder_step_moves_only_the_encoder(bow):
    method = fedgls(bow, "auto", 1.0)
    learner = {k: [p.clone() for p in s.modules["learner"].parameters()]
               for k, s in enumerate(method.states) if "learner" in s.modules}
    ks = list(range(len(method.clients)))
    for k in ks:
        method.receive(k, 1)
    method.federation.train = dataclasses.replace(method.federation.train, lr=0.0)  # θ cannot move
    theta = [p.clone() for p in method.states[0].model.parameters()]
    phi = [p.clone() for p in method.states[0].modules["encoder"].parameters()]
    method.batched_epochs(ks)
    assert all(torch.equal(a, b) for a, b in zip(theta, method.states[0].model.parameters()))
    assert not all(torch.equal(a, b) for a, b in zip(phi, method.states[0].modules["encoder"].parameters()))
    for k, before in learner.items():
        assert all(torch.equal(a, b) for a, b in zip(before, method.states[k].modules["learner"].parameters()))
