"""The model zoo (GCN, SGC, S²GC, APPNP) and heterogeneous client models."""

from __future__ import annotations

import re

import pytest
import torch
from helpers import assert_refused, make_method, method_problems

from fglrepro.config import ConfigError, EvalConfig, ModelConfig, from_dict
from fglrepro.fl.clients import normalized_adjacency
from fglrepro.fl.loop import run_federation
from fglrepro.methods import heterogeneous_methods, resolve_method
from fglrepro.models import GCN, SGC, SSGC, APPNPNet, GCNLayer, build_model

#: The ten architectures of O-pFGL's heterogeneous setting (Appendix C), one per client.
OPFGL_ZOO = [
    {"arch": "gcn", "hidden": 64}, {"arch": "gcn", "hidden": 128}, {"arch": "gcn", "hidden": 256},
    {"arch": "gcn", "hidden": 512}, {"arch": "gcn", "layers": 3, "hidden": 64},
    {"arch": "gcn", "layers": 3, "hidden": 512}, {"arch": "appnp"}, {"arch": "ssgc"},
    {"arch": "sgc", "hops": 2}, {"arch": "sgc", "hops": 4},
]


def test_sgc_is_a_linear_model_on_k_hop_features(graph):
    x, adj = graph
    model = SGC(5, 16, 3, hops=3)
    dense = adj.to_dense()
    expected = model.linear(dense @ dense @ dense @ x)
    assert torch.allclose(model(x, adj), expected, atol=1e-5)


def test_ssgc_averages_the_hops_with_a_share_of_the_input(graph):
    x, adj = graph
    model = SSGC(5, 16, 3, hops=2, alpha=0.25)
    dense = adj.to_dense()
    smoothed = 0.25 * x + 0.75 * (dense @ x + dense @ dense @ x) / 2
    assert torch.allclose(model(x, adj), model.linear(smoothed), atol=1e-5)
    only_input = SSGC(5, 16, 3, hops=4, alpha=1.0)
    assert torch.allclose(only_input(x, adj), only_input.linear(x), atol=1e-6)


def test_appnp_without_teleport_decay_is_its_mlp(graph):
    x, adj = graph
    model = APPNPNet(5, 8, 3, hops=10, alpha=1.0, dropout=0.0).eval()
    mlp = model.lin2(torch.relu(model.lin1(x)))
    assert torch.allclose(model(x, adj), mlp, atol=1e-5)
    model = APPNPNet(5, 8, 3, hops=1, alpha=0.1, dropout=0.0).eval()
    mlp = model.lin2(torch.relu(model.lin1(x)))
    assert torch.allclose(model(x, adj), 0.9 * adj.to_dense() @ mlp + 0.1 * mlp, atol=1e-5)


@pytest.mark.parametrize("spec", OPFGL_ZOO)
def test_every_zoo_model_maps_features_to_logits_and_trains(graph, spec):
    x, adj = graph
    model = build_model(from_dict(ModelConfig, spec, "model"), 5, 3)
    hidden, logits = model(x, adj, return_hidden=True)
    assert logits.shape == (12, 3) and hidden.size(0) == 12
    logits.sum().backward()
    assert all(p.grad is not None for p in model.parameters())


def test_bad_model_keys_name_the_valid_choices():
    with pytest.raises(ConfigError, match="valid architectures"):
        build_model(ModelConfig(arch="gatv9"), 5, 3)
    with pytest.raises(ConfigError, match="model.hops"):
        build_model(ModelConfig(arch="gcn", hops=3), 5, 3)
    with pytest.raises(ConfigError, match=r"unknown key\(s\) \['width'\] in model.clients\[1\]"):
        ModelConfig(clients=[{"hidden": 8}, {"width": 8}]).for_client(3)


def test_clients_cycle_through_the_zoo():
    config = ModelConfig(dropout=0.0, clients=OPFGL_ZOO)
    assert config.for_client(3).hidden == 512 and config.for_client(3).dropout == 0.0
    assert config.for_client(13) == config.for_client(3)
    assert ModelConfig().for_client(5) == ModelConfig()


def test_parameter_averaging_refuses_heterogeneous_clients_and_lists_the_methods_that_accept_them(sbm):
    zoo = ModelConfig(hidden=16, clients=OPFGL_ZOO[:3])
    accepting = heterogeneous_methods()
    assert {"coboost", "dense", "fedgkc", "fedproto", "local", "opfgl"} <= set(accepting) and "fedavg" not in accepting
    problems = method_problems("fedavg", model=zoo)
    assert_refused(problems, r"method 'fedavg' needs the same architecture on every client; remove model.clients")
    assert_refused(method_problems("fedavg", model=ModelConfig(hidden=16, graphless={"arch": "mlp"})),
                   r"method 'fedavg' needs the same architecture on every client; remove model.clients and "
                   r"model.graphless")
    assert_refused(problems, re.escape(str(accepting)))
    with pytest.raises(ConfigError, match=r"'fedavg' needs the same architecture.*" + re.escape(str(accepting))):
        make_method(sbm, "fedavg", model=zoo)
    for wrapper, base in (("finetune", "fedprox"), ("fedtad", "fedavg")):
        assert_refused(method_problems(wrapper, {"base": base}, model=zoo), f"'{wrapper}' needs the same architecture")
        with pytest.raises(ConfigError, match="same architecture"):
            make_method(sbm, wrapper, {"base": base}, model=zoo)
    # a wrapper accepts different architectures when its base does
    for wrapper, base in (("finetune", "local"), ("finetune", "dense")):
        assert resolve_method(wrapper, {"base": base}).capabilities.heterogeneous
        assert method_problems(wrapper, {"base": base}, model=zoo) == []


@pytest.mark.parametrize("name, hparams", [
    ("local", {}), ("dense", {"student": "personal", "distill_epochs": 2}),
    ("coboost", {"student": "personal", "distill_epochs": 2}),
    ("fedtad", {"base": "dense", "base_hparams": {"student": "personal", "distill_epochs": 0}, "distill_epochs": 2}),
    ("opfgl", {"surrogate_iterations": 20, "stage1_steps": 20, "finetune_steps": 20, "eval_every": 10}),
])
def test_heterogeneous_methods_give_every_client_its_own_architecture(sbm, name, hparams):
    zoo = ModelConfig(hidden=16, clients=[{"arch": "sgc"}, {"arch": "gcn", "hidden": 8}, {"arch": "appnp"}])
    stage = "local" if name == "local" else "global"
    evaluation = EvalConfig(model=stage)
    method = make_method(sbm, name, hparams, rounds=1, model=zoo, evaluation=evaluation)
    history = run_federation(method, 1, evaluation)
    assert len(history.rounds) == 1
    assert [type(method.eval_model(k, stage)).__name__ for k in range(3)] == ["SGC", "GCN", "APPNPNet"]
    assert [type(state.model).__name__ for state in method.states] == ["SGC", "GCN", "APPNPNet"]


def small_graph(num_nodes: int = 10, seed: int = 0) -> torch.Tensor:
    """A random undirected ``edge_index`` on ``num_nodes`` nodes with one self-loop and one
    isolated node (the last)."""
    gen = torch.Generator().manual_seed(seed)
    edges = torch.randint(0, num_nodes - 1, (2, 2 * num_nodes), generator=gen)
    edges = torch.cat([edges, edges.flip(0)], dim=1)
    edges = edges[:, edges[0] != edges[1]]
    edges = torch.cat([edges, torch.tensor([[2], [2]])], dim=1)
    return edges.unique(dim=1)


def test_normalized_adjacency_has_the_values_of_pyg_gcn_norm():
    from torch_geometric.nn.conv.gcn_conv import gcn_norm

    edge_index = small_graph()
    ours = normalized_adjacency(edge_index, 10)
    pyg_index, pyg_weight = gcn_norm(edge_index, None, 10, add_self_loops=True)
    pyg = torch.sparse_coo_tensor(pyg_index, pyg_weight, (10, 10)).coalesce().to_sparse_csr()
    assert ours.layout == torch.sparse_csr
    assert torch.equal(ours.crow_indices(), pyg.crow_indices())
    assert torch.equal(ours.col_indices(), pyg.col_indices())
    assert torch.equal(ours.values(), pyg.values())
    assert float(ours.to_dense()[9, 9]) == 1.0  # the isolated node keeps its self-loop


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_gcn_layer_is_pyg_gcnconv_on_the_normalized_adjacency(seed):
    from torch_geometric.nn import GCNConv

    num_features, hidden = 7, 5
    torch.manual_seed(seed)
    ours = GCNLayer(num_features, hidden)
    after_ours = torch.rand(3)
    torch.manual_seed(seed)
    pyg = GCNConv(num_features, hidden, normalize=False)
    after_pyg = torch.rand(3)
    assert torch.equal(after_ours, after_pyg)  # the same random numbers were drawn
    ours_params, pyg_params = dict(ours.named_parameters()), dict(pyg.named_parameters())
    assert ours_params.keys() == pyg_params.keys() == {"lin.weight", "bias"}
    assert all(torch.equal(ours_params[n], pyg_params[n]) for n in ours_params)

    adj = normalized_adjacency(small_graph(seed=seed), 10)
    x = torch.randn(10, num_features, generator=torch.Generator().manual_seed(seed))
    x_ours, x_pyg = x.clone().requires_grad_(True), x.clone().requires_grad_(True)
    out_ours, out_pyg = ours(x_ours, adj), pyg(x_pyg, adj)
    assert torch.equal(out_ours, out_pyg)
    upstream = torch.randn(10, hidden, generator=torch.Generator().manual_seed(seed + 1))
    out_ours.backward(upstream)
    out_pyg.backward(upstream)
    assert torch.equal(x_ours.grad, x_pyg.grad)
    for name, param in ours_params.items():
        assert torch.equal(param.grad, pyg_params[name].grad), name


def test_gcn_is_built_from_gcn_layers_with_pyg_parameter_names():
    model = GCN(5, 8, 3, layers=2)
    assert all(isinstance(conv, GCNLayer) for conv in model.convs)
    assert sorted(n for n, _ in model.named_parameters()) == [
        "convs.0.bias", "convs.0.lin.weight", "convs.1.bias", "convs.1.lin.weight",
    ]
