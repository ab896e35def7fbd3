"""GHOST: the FGW distance (exact assignment without structure, zero between a graph and its relabelling),
the topology-consistency criterion as the gradient of the edge energy, the retention term, the limit
without retention (plain sequential training on the pseudo graphs), proxies that read the local graph
only through FGW, the server's stages, and the one-shot run with fine-tuning."""

from __future__ import annotations

import copy
import itertools
from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F
from helpers import assert_refused, make_method, method_problems, one_round
from test_renode import NO_DROPOUT

from fglrepro.components.generator import knn_pseudo_graph
from fglrepro.config import ConfigError, EvalConfig, ModelConfig, TrainConfig
from fglrepro.fl.clients import normalized_adjacency
from fglrepro.fl.loop import run_federation
from fglrepro.fl.training import make_optimizer
from fglrepro.methods.ghost import (
    GHOSTHparams,
    ProxyTarget,
    Retention,
    fgw_loss,
    fgw_objective,
    fgw_plan,
    integrate,
    knn_structure,
    labelled_adjacency,
    proxy_generator,
    proxy_loss,
    squared_distances,
    topology_criterion,
    train_proxy,
    unit_rows,
)
from fglrepro.models import GCN, fast_kernels

FAST = {"proxy_epochs": 20, "fgw_iterations": 20}
ADAM = TrainConfig(optimizer="adam", lr=0.01, weight_decay=0.0)


def random_graph(n: int, gen: torch.Generator) -> torch.Tensor:
    """A symmetric binary ``[n, n]`` adjacency without self-loops."""
    upper = (torch.rand(n, n, generator=gen) < 0.4).float().triu(1)
    return upper + upper.t()


def test_fgw_objective_is_the_quadruple_sum():
    gen = torch.Generator().manual_seed(0)
    c1, c2 = random_graph(4, gen), random_graph(4, gen)
    cost, plan = torch.rand(4, 4, generator=gen), torch.rand(4, 4, generator=gen)
    gw = torch.einsum("ijkl,ij,kl->", (c1[:, None, :, None] - c2[None, :, None, :]) ** 2, plan, plan)
    expected = 0.3 * (cost * plan).sum() + 0.7 * gw
    assert fgw_objective(cost, c1, c2, plan, 0.7).item() == pytest.approx(expected.item(), rel=1e-5)
    # c2 = None is the identity
    eye = torch.eye(4)
    assert fgw_objective(cost, c1, None, plan, 0.7).item() == pytest.approx(
        fgw_objective(cost, c1, eye, plan, 0.7).item(), rel=1e-6)


def test_fgw_without_structure_is_the_optimal_assignment():
    gen = torch.Generator().manual_seed(1)
    cost = torch.rand(5, 5, generator=gen)
    plan = fgw_plan(cost, random_graph(5, gen), None, alpha=0.0, iterations=10)
    best = min(sum(cost[i, p[i]].item() for i in range(5)) for p in itertools.permutations(range(5))) / 5
    assert (plan * cost).sum().item() == pytest.approx(best, rel=1e-6)
    assert torch.allclose(plan.sum(0), torch.full((5,), 0.2)) and torch.allclose(plan.sum(1), torch.full((5,), 0.2))


def test_fgw_between_a_graph_and_its_relabelling_is_zero():
    gen = torch.Generator().manual_seed(2)
    c1, x = random_graph(7, gen), torch.randn(7, 3, generator=gen)
    perm = torch.randperm(7, generator=gen)
    c2, x2 = c1[perm][:, perm], x[perm]
    assert fgw_loss(x, x2, c1, c2, alpha=0.5, iterations=50).item() == pytest.approx(0.0, abs=1e-5)
    plan = fgw_plan(squared_distances(x, x2), c1, c2, 0.5, 50)
    assert torch.equal(plan.argmax(1)[perm], torch.arange(7))
    # a different structure on the same features costs something
    assert fgw_loss(x, x2, c1, torch.eye(7), alpha=0.5, iterations=50).item() > 0.01


def test_fgw_gradient_flows_through_the_feature_cost_at_the_optimal_plan():
    gen = torch.Generator().manual_seed(3)
    x, fake = torch.randn(6, 4, generator=gen), torch.randn(6, 4, generator=gen).requires_grad_(True)
    c1 = random_graph(6, gen)
    fgw_loss(x, fake, c1, None, 0.5, 50).backward()
    plan = fgw_plan(squared_distances(x, fake.detach()), c1, None, 0.5, 50)
    # d/dX^ (1 - alpha) sum_ij T_ij ||x_i - x^_j||^2 = 2 (1 - alpha) (T^T 1 * x^ - T^T x)
    expected = 2 * 0.5 * (plan.sum(0, keepdim=True).t() * fake.detach() - plan.t() @ x)
    assert torch.allclose(fake.grad, expected, atol=1e-5)


@pytest.mark.parametrize("fast", [False, True])
def test_topology_criterion_is_the_gradient_of_the_edge_energy(graph, fast):
    x, adj = graph
    torch.manual_seed(0)
    model = GCN(5, 4, 3, layers=2, dropout=0.0)
    with fast_kernels(fast):
        criterion = topology_criterion(model, x, adj)
    # written out edge by edge, as the authors' code loops over edges
    weight = model.convs[0].lin.weight
    hidden = F.relu(model.convs[0](x, adj))
    energy = 0.0
    for i, j in adj.to_dense().nonzero().tolist():
        energy = energy + ((hidden[i] @ weight) @ torch.tanh(hidden[j] @ weight)) ** 2
    names = [name for name, _ in model.named_parameters()]
    criterion = dict(zip(names, criterion))
    first = ["convs.0.lin.weight", "convs.0.bias"]
    grads = torch.autograd.grad(energy, [dict(model.named_parameters())[name] for name in first])
    for name, grad in zip(first, grads):
        assert torch.allclose(criterion[name], grad.abs(), rtol=1e-4, atol=1e-6)
    # the last layer does not enter the energy
    assert criterion["convs.0.lin.weight"].sum() > 0
    assert all(criterion[name].sum() == 0 for name in names if name.startswith("convs.1"))


def test_retention_running_sums_equal_the_sum_over_stages():
    gen = torch.Generator().manual_seed(4)
    shapes = [(3, 2), (2,)]
    stages = [([torch.rand(s, generator=gen) for s in shapes], [torch.randn(s, generator=gen) for s in shapes])
              for _ in range(3)]
    params = [torch.randn(s, generator=gen) for s in shapes]
    retention = Retention(params)
    assert retention.penalty(params).item() == 0.0
    for omega, anchor in stages:
        retention.add(omega, anchor)
    expected = sum((o * (p - a) ** 2).sum() for omega, anchor in stages for o, a, p in zip(omega, anchor, params))
    assert retention.penalty(params).item() == pytest.approx(expected.item(), rel=1e-5)
    one = Retention(params)
    one.add(*stages[0])
    assert one.penalty(stages[0][1]).item() == pytest.approx(0.0, abs=1e-5)


def stage_graphs(count: int, n: int = 20, seed: int = 5) -> list[tuple]:
    """``count`` random pseudo graphs ``(x [n, 6], kNN adj, balanced y)``."""
    gen = torch.Generator().manual_seed(seed)
    graphs = []
    for _ in range(count):
        x = torch.randn(n, 6, generator=gen)
        graphs.append((x, knn_pseudo_graph(x, 5, dense=True), torch.arange(n) % 3))
    return graphs


def test_without_retention_the_server_trains_plainly_on_the_pseudo_graphs():
    torch.manual_seed(0)
    model, graphs = GCN(6, 8, 3, dropout=0.0), stage_graphs(3)
    plain = copy.deepcopy(model)
    integrate(model, make_optimizer(model, ADAM), graphs, GHOSTHparams(lambda_r=0.0, stage_steps=4))
    optimizer = make_optimizer(plain, ADAM)
    for x, adj, y in graphs:
        for _ in range(4):
            optimizer.zero_grad()
            F.cross_entropy(plain(x, adj), y).backward()
            optimizer.step()
    assert all(torch.allclose(p, q, atol=1e-6) for p, q in zip(model.parameters(), plain.parameters()))


def test_retention_holds_the_parameters_the_criterion_marks():
    torch.manual_seed(0)
    start, graphs = GCN(6, 8, 3, dropout=0.0), stage_graphs(2)
    after_first = copy.deepcopy(start)
    integrate(after_first, make_optimizer(after_first, ADAM), graphs[:1], GHOSTHparams(stage_steps=10))
    names = [name for name, _ in start.named_parameters()]
    marked = dict(zip(names, topology_criterion(start, *graphs[0][:2])))["convs.0.lin.weight"] > 0
    drift = {}
    for lambda_r in (0.0, 1e3):
        model = copy.deepcopy(start)
        integrate(model, make_optimizer(model, ADAM), graphs, GHOSTHparams(lambda_r=lambda_r, stage_steps=10))
        moved = model.convs[0].lin.weight - after_first.convs[0].lin.weight
        drift[lambda_r] = moved[marked].abs().mean().item()
    assert drift[1e3] < 0.5 * drift[0.0], drift


def test_proxy_training_aligns_generated_features_with_the_labelled_nodes(sbm):
    method = make_method(sbm, "ghost", FAST, rounds=1, model=NO_DROPOUT)
    client, hp = method.clients[0], GHOSTHparams(**{**FAST, "proxy_epochs": 60})
    target = ProxyTarget.of(client)
    noise = torch.randn(target.x.size(0), hp.noise_dim)
    proxy = proxy_generator(client.num_classes, client.x.size(1), hp, torch.Generator().manual_seed(0), client.x.device)
    untrained = copy.deepcopy(proxy).eval()
    train_proxy(proxy, client, hp, make_optimizer(proxy, replace(ADAM, lr=hp.proxy_lr)), torch.Generator())
    proxy.eval()
    with torch.no_grad():
        before, after = (proxy_loss(g, target, hp, noise).item() for g in (untrained, proxy))
    assert after < 0.7 * before, (before, after)


def test_proxy_feature_terms_are_the_kl_and_the_cosine_dispersion(sbm):
    client = make_method(sbm, "ghost", FAST, rounds=1, model=NO_DROPOUT).clients[0]
    target, hp = ProxyTarget.of(client), GHOSTHparams(lambda_d=1.0, lambda_f=0.0, proxy_dropout=0.0)
    proxy = proxy_generator(client.num_classes, client.x.size(1), hp, torch.Generator().manual_seed(0), client.x.device)
    noise = torch.randn(target.x.size(0), hp.noise_dim)
    fake = proxy(noise, target.y)
    x = client.x[client.train_mask]
    expected = F.kl_div(F.log_softmax(fake, 1), F.softmax(x, 1), reduction="batchmean")
    expected = expected + 1 - F.cosine_similarity(fake, x, dim=-1).mean()
    assert proxy_loss(proxy, target, hp, noise).item() == pytest.approx(expected.item(), rel=1e-5)
    assert torch.equal(target.c1, labelled_adjacency(client)) and target.c1.size(0) == x.size(0)


def test_unit_rows_give_the_cosine_similarity_bit_for_bit():
    gen = torch.Generator().manual_seed(2)
    a = torch.randn(9, 40, generator=gen, requires_grad=True)
    b = torch.rand(9, 40, generator=gen) * (torch.rand(9, 40, generator=gen) < 0.2)
    reference = F.cosine_similarity(a, b, dim=-1)
    ours = (unit_rows(a) * unit_rows(b)).sum(dim=-1)
    assert torch.equal(ours, reference)
    assert torch.equal(*(torch.autograd.grad(c.square().sum(), a)[0] for c in (ours, reference)))


def test_the_local_graph_enters_the_proxy_only_through_fgw(sbm):
    method = make_method(sbm, "ghost", FAST, rounds=1, model=NO_DROPOUT)
    client = method.clients[0]
    edgeless = replace(client, edge_index=client.edge_index[:, :0])

    def trained(c, lambda_f: float) -> list[torch.Tensor]:
        hp = GHOSTHparams(**{**FAST, "lambda_f": lambda_f, "proxy_dropout": 0.0})
        proxy = proxy_generator(c.num_classes, c.x.size(1), hp, torch.Generator().manual_seed(0), c.x.device)
        optimizer = make_optimizer(proxy, replace(ADAM, lr=hp.proxy_lr))
        train_proxy(proxy, c, hp, optimizer, torch.Generator().manual_seed(1))
        return [p.detach() for p in proxy.parameters()]

    assert all(torch.equal(p, q) for p, q in zip(trained(client, 0.0), trained(edgeless, 0.0)))
    assert not all(torch.equal(p, q) for p, q in zip(trained(client, 1.0), trained(edgeless, 1.0)))


def test_knn_structure_is_binary_symmetric_with_self_loops():
    x = torch.randn(9, 4, generator=torch.Generator().manual_seed(6))
    adj = knn_structure(x, 3)
    assert torch.equal(adj, adj.t()) and torch.all(adj.diagonal() == 1)
    assert set(adj.unique().tolist()) <= {0.0, 1.0} and torch.all(adj.sum(1) >= 3)


def test_server_trains_through_every_proxy_in_stages_sized_as_its_client(sbm):
    method = make_method(sbm, "ghost", {**FAST, "proxy_structure": "knn"}, rounds=1, model=NO_DROPOUT)
    uploads = one_round(method, 1)
    assert sorted(method.order) == sorted(uploads) == [0, 1, 2]
    graphs = list(method.stage_graphs(uploads))
    sizes = [x.size(0) for x, _, _ in graphs]
    assert sizes == [method.clients[k].num_nodes for k in method.order for _ in range(3)]
    assert all(torch.bincount(y).max() - torch.bincount(y).min() <= y.numel() % 4 for _, _, y in graphs)
    assert all(state.received is method.global_model for state in method.states)
    with torch.no_grad():
        losses = [sum(F.cross_entropy(m(x, adj), y).item() for x, adj, y in graphs)
                  for m in (method.federation.model, method.global_model)]
    assert losses[1] < 0.8 * losses[0]
    # the upload is the proxy generator, not a GNN
    assert not uploads[0].params and any("label_embedding" in name for name in uploads[0].extras)


def test_one_shot_run_with_fine_tuning(sbm):
    method = make_method(sbm, "finetune", {"base": "ghost", "base_hparams": FAST, "epochs": 20},
                         rounds=1, model=NO_DROPOUT, evaluation=EvalConfig(model="global"))
    history = run_federation(method, 1, EvalConfig(model="global"))
    assert history.final["weighted"]["test_acc"] > 0.4


def test_ghost_is_one_shot_and_needs_a_first_layer_weight():
    assert_refused(method_problems("ghost", FAST, rounds=2), "one-shot")
    assert_refused(method_problems("ghost", FAST, rounds=1, model=ModelConfig(arch="sage", hidden=16)),
                   "model.arch must be one of")
    with pytest.raises(ConfigError, match="proxy_structure"):
        method_problems("ghost", {"proxy_structure": "dense"}, rounds=1)


def test_normalised_adjacency_edges_are_what_the_criterion_reads(graph):
    """The criterion reads a sparse operator's edges as a dense one's (self-loops included)."""
    x, adj = graph
    torch.manual_seed(0)
    model = GCN(5, 4, 3, dropout=0.0)
    dense = normalized_adjacency(adj.to_dense().nonzero().t(), 12).to_dense()
    assert all(torch.allclose(a, b) for a, b in zip(topology_criterion(model, x, adj),
                                                    topology_criterion(model, x, dense)))
