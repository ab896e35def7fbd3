"""O-pFGL with a GAT (Table 19): the surrogate graph's edge weights reach the attention.

The surrogate graph is a weighted, as a rule complete, graph; GAT layers that read only the
pattern of the operator saw every pair as an edge of weight 1 (uniform attention over all
classes), and the stage-1 model was at chance on the clients' graphs (issue 29)."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from helpers import make_method
from test_zoo_architectures import toy_graph

from fglrepro.config import ConfigError, ModelConfig
from fglrepro.models import WeightedEdges, build_model

FAST = {"surrogate_iterations": 60, "stage1_steps": 60, "finetune_steps": 60, "eval_every": 20}


def dense_weighted_gat(model, x: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """Reference: each layer ``softmax_j(LeakyReLU(a_dst h_i + a_src h_j) + log w_ij) h_j + b``
    over ``j`` with ``w_ij > 0`` or ``j = i`` (self-loop weight 1), ``weights [n, n]`` zero diagonal."""
    with_loops = weights + torch.eye(weights.size(0))
    for i, conv in enumerate(model.convs):
        h = conv.lin(x)
        score_src = (h * conv.att_src.view(1, -1)).sum(-1)
        score_dst = (h * conv.att_dst.view(1, -1)).sum(-1)
        scores = F.leaky_relu(score_dst[:, None] + score_src[None, :], conv.negative_slope) + with_loops.log()
        x = torch.softmax(scores, dim=1) @ h + conv.bias
        if i < len(model.convs) - 1:
            x = F.relu(x)
    return x


def test_gat_attention_is_weighted_by_the_edge_weights():
    x, edges, adj = toy_graph()
    n = x.size(0)
    gen = torch.Generator().manual_seed(1)
    weights = torch.zeros(n, n)
    weights[edges[1], edges[0]] = 0.05 + torch.rand(edges.size(1), generator=gen)
    weights = (weights + weights.T) / 2
    torch.manual_seed(0)
    model = build_model(ModelConfig(arch="gat", hidden=8, dropout=0.0), 5, 3)
    graph = WeightedEdges.of_dense(weights)
    assert graph.edge_index.size(1) == edges.size(1)
    assert torch.allclose(model(x, graph), dense_weighted_gat(model, x, weights), atol=1e-6)
    unit = WeightedEdges.of_dense((weights > 0).float())
    assert torch.allclose(model(x, unit), model(x, adj), atol=1e-6)  # weight 1: GAT itself


def test_gat_without_weights_is_pyg_gatconv_operation_for_operation():
    from torch_geometric.nn import GATConv

    x, edges, adj = toy_graph()
    torch.manual_seed(0)
    model = build_model(ModelConfig(arch="gat", hidden=8, dropout=0.0), 5, 3)
    torch.manual_seed(0)
    first, second = GATConv(5, 8), GATConv(8, 3)
    assert torch.equal(model(x, adj), second(F.relu(first(x, edges)), edges))


def test_only_gat_takes_edge_weights():
    graph = WeightedEdges.of_dense(torch.tensor([[0.0, 0.5], [0.5, 0.0]]))
    model = build_model(ModelConfig(arch="sage", hidden=8), 5, 3)
    assert not model.takes_edge_weights
    with pytest.raises(ConfigError, match="'sage' takes no edge weights; only 'gat' does"):
        model(torch.randn(2, 5), graph)


def test_opfgl_stage1_of_a_gat_trains_on_the_surrogate_edge_weights(sbm):
    """Stage 1 from the same start on the surrogate graph and on its pattern with weight 1
    must differ: before the fix the GAT ignored the weights and both runs were equal."""
    method = make_method(sbm, "opfgl", {**FAST, "variant": "global"}, rounds=1,
                         model=ModelConfig(arch="gat", hidden=16, dropout=0.0))
    method.server_update(1, method.client_updates(method.participants(1), 1))
    model, start, weights = method.states[0].model, copy.deepcopy(method.states[0].model.state_dict()), \
        method.surrogate.weights
    assert torch.all(weights[weights > 0] < 1)

    def stage1(surrogate_weights: torch.Tensor) -> list[torch.Tensor]:
        model.load_state_dict(start)
        method.surrogate.weights = surrogate_weights
        method.on_download(0, 1)
        return [p.detach().clone() for p in model.parameters()]

    weighted, unit = stage1(weights), stage1((weights > 0).to(weights.dtype))
    assert any(not torch.equal(p, q) for p, q in zip(weighted, unit))
