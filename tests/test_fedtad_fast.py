"""Fast path of the generator-based distillation (FedTAD, DENSE, Co-Boost): the stacked
teachers, the pairwise diversity loss and a whole server step agree with the sequential path."""

from __future__ import annotations

import pytest
import torch
from helpers import all_clients, make_method

from fglrepro.components.generator import Teachers, knn_pseudo_graph, noise_diversity_loss, uploaded_teachers
from fglrepro.config import ModelConfig
from fglrepro.fl.clients import normalized_adjacency
from fglrepro.models import GCN

TOLERANCE = {"rtol": 1e-5, "atol": 1e-6}
NO_DROPOUT = ModelConfig(hidden=16, dropout=0.0)  # both paths then draw no random numbers


def gcns(count: int, num_features: int, readout: bool = False) -> list[GCN]:
    torch.manual_seed(0)
    return [GCN(num_features, 8, 3, layers=2, dropout=0.5, readout=readout).eval().requires_grad_(False)
            for _ in range(count)]


@pytest.mark.parametrize("readout", [False, True])
def test_stacked_teachers_give_each_teachers_logits_and_gradient(readout):
    models = gcns(4, 12, readout)
    x = torch.randn(20, 12, generator=torch.Generator().manual_seed(1))
    adj = knn_pseudo_graph(x, 3)
    grads = []
    for batched in (False, True):
        teachers = Teachers(models, batched)
        assert (teachers.stacked is not None) == batched
        nodes = x.clone().requires_grad_(True)
        logits = teachers(nodes, adj)
        assert logits.shape == (4, 20, 3)
        torch.testing.assert_close(logits, torch.stack([m(x, adj) for m in models]), **TOLERANCE)
        (logits * torch.arange(4.0).view(4, 1, 1)).sum().backward()  # a different weight per teacher
        grads.append(nodes.grad)
    torch.testing.assert_close(grads[1], grads[0], **TOLERANCE)


def test_models_of_other_kinds_run_one_by_one():
    models = gcns(2, 12)
    other = GCN(12, 8, 3, layers=3).eval()
    assert Teachers([*models, other], batched=True).stacked is None
    x = torch.randn(10, 12)
    adj = knn_pseudo_graph(x, 3)
    torch.testing.assert_close(Teachers([*models, other], batched=True)(x, adj),
                               torch.stack([m(x, adj) for m in (*models, other)]))


def test_pairwise_diversity_loss_equals_the_full_one_with_its_gradient():
    gen = torch.Generator().manual_seed(0)
    z, x = torch.randn(30, 8, generator=gen), torch.randn(30, 50, generator=gen) * 0.1
    values, grads = [], []
    for fast in (False, True):
        nodes = x.clone().requires_grad_(True)
        loss = noise_diversity_loss(z, nodes, fast)
        loss.backward()
        values.append(loss.detach())
        grads.append(nodes.grad)
    torch.testing.assert_close(values[1], values[0], **TOLERANCE)
    torch.testing.assert_close(grads[1], grads[0], **TOLERANCE)


def test_pseudo_graph_keeps_the_edges_of_a_sorted_unique_list():
    x = torch.randn(40, 6, generator=torch.Generator().manual_seed(3))
    unit = torch.nn.functional.normalize(x, dim=1)
    neighbours = (unit @ unit.t()).topk(5, dim=1).indices
    edges = torch.stack([torch.arange(40).repeat_interleave(5), neighbours.reshape(-1)])
    edges = torch.cat([edges, edges.flip(0)], dim=1)
    expected = normalized_adjacency(edges[:, edges[0] != edges[1]].unique(dim=1), 40)
    got = knn_pseudo_graph(x, 5)
    for part in ("crow_indices", "col_indices", "values"):
        assert torch.equal(getattr(got, part)(), getattr(expected, part)())


def test_teachers_stacked_from_the_uploads_equal_the_rebuilt_models(sbm):
    method = make_method(sbm, "fedtad", model=NO_DROPOUT)
    uploads = all_clients(method, 1)
    direct = uploaded_teachers(method.base, uploads, training=False, batched=True)
    rebuilt = uploaded_teachers(method.base, uploads, training=False, batched=False)
    assert direct.models == [] and direct.stacked is not None and rebuilt.stacked is None
    x = torch.randn(15, sbm.num_features)
    adj = knn_pseudo_graph(x, 3)
    torch.testing.assert_close(direct(x, adj), rebuilt(x, adj), **TOLERANCE)


def server_step(data, name: str, hparams: dict, engine: str) -> list[torch.nn.Module]:
    method = make_method(data, name, hparams, model=NO_DROPOUT, engine=engine, rounds=1)
    uploads = all_clients(method, 1)
    method.server_update(1, uploads)
    return method.server_models()


@pytest.mark.parametrize("name, hparams", [
    ("fedtad", {"distill_epochs": 3, "distill_steps": 2, "generator_steps": 2}),
    ("dense", {"distill_epochs": 3, "distill_steps": 2, "generator_steps": 2, "num_pseudo_nodes": 40}),
    ("dense", {"distill_epochs": 3, "student": "personal", "num_pseudo_nodes": 40, "lambda_div": 1.0}),
    ("coboost", {"distill_epochs": 3, "distill_steps": 2, "generator_steps": 2, "num_pseudo_nodes": 40}),
])
def test_a_server_step_on_the_fast_path_agrees_with_the_sequential_one(sbm, name, hparams):
    fast, slow = server_step(sbm, name, hparams, "auto"), server_step(sbm, name, hparams, "sequential")
    assert len(fast) == len(slow) >= 1
    for a, b in zip(fast, slow):
        for (name_a, p), (name_b, q) in zip(a.named_parameters(), b.named_parameters()):
            assert name_a == name_b
            torch.testing.assert_close(p, q, rtol=1e-4, atol=1e-5)


def test_dense_pseudo_graph_has_the_values_of_the_sparse_one():
    x = torch.randn(30, 6, generator=torch.Generator().manual_seed(5))
    sparse, dense = knn_pseudo_graph(x, 4), knn_pseudo_graph(x, 4, dense=True)
    assert dense.layout == torch.strided and sparse.layout == torch.sparse_csr
    torch.testing.assert_close(dense, sparse.to_dense(), rtol=1e-6, atol=0)


@pytest.mark.parametrize("readout", [False, True])
def test_stacked_teachers_on_a_dense_graph_give_each_teachers_logits(readout):
    models = gcns(3, 12, readout)
    x = torch.randn(25, 12, generator=torch.Generator().manual_seed(2))
    dense = knn_pseudo_graph(x, 3, dense=True)
    logits = Teachers(models, batched=True)(x, dense)
    torch.testing.assert_close(logits, torch.stack([m(x, knn_pseudo_graph(x, 3)) for m in models]), **TOLERANCE)
