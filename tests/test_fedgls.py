"""FedGLS and its graphless-client baselines: the properties of METHOD_NOTES section 3."""

from __future__ import annotations

import copy
import math

import pytest
import torch
import torch.nn.functional as F
from conftest import make_sbm
from helpers import assert_refused, make_method, method_problems, one_round, same_parameters

from fglrepro.components.graph_learning import (
    cosine_knn_adjacency,
    graphless_contrastive_loss,
    knn_similarity,
    symmetric_normalized,
)
from fglrepro.config import ConfigError, EvalConfig, ModelConfig
from fglrepro.fl.loop import run_federation
from fglrepro.fl.training import cross_entropy_loss
from fglrepro.methods.fedgls import ENCODER, distillation_loss
from fglrepro.partition.build import PartitionSpec, build_partition

MODEL = ModelConfig(hidden=16, readout=True)
GLOBAL = EvalConfig(model="global", average="unweighted")
HALF = PartitionSpec("metis", "stratified", 0.4, 0.3, graphless_ratio=0.5)
K = 5


@pytest.fixture
def bow():
    """A small graph with binary (bag-of-words-like) features, as Cora's and CiteSeer's."""
    data = make_sbm(num_features=16)
    data.x = (data.x > 0.8).float()
    return data


def fedgls(data, hparams=None, **kwargs):
    return make_method(data, "fedgls", {"k": K, **(hparams or {})}, model=MODEL, evaluation=GLOBAL,
                       num_clients=4, partition=HALF, **kwargs)


def test_knn_graph_is_sparse_non_negative_symmetric_and_normalised():
    x = torch.randn(20, 6, generator=torch.Generator().manual_seed(0))
    sparse = knn_similarity(x, 3)
    assert ((sparse > 0).sum(dim=1) <= 4).all() and (sparse >= 0).all()
    unit = F.normalize(x, dim=1)
    kept = sparse > 0
    assert torch.allclose(sparse[kept], (unit @ unit.t())[kept])
    assert torch.all(sparse.diagonal() > 0)  # every node keeps itself
    adj = cosine_knn_adjacency(x, 3)
    assert torch.allclose(adj, adj.t()) and (adj >= 0).all()
    symmetric = (sparse + sparse.t()) / 2
    degree = symmetric.sum(1)
    assert torch.allclose(adj, symmetric / torch.sqrt(degree[:, None] * degree[None, :]))
    assert torch.equal(symmetric_normalized(torch.zeros(3, 3)), torch.zeros(3, 3))


def test_contrastive_loss_equals_a_direct_loop():
    gen = torch.Generator().manual_seed(0)
    z, h, tau = torch.randn(7, 4, generator=gen), torch.randn(7, 4, generator=gen), 0.2

    def sim(a, b):
        return float(a @ b / (a.norm() * b.norm()))

    terms = []
    for i in range(7):
        denominator = sum(math.exp(sim(z[i], h[j]) / tau) + math.exp(sim(z[i], z[j]) / tau) for j in range(7) if j != i)
        terms.append(-math.log(math.exp(sim(z[i], h[i]) / tau) / denominator))
    assert graphless_contrastive_loss(z, h, tau).item() == pytest.approx(sum(terms) / 7, rel=1e-5)
    # one-directional: swapping the views changes the loss
    assert graphless_contrastive_loss(h, z, tau).item() != pytest.approx(sum(terms) / 7, rel=1e-3)


def test_the_learned_graph_starts_as_the_knn_graph_of_fed_gnnk(bow):
    method = fedgls(bow)
    knn = make_method(bow, "knn_graph", {"base": "fedavg", "k": K}, model=MODEL, evaluation=GLOBAL,
                      num_clients=4, partition=HALF)
    graphless = [k for k, c in enumerate(method.clients) if c.graphless]
    assert len(graphless) == 2
    for k in graphless:
        assert torch.equal(method.clients[k].adj, knn.clients[k].adj)
        assert torch.equal(knn.clients[k].adj, cosine_knn_adjacency(knn.clients[k].x, K))
    for k in set(range(4)) - set(graphless):  # clients with edges keep their graphs
        assert method.clients[k].adj.layout == torch.sparse_csr
        assert torch.equal(method.clients[k].adj.to_dense(), knn.clients[k].adj.to_dense())


@pytest.mark.parametrize("engine", ["sequential", "auto"])
def test_graphless_clients_never_hold_true_edges(bow, engine):
    method = fedgls(bow, engine=engine)
    one_round(method, 1)
    knn = make_method(bow, "knn_graph", {"base": "local", "k": K}, model=MODEL, num_clients=4, partition=HALF)
    for m in (method, knn):
        for k, client in enumerate(m.clients):
            if client.graphless:
                assert client.edge_index.numel() == 0
                learned = m.states[k].modules.get("learner")
                expected = learned(client.x) if learned is not None else cosine_knn_adjacency(client.x, K)
                assert torch.allclose(client.adj, expected.detach())  # a function of the features only


def test_one_contrastive_step_moves_only_the_graph_learner(bow):
    method = fedgls(bow)
    k = next(k for k, c in enumerate(method.clients) if c.graphless)
    state = method.states[k]
    method.receive(k, 1)
    before = copy.deepcopy(state)
    method.learner_step(k)
    assert same_parameters(state.model, before.model) and same_parameters(state.modules["encoder"],
                                                                          before.modules["encoder"])
    assert all(p.grad is None for m in (state.model, state.modules["encoder"]) for p in m.parameters())
    assert not same_parameters(state.modules["learner"], before.modules["learner"])
    assert method.learner_optimizers[k].state[0][0] == 1  # parameter 0's Adam step count


def test_cross_entropy_reaches_only_the_gnn_and_distillation_only_the_encoder(bow):
    method = fedgls(bow)
    k = next(k for k, c in enumerate(method.clients) if c.graphless)
    method.client_update(k, 1)
    state, client = method.states[k], method.clients[k]
    modules = {"theta": state.model, "phi": state.modules["encoder"], "omega": state.modules["learner"]}
    for module in modules.values():
        module.zero_grad(set_to_none=True)
    cross_entropy_loss(state.model, client).backward()
    assert all(p.grad is not None for p in modules["theta"].parameters())
    assert all(p.grad is None for name in ("phi", "omega") for p in modules[name].parameters())
    for module in modules.values():
        module.zero_grad(set_to_none=True)
    distillation_loss(state.model, state.modules["encoder"], client.x, client.adj).backward()
    assert all(p.grad is not None for p in modules["phi"].parameters())
    assert all(p.grad is None for name in ("theta", "omega") for p in modules[name].parameters())


def test_distillation_loss_is_the_sum_over_nodes_of_the_kl_to_the_detached_teacher(bow):
    method = fedgls(bow)
    state, client = method.states[0], method.clients[0]
    model, encoder = state.model.eval(), state.modules["encoder"].eval()
    with torch.no_grad():
        teacher = F.softmax(model(client.x, client.adj), dim=1)
        student = F.softmax(model.readout(encoder(client.x)), dim=1)
    expected = sum(float((p * (p.log() - q.log())).sum()) for p, q in zip(teacher, student))
    loss = distillation_loss(model, encoder, client.x, client.adj)
    assert loss.item() == pytest.approx(expected, rel=1e-4)


def test_theta_and_phi_are_averaged_and_omega_is_never_uploaded(bow):
    method = fedgls(bow)
    uploads = one_round(method, 1)
    learner = {n for k, s in enumerate(method.states) if "learner" in s.modules
               for n, _ in s.modules["learner"].named_parameters()}
    for k, upload in uploads.items():
        theta = dict(method.states[k].model.named_parameters())
        phi = dict(method.states[k].modules["encoder"].named_parameters())
        assert set(upload.params) == set(theta) | {ENCODER + n for n in phi}
        assert not learner & {n.removeprefix(ENCODER) for n in upload.params}
        assert upload.num_bytes == sum(p.numel() * 4 for p in [*theta.values(), *phi.values()])
    weights = torch.tensor([u.weight for u in uploads.values()]) / sum(u.weight for u in uploads.values())
    for name, p in method.global_encoder.named_parameters():
        expected = sum(w * u.params[ENCODER + name] for w, u in zip(weights, uploads.values()))
        assert torch.allclose(p, expected, atol=1e-6)
    for name, p in method.global_model.named_parameters():
        expected = sum(w * u.params[name] for w, u in zip(weights, uploads.values()))
        assert torch.allclose(p, expected, atol=1e-6)


def test_fedgls_runs_and_records_the_training_loss_per_round(bow):
    method = fedgls(bow)
    history = run_federation(method, 3, GLOBAL)
    assert all(math.isfinite(r["train_loss"]) for r in history.rounds)
    assert all(opt.state[0][0] == 3 for opt in method.learner_optimizers.values())
    learned = [c.adj for c in method.clients if c.graphless]
    assert all(not torch.equal(adj, cosine_knn_adjacency(c.x, K)) for adj, c in zip(
        learned, [c for c in method.clients if c.graphless]))


def test_fedgls_needs_a_readout():
    assert method_problems("fedgls", model=MODEL) == []
    assert_refused(method_problems("fedgls", model=ModelConfig(hidden=16)), "fedgls needs model.readout: true")
    with pytest.raises(ConfigError, match="k >= 1"):
        method_problems("fedgls", {"k": 0}, model=MODEL)


def test_fed_mlp_equals_fedavg_of_a_gcn_on_clients_without_edges(bow):
    spec = PartitionSpec("metis", "stratified", 0.4, 0.3, graphless_ratio=1.0)
    gcn = make_method(bow, "fedavg", model=MODEL, num_clients=4, partition=spec)
    mlp = make_method(bow, "fedavg", model=ModelConfig(arch="mlp", hidden=16, readout=True), num_clients=4,
                      partition=spec)
    def as_mlp(model):
        return {name.replace("convs.", "lins.").replace("lin.weight", "weight"): p
                for name, p in model.named_parameters()}

    for model in [mlp.global_model, *(s.model for s in mlp.states)]:
        model.load_state_dict(as_mlp(gcn.global_model))
    torch.manual_seed(0)
    gcn_history = run_federation(gcn, 3, GLOBAL)
    torch.manual_seed(0)
    mlp_history = run_federation(mlp, 3, GLOBAL)
    assert [r["train_loss"] for r in mlp_history.rounds] == pytest.approx(
        [r["train_loss"] for r in gcn_history.rounds], rel=1e-5)
    trained = as_mlp(gcn.global_model)
    for name, p in mlp.global_model.named_parameters():
        assert torch.allclose(p, trained[name], atol=1e-5), name


def test_fed_gnnmlp_averages_each_architecture_separately(bow):
    model = ModelConfig(hidden=16, readout=True, graphless={"arch": "mlp"})
    method = make_method(bow, "fedavg_by_arch", model=model, evaluation=GLOBAL, num_clients=4, partition=HALF)
    uploads = one_round(method, 1)
    assert len(method.global_models) == 2
    for key, ks in method.groups.items():
        kinds = {type(method.states[k].model).__name__ for k in ks}
        assert kinds == ({"MLP"} if method.clients[ks[0]].graphless else {"GCN"})
        assert {method.clients[k].graphless for k in ks} == {method.clients[ks[0]].graphless}
        total = sum(uploads[k].weight for k in ks)
        for name, p in method.global_models[key].named_parameters():
            expected = sum(uploads[k].weight / total * uploads[k].params[name] for k in ks)
            assert torch.allclose(p, expected, atol=1e-6)
        assert all(method.states[k].received is method.global_models[key] for k in ks)


def test_fedavg_by_arch_with_one_architecture_is_fedavg(bow):
    avg = run_federation(make_method(bow, "fedavg", model=MODEL, partition=HALF, num_clients=4), 3, GLOBAL)
    grouped = run_federation(make_method(bow, "fedavg_by_arch", model=MODEL, partition=HALF, num_clients=4), 3,
                             GLOBAL)
    assert [r["unweighted"] for r in avg.rounds] == [r["unweighted"] for r in grouped.rounds]
    assert [r["train_loss"] for r in avg.rounds] == [r["train_loss"] for r in grouped.rounds]


def test_without_graphless_clients_no_ratio_changes_the_clients_or_their_splits(bow):
    for seed in (0, 1):
        spec = PartitionSpec("louvain_communities", "random", 0.6, 0.2)
        none = build_partition(bow, spec, 4, seed)
        for ratio in (0.5, 1.0):
            some = build_partition(bow, PartitionSpec("louvain_communities", "random", 0.6, 0.2,
                                                      graphless_ratio=ratio), 4, seed)
            assert int(some.graphless.sum()) == round(ratio * 4) and int(none.graphless.sum()) == 0
            for field in ("client_nodes", "train_mask", "val_mask", "test_mask"):
                assert all(torch.equal(a, b) for a, b in zip(getattr(none, field), getattr(some, field))), field


def test_knn_graph_keeps_the_capabilities_of_its_base_off_the_engine():
    from fglrepro.methods import resolve_method

    local = resolve_method("knn_graph", {"base": "local"}).capabilities
    assert not local.global_model and local.heterogeneous and not local.vectorised
    assert resolve_method("knn_graph", {"base": "fedavg"}).capabilities.global_model
    assert_refused(method_problems("knn_graph", {"base": "local"}, model=MODEL), "has no global model")
