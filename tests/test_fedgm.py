"""FedGM: synthetic label budget, the pairwise link predictor, gradient matching that lowers the
matching loss, and the server's model on the union of the condensed graphs."""

from __future__ import annotations

import copy
from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F
from helpers import make_method, one_round
from test_renode import NO_DROPOUT

from fglrepro.components.surrogate_graph import dense_normalized_adjacency
from fglrepro.config import EvalConfig
from fglrepro.fl.loop import run_federation
from fglrepro.methods.fedgm import (
    CondensedGraph,
    FedGMHparams,
    PairwiseLinkPredictor,
    block_union,
    class_gradients,
    condense,
    initial_features,
    matching_loss,
    reinitialise,
    synthetic_labels,
)

FAST = {"outer_epochs": 40, "server_steps": 30, "pge_hidden": 16}


def test_synthetic_labels_keep_the_class_shares_and_fill_the_largest_class():
    labels = torch.tensor([0] * 10 + [1] * 5 + [2] * 1)
    out = synthetic_labels(labels, 4, 0.84)
    # floor(8.4) = 8, floor(4.2) = 4, floor(0.84) = 0; floor(13.44) = 13 in all: one more to class 0
    assert torch.bincount(out, minlength=4).tolist() == [9, 4, 0, 0]


def test_link_predictor_is_the_mlp_on_concatenated_pairs_symmetric_without_loops():
    torch.manual_seed(0)
    pge = PairwiseLinkPredictor(5, 8, 3)
    x = torch.randn(6, 5)
    adj = pge(x)
    pairs = torch.cat([x.repeat_interleave(6, dim=0), x.repeat(6, 1)], dim=1)  # row i*6+j: x_i || x_j
    h = F.relu(pge.norms[0](pge.first(pairs)))
    h = F.relu(pge.norms[1](pge.hidden[0](h)))
    logits = pge.last(h).view(6, 6)
    expected = torch.sigmoid((logits + logits.t()) / 2)
    expected.fill_diagonal_(0)
    assert torch.allclose(adj, expected, atol=1e-6)
    assert torch.equal(adj, adj.t()) and torch.all(adj.diagonal() == 0)


def test_matching_loss_is_the_weighted_squared_gradient_distance():
    same = (torch.tensor([0.0, 0.0]), torch.tensor([[1.0]]))
    real = {0: (torch.tensor([1.0, 2.0]), torch.tensor([[3.0]])), 1: same}
    synthetic = {0: (torch.tensor([1.0, 0.0]), torch.tensor([[4.0]])), 1: same}
    # class 0: (0 + 4 + 1) * 0.5, class 1: identical gradients
    assert matching_loss(synthetic, real, {0: 0.5, 1: 1.0}).item() == pytest.approx(2.5)
    assert matching_loss(real, real, {0: 0.5, 1: 1.0}).item() == 0.0


def mean_matching_loss(client, model, features, adj, labels, draws: int = 8) -> float:
    """The matching loss ``sum_c w_c ||g'_c - g_c||^2`` of a synthetic graph (written out here, not
    the module's), averaged over freshly initialised GCNs."""
    model = copy.deepcopy(model)
    gen = torch.Generator().manual_seed(123)
    classes = labels.unique().tolist()
    per_class = torch.bincount(labels)
    weights = {c: float(per_class[c]) / float(per_class.max()) for c in classes}
    train = client.train_mask
    total = 0.0
    for _ in range(draws):
        reinitialise(model, gen)
        real = class_gradients(model, model(client.x, client.adj)[train], client.y[train], classes)
        synthetic = class_gradients(model, model(features, dense_normalized_adjacency(adj)), labels, classes)
        total += sum(weights[c] * sum(((s - r) ** 2).sum().item() for s, r in zip(synthetic[c], real[c]))
                     for c in classes)
    return total / draws


def test_condensation_lowers_the_gradient_matching_loss(sbm):
    method = make_method(sbm, "fedgm", FAST, rounds=1, model=NO_DROPOUT)
    client, model = method.clients[0], method.federation.model
    hparams = FedGMHparams(**{**FAST, "outer_epochs": 80})
    graph = condense(client, model, hparams, torch.Generator().manual_seed(0))
    labels = synthetic_labels(client.y[client.train_mask], client.num_classes, hparams.reduction_rate)
    assert torch.equal(graph.y, labels)
    # the same draws without learning: the initial features and the initial link predictor's graph
    frozen = condense(client, model, replace(hparams, feature_lr=0.0, pge_lr=0.0), torch.Generator().manual_seed(0))
    assert torch.equal(frozen.x, initial_features(client, labels, torch.Generator().manual_seed(0)))
    before = mean_matching_loss(client, model, frozen.x, frozen.adj, labels)
    after = mean_matching_loss(client, model, graph.x, graph.adj, labels)
    assert after < 0.8 * before, (before, after)


def reference_condense(client, model, hparams: FedGMHparams, generator: torch.Generator) -> CondensedGraph:
    """The condensation loop written out with one full backward pass per step (both sides'
    gradients, then the scheduled side's optimiser steps)."""
    model = copy.deepcopy(model)
    labels = synthetic_labels(client.y[client.train_mask], client.num_classes, hparams.reduction_rate)
    features = initial_features(client, labels, generator).requires_grad_(True)
    pge = PairwiseLinkPredictor(client.x.size(1), hparams.pge_hidden, hparams.pge_layers)
    feature_opt = torch.optim.Adam([features], lr=hparams.feature_lr)
    pge_opt = torch.optim.Adam(pge.parameters(), lr=hparams.pge_lr)
    per_class = torch.bincount(labels, minlength=client.num_classes)
    classes = per_class.nonzero().flatten().tolist()
    weights = {c: float(per_class[c]) / float(per_class.max()) for c in classes}
    train, best_loss = client.train_mask, float("inf")
    for epoch in range(hparams.outer_epochs):
        reinitialise(model, generator)
        real = class_gradients(model, model(client.x, client.adj)[train], client.y[train], classes)
        real = {c: tuple(g.detach() for g in grads) for c, grads in real.items()}
        adj = pge(features)
        logits = model(features, dense_normalized_adjacency(adj))
        loss = matching_loss(class_gradients(model, logits, labels, classes, create_graph=True), real, weights)
        if loss.item() < best_loss:
            best_loss, best = loss.item(), (features.detach().clone(), adj.detach().clone())
        feature_opt.zero_grad()
        pge_opt.zero_grad()
        loss.backward()
        (pge_opt if epoch % (hparams.pge_steps + hparams.feature_steps) < hparams.pge_steps else feature_opt).step()
    return CondensedGraph(x=best[0], adj=best[1], y=labels)


def test_condensation_steps_each_side_on_its_gradient_from_the_full_backward_pass(sbm):
    # 25 steps: link predictor, features, link predictor again; bit for bit
    method = make_method(sbm, "fedgm", FAST, rounds=1, model=NO_DROPOUT)
    client, model = method.clients[0], method.federation.model
    hparams = FedGMHparams(**{**FAST, "outer_epochs": 25})
    torch.manual_seed(1)  # the link predictor's initial weights
    graph = condense(client, model, hparams, torch.Generator().manual_seed(0))
    torch.manual_seed(1)
    expected = reference_condense(client, model, hparams, torch.Generator().manual_seed(0))
    assert torch.equal(graph.x, expected.x) and torch.equal(graph.adj, expected.adj)
    assert not torch.equal(graph.x, initial_features(client, graph.y, torch.Generator().manual_seed(0)))


def test_server_trains_one_model_on_the_union_of_the_uploads(sbm):
    method = make_method(sbm, "fedgm", FAST, rounds=1, model=NO_DROPOUT)
    uploads = one_round(method, 1)
    sizes = [u.extras["x"].size(0) for u in uploads.values()]
    union = method.union
    assert union.x.size(0) == sum(sizes) and union.adj.shape == (sum(sizes), sum(sizes))
    # block-diagonal: no edge between two clients' synthetic nodes
    assert union.adj[: sizes[0], sizes[0]:].abs().max() == 0
    assert all(state.received is method.global_model for state in method.states)
    assert not any(torch.equal(p, q) for p, q in zip(method.global_model.parameters(),
                                                      method.federation.model.parameters()))
    adj = dense_normalized_adjacency(union.adj)
    with torch.no_grad():
        losses = [F.cross_entropy(m(union.x, adj), union.y).item()
                  for m in (method.federation.model, method.global_model)]
    assert losses[1] < 0.8 * losses[0]


def test_block_union_keeps_each_graph_in_its_block():
    graphs = [CondensedGraph(x=torch.ones(n, 2), adj=torch.ones(n, n) - torch.eye(n), y=torch.arange(n))
              for n in (2, 3)]
    union = block_union(graphs)
    assert union.adj.shape == (5, 5) and union.adj[:2, 2:].abs().sum() == 0
    assert union.y.tolist() == [0, 1, 0, 1, 2]


def test_one_shot_run_with_fine_tuning(sbm):
    method = make_method(sbm, "finetune", {"base": "fedgm", "base_hparams": FAST, "epochs": 20},
                         rounds=1, model=NO_DROPOUT, evaluation=EvalConfig(model="global"))
    history = run_federation(method, 1, EvalConfig(model="global"))
    assert history.final["weighted"]["test_acc"] > 0.4


def test_fedgm_is_one_shot(cora):
    with pytest.raises(Exception, match="one-shot"):
        make_method(cora, "fedgm", FAST, rounds=2)
