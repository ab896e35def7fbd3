"""Shared pieces for graphless clients: the MLP of the zoo, the GCN on a dense differentiable
adjacency, per-client models for graphless clients (``model.graphless``)."""

from __future__ import annotations

import pytest
import torch

from fglrepro.config import ConfigError, ModelConfig
from fglrepro.fl.clients import normalized_adjacency
from fglrepro.models import GCN, MLP, GCNLayer, build_model


@pytest.fixture
def graph():
    gen = torch.Generator().manual_seed(0)
    edges = torch.randint(0, 12, (2, 30), generator=gen)
    edges = torch.cat([edges, edges.flip(0)], dim=1)
    edges = edges[:, edges[0] != edges[1]].unique(dim=1)
    return torch.randn(12, 5, generator=gen), normalized_adjacency(edges, 12)


def mlp_like(gcn: GCN) -> MLP:
    """An MLP with the layers of ``gcn`` (its GCN weights as linear weights)."""
    mlp = MLP(5, 8, 3, layers=len(gcn.convs), dropout=gcn.dropout, readout=gcn.readout is not None)
    with torch.no_grad():
        for lin, conv in zip(mlp.lins, gcn.convs):
            lin.weight.copy_(conv.lin.weight)
            lin.bias.copy_(conv.bias)
        if gcn.readout is not None:
            mlp.readout.load_state_dict(gcn.readout.state_dict())
    return mlp


@pytest.mark.parametrize("layers, readout", [(1, False), (2, False), (2, True), (3, True)])
def test_mlp_is_a_gcn_on_the_identity_operator(graph, layers, readout):
    x, adj = graph
    gcn = GCN(5, 8, 3, layers=layers, readout=readout).eval()
    mlp = mlp_like(gcn).eval()
    identity = torch.eye(12)
    hidden, logits = mlp(x, adj, return_hidden=True)
    gcn_hidden, gcn_logits = gcn(x, identity, return_hidden=True)
    assert torch.allclose(logits, gcn_logits, atol=1e-6) and torch.allclose(hidden, gcn_hidden, atol=1e-6)
    assert not torch.allclose(logits, gcn(x, adj), atol=1e-3)  # the graph does matter to the GCN
    assert torch.equal(mlp(x, adj), mlp(x, identity))  # and never to the MLP
    assert hidden.shape == (12, 8 if readout or layers > 1 else 5)


def test_mlp_in_the_zoo_takes_the_gcn_keys(graph):
    model = build_model(ModelConfig(arch="mlp", hidden=7, layers=3, dropout=0.2, readout=True), 5, 3)
    assert isinstance(model, MLP) and (model.layers, model.hidden, model.dropout) == (3, 7, 0.2)
    assert [tuple(lin.weight.shape) for lin in model.lins] == [(7, 5), (7, 7), (7, 7)]
    assert tuple(model.readout.weight.shape) == (3, 7)
    with pytest.raises(ConfigError, match="model.hops and model.alpha apply to .* not 'mlp'"):
        build_model(ModelConfig(arch="mlp", hops=2), 5, 3)


def test_gcn_on_a_dense_adjacency_equals_the_sparse_path(graph):
    x, adj = graph
    model = GCN(5, 8, 3, layers=2, readout=True).eval()
    assert torch.allclose(model(x, adj.to_dense()), model(x, adj), atol=1e-6)


def test_the_gradient_reaches_a_dense_adjacency():
    gen = torch.Generator().manual_seed(1)
    x, upstream = torch.randn(6, 4, generator=gen), torch.randn(6, 3, generator=gen)
    adj = torch.rand(6, 6, generator=gen).requires_grad_(True)
    layer = GCNLayer(4, 3)
    layer(x, adj).backward(upstream)
    # X' = A X W^T + b  =>  dL/dA = U (X W^T)^T
    expected = upstream @ (x @ layer.lin.weight.t()).t()
    assert torch.allclose(adj.grad, expected, atol=1e-6) and adj.grad.abs().sum() > 0
    model = GCN(4, 8, 3, layers=2, readout=True)
    adj.grad = None
    model(x, adj).sum().backward()
    assert adj.grad is not None and adj.grad.abs().sum() > 0


def test_graphless_clients_take_the_graphless_overrides():
    config = ModelConfig(hidden=16, readout=True, clients=[{}, {"hidden": 8}], graphless={"arch": "mlp"})
    assert config.heterogeneous and not ModelConfig().heterogeneous
    assert config.for_client(0) == ModelConfig(hidden=16, readout=True)
    assert config.for_client(1, graphless=True) == ModelConfig(arch="mlp", hidden=8, readout=True)
    assert config.for_client(2, graphless=True) == ModelConfig(arch="mlp", hidden=16, readout=True)
    assert len(config.variants()) == 4
    with pytest.raises(ConfigError, match=r"model.graphless must be a mapping of model keys other than"):
        ModelConfig(graphless={"clients": []}).for_client(0, graphless=True)
    with pytest.raises(ConfigError, match=r"unknown key\(s\) \['width'\] in model.graphless"):
        ModelConfig(graphless={"width": 3}).for_client(0, graphless=True)
