"""GAT, GraphSAGE, GIN and the deep GCN with jumping knowledge against PyG's own models, the
encoder -> hidden -> linear head form of every architecture, and FedGKC's two zoos."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from fglrepro.config import ConfigError, ModelConfig, from_dict
from fglrepro.fl.clients import normalized_adjacency
from fglrepro.models import GCN, SGC, PyGNet, build_model, edge_index_of, hidden_width

#: FedGKC section 5.1.3: client k gets architecture k mod 5 (the two heterogeneous scenarios).
DIVERGENT = [{"arch": "gcn"}, {"arch": "gat"}, {"arch": "sage"}, {"arch": "gin"}, {"arch": "sgc", "hops": 2}]
SCALES = [{"arch": "sgc", "hops": 2}, {"arch": "gcn", "layers": 2}, {"arch": "gcn", "layers": 4, "jk": "max"},
          {"arch": "gcn", "layers": 6, "jk": "max"}, {"arch": "gcn", "layers": 8, "jk": "max"}]


def toy_graph(num_nodes: int = 12, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Features ``[n, 5]``, undirected edges without self-loops (the last node isolated) and
    the normalised operator of the same edges plus one input self-loop (which the operator
    replaces by its own)."""
    gen = torch.Generator().manual_seed(seed)
    edges = torch.randint(0, num_nodes - 1, (2, 2 * num_nodes), generator=gen)
    edges = torch.cat([edges, edges.flip(0)], dim=1)
    edges = edges[:, edges[0] != edges[1]].unique(dim=1)
    with_loop = torch.cat([edges, torch.tensor([[3], [3]])], dim=1)
    return torch.randn(num_nodes, 5, generator=gen), edges, normalized_adjacency(with_loop, num_nodes)


def copy_parameters(source: torch.nn.Module, target: torch.nn.Module) -> None:
    """Copy ``source``'s parameters into ``target`` in registration order (same shapes)."""
    pairs = list(zip(source.parameters(), target.parameters()))
    assert len(pairs) == len(list(target.parameters())) == len(list(source.parameters()))
    with torch.no_grad():
        for s, t in pairs:
            assert s.shape == t.shape
            t.copy_(s)


def sorted_edges(edge_index: torch.Tensor) -> list[tuple[int, int]]:
    return sorted(map(tuple, edge_index.t().tolist()))


def test_edges_are_the_operators_pattern_without_the_diagonal():
    x, edges, adj = toy_graph()
    found = edge_index_of(adj)
    assert sorted_edges(found) == sorted_edges(edges)
    assert edge_index_of(adj) is found  # cached per operator
    dense = edge_index_of(adj.to_dense())
    assert sorted_edges(dense) == sorted_edges(edges)
    one_entry = torch.sparse_coo_tensor([[0, 0, 1, 2], [0, 1, 1, 2]], torch.ones(4), (3, 3)).to_sparse_csr()
    assert edge_index_of(one_entry).tolist() == [[1], [0]]  # adj[0, 1]: node 0 aggregates node 1


@pytest.mark.parametrize("arch, pyg_name", [("gat", "GAT"), ("sage", "GraphSAGE"), ("gin", "GIN")])
@pytest.mark.parametrize("layers", [1, 2, 3])
def test_message_passing_models_equal_pyg_models_on_the_raw_edges(arch, pyg_name, layers):
    import torch_geometric.nn.models as pyg_models

    x, edges, adj = toy_graph(seed=layers)
    torch.manual_seed(layers)
    ours = build_model(ModelConfig(arch=arch, hidden=8, layers=layers, dropout=0.0), 5, 3).eval()
    reference = getattr(pyg_models, pyg_name)(5, 8, layers, out_channels=3, dropout=0.0).eval()
    copy_parameters(ours, reference)
    x_ours, x_ref = x.clone().requires_grad_(True), x.clone().requires_grad_(True)
    out_ours, out_ref = ours(x_ours, adj), reference(x_ref, edges)
    assert torch.allclose(out_ours, out_ref, atol=1e-6)
    upstream = torch.randn(out_ours.shape, generator=torch.Generator().manual_seed(1))
    out_ours.backward(upstream)
    out_ref.backward(upstream)
    assert torch.allclose(x_ours.grad, x_ref.grad, atol=1e-6)
    assert all(torch.allclose(p.grad, q.grad, atol=1e-6) for p, q in zip(ours.parameters(), reference.parameters()))


def test_message_passing_models_use_pyg_layers_with_their_initialisation():
    from torch_geometric.nn import GATConv, GINConv, SAGEConv

    for arch, layer in (("gat", GATConv), ("sage", SAGEConv), ("gin", GINConv)):
        torch.manual_seed(0)
        model = build_model(ModelConfig(arch=arch, hidden=8), 5, 3)
        assert isinstance(model, PyGNet) and all(isinstance(conv, layer) for conv in model.convs)
    torch.manual_seed(0)
    ours = build_model(ModelConfig(arch="gat", hidden=8), 5, 3)
    torch.manual_seed(0)
    first, second = GATConv(5, 8), GATConv(8, 3)
    reference = [*first.parameters(), *second.parameters()]
    assert all(torch.equal(p, q) for p, q in zip(ours.parameters(), reference))


@pytest.mark.parametrize("jk", ["max", "cat"])
@pytest.mark.parametrize("layers", [2, 4])
def test_deep_gcn_with_jumping_knowledge_equals_pyg_jknet(jk, layers):
    import torch_geometric.nn.models as pyg_models

    x, _, adj = toy_graph(seed=layers)
    torch.manual_seed(0)
    ours = GCN(5, 8, 3, layers=layers, dropout=0.0, readout=True, jk=jk).eval()
    reference = pyg_models.GCN(5, 8, layers, out_channels=3, dropout=0.0, jk=jk, normalize=False).eval()
    copy_parameters(ours, reference)
    hidden, logits = ours(x, adj, return_hidden=True)
    assert torch.allclose(logits, reference(x, adj), atol=1e-6)
    assert hidden.shape == (12, 8 * (layers if jk == "cat" else 1))
    assert hidden_width(ModelConfig(hidden=8, layers=layers, readout=True, jk=jk)) == hidden.size(1)


@pytest.mark.parametrize("spec", DIVERGENT + SCALES, ids=lambda s: "-".join(f"{v}" for v in s.values()))
def test_every_zoo_model_has_an_encoder_to_hidden_and_a_linear_head_and_trains(spec):
    x, _, adj = toy_graph()
    config = from_dict(ModelConfig, {"hidden": 16, "readout": True, **spec}, "model")
    model = build_model(config, 5, 3)
    hidden, logits = model(x, adj, return_hidden=True)
    assert hidden.shape == (12, 16) == (12, hidden_width(config))
    assert isinstance(model.readout, torch.nn.Linear) and model.readout.in_features == 16
    assert torch.equal(logits, model.readout(hidden))  # return_hidden gives the head's input
    before = [p.detach().clone() for p in model.parameters()]
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    loss = torch.nn.functional.cross_entropy(model(x, adj), torch.arange(12) % 3)
    loss.backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in model.parameters())
    optimizer.step()
    assert all(not torch.equal(a, p) for a, p in zip(before, model.parameters()))


def test_sgc_readout_is_a_head_on_the_propagated_encoding():
    x, _, adj = toy_graph()
    model = SGC(5, 16, 3, hops=2, dropout=0.0, readout=True)
    dense = adj.to_dense()
    encoding = torch.relu(model.linear(dense @ dense @ x))
    assert torch.allclose(model(x, adj), model.readout(encoding), atol=1e-5)
    assert model.linear.out_features == 16


def test_readout_and_jk_errors_name_the_key_and_the_valid_choices():
    with pytest.raises(ConfigError, match=r"model.readout applies to \['gcn', 'gat', 'sage', 'gin', 'sgc'\]"):
        build_model(ModelConfig(arch="appnp", readout=True), 5, 3)
    with pytest.raises(ConfigError, match=r"model.jk = 'max' \(arch 'gat'\).*\['cat', 'max'\]"):
        build_model(ModelConfig(arch="gat", readout=True, jk="max"), 5, 3)
    with pytest.raises(ConfigError, match="model.jk needs model.readout: true"):
        build_model(ModelConfig(layers=4, jk="max"), 5, 3)
    with pytest.raises(ConfigError, match="model.hops and model.alpha apply to"):
        build_model(ModelConfig(arch="sage", hops=2), 5, 3)


def test_a_gcn_or_sgc_model_does_not_import_pyg():
    code = ("import sys; from fglrepro.config import ModelConfig; from fglrepro.models import build_model; "
            "[build_model(ModelConfig(arch=a, readout=True, layers=4, jk=j), 5, 3) "
            "for a, j in (('gcn', 'max'), ('sgc', None))]; print('torch_geometric' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_the_vectorised_engine_refuses_jumping_knowledge_and_pyg_architectures():
    from fglrepro.fl.method import Capabilities, vectorised_obstacle

    caps = Capabilities(vectorised=True)
    assert vectorised_obstacle(caps, ModelConfig(readout=True)) is None
    assert "model.jk" in vectorised_obstacle(caps, ModelConfig(layers=4, readout=True, jk="max"))
    assert "model.arch 'sage'" in vectorised_obstacle(caps, ModelConfig(arch="sage"))
