"""FedTAD: reliability ϕ, random-walk embeddings, pseudo graph, and its reduction to FedAvg."""

from __future__ import annotations

import math

import pytest
import torch
from helpers import (
    all_clients,
    assert_refused,
    hand_client,
    make_method,
    method_problems,
    same_parameters,
)
from torch_geometric.data import Data
from torch_geometric.transforms import AddRandomWalkPE
from torch_geometric.utils import add_self_loops, erdos_renyi_graph, to_dense_adj

from fglrepro.components.generator import balanced_labels, knn_pseudo_graph
from fglrepro.components.topology import return_probabilities
from fglrepro.config import ConfigError, EvalConfig
from fglrepro.fl.clients import ClientData
from fglrepro.fl.loop import run_federation
from fglrepro.methods import resolve_method
from fglrepro.methods.fedtad import RELIABILITY, class_reliability, per_node_weights
from fglrepro.partition.build import PartitionSpec, build_partition


def path_client() -> ClientData:
    """Path 0-1-2 plus an isolated node 3; nodes 0, 1 and 3 labelled."""
    x = torch.tensor([[1.0, 0.0], [1.0, 1.0], [0.0, 1.0], [1.0, 0.0]])
    return hand_client(x, [0, 1, 1, 0], [[0, 1, 1, 2], [1, 0, 2, 1]], [True, True, False, True])


def test_return_probabilities_match_dense_powers_and_pyg():
    edge_index = erdos_renyi_graph(40, 0.1)
    got = return_probabilities(edge_index, 40, walk_length=5, block_size=7)
    adj = to_dense_adj(edge_index, max_num_nodes=40)[0] + torch.eye(40)
    transition = adj / adj.sum(dim=0, keepdim=True)
    power, expected = torch.eye(40), []
    for _ in range(5):
        power = power @ transition
        expected.append(power.diagonal())
    assert torch.allclose(got, torch.stack(expected, dim=1), atol=1e-6)
    pyg = AddRandomWalkPE(5)(Data(edge_index=add_self_loops(edge_index)[0], num_nodes=40)).random_walk_pe
    assert torch.allclose(got, pyg, atol=1e-6)


def test_class_reliability_equals_hand_computation():
    client = path_client()
    # T = (A + I) D^-1 on the path with self-loops: degrees 2, 3, 2; isolated node: 1.
    t1 = [1 / 2, 1 / 3, 1 / 2, 1.0]
    t2 = [1 / 4 + 1 / 6, 1 / 9 + 1 / 6 + 1 / 6, 1 / 6 + 1 / 4, 1.0]
    h = [torch.tensor([*client.x[i].tolist(), t1[i], t2[i]]) for i in range(4)]

    def cos(i, j):
        return float(torch.nn.functional.cosine_similarity(h[i], h[j], dim=0))

    node0 = (1 + cos(0, 1)) / 2
    node1 = (1 + cos(1, 0) + cos(1, 2)) / 3
    node3 = 1.0  # isolated: only itself
    got = class_reliability(client, return_probabilities(client.edge_index, client.num_nodes, 2))
    assert got.tolist() == pytest.approx([node0 + node3, node1], rel=1e-5)


def test_reliability_weights_normalise_per_class_over_clients():
    reliability = torch.tensor([[1.0, 0.0, 3.0], [3.0, 0.0, 1.0]])
    labels = balanced_labels(7, 3)
    weights = per_node_weights(reliability, labels)
    per_class = torch.stack([weights[:, labels == c].sum(dim=1) for c in range(3)], dim=1)
    assert torch.allclose(per_class, torch.tensor([[0.25, 0.0, 0.75], [0.75, 0.0, 0.25]]))


def test_pseudo_graph_is_symmetric_with_self_loops_and_k_nearest_neighbours():
    x = torch.randn(30, 6, generator=torch.Generator().manual_seed(0))
    adj = knn_pseudo_graph(x, k=4).to_dense()
    assert torch.equal(adj > 0, (adj > 0).t())
    assert bool((adj.diagonal() > 0).all())
    unit = torch.nn.functional.normalize(x, dim=1)
    nearest = (unit @ unit.t()).topk(4, dim=1).indices
    assert bool((adj.gather(1, nearest) > 0).all())
    assert int((adj > 0).sum(dim=1).min()) >= 4


def test_fedtad_without_distillation_equals_fedavg_bit_for_bit(sbm):
    evaluation = EvalConfig()
    fedavg = run_federation(make_method(sbm, "fedavg"), 3, evaluation)
    fedtad = run_federation(make_method(sbm, "fedtad", {"distill_epochs": 0}), 3, evaluation)
    assert [r["weighted"] for r in fedavg.rounds] == [r["weighted"] for r in fedtad.rounds]


def test_fedtad_plugs_in_after_another_method(sbm):
    evaluation = EvalConfig()
    fedprox = run_federation(make_method(sbm, "fedprox", {"mu": 0.5}), 2, evaluation)
    plugged = make_method(sbm, "fedtad", {"distill_epochs": 0, "base": "fedprox", "base_hparams": {"mu": 0.5}})
    plugged_rounds = run_federation(plugged, 2, evaluation).rounds
    assert [r["weighted"] for r in fedprox.rounds] == [r["weighted"] for r in plugged_rounds]
    assert_refused(method_problems("fedtad", {"base": "local"}), "'local' has no server-side model")
    with pytest.raises(ConfigError, match="'local' has no server-side model"):
        _ = resolve_method("fedtad", {"base": "local"}).capabilities
    with pytest.raises(ConfigError, match="'local' has no server-side model"):
        make_method(sbm, "fedtad", {"base": "local"})
    with pytest.raises(ConfigError, match=r"unknown key\(s\) \['nu'\].*fedprox"):
        resolve_method("fedtad", {"base": "fedprox", "base_hparams": {"nu": 1.0}})


def test_fedtad_refuses_a_fine_tuned_base_without_server_models():
    # finetune gives `local` a model to test at the global stage, but no server-side model
    around_local = {"base": "finetune", "base_hparams": {"base": "local"}}
    assert_refused(method_problems("fedtad", around_local), "'finetune' has no server-side model")
    with pytest.raises(ConfigError, match="'finetune' has no server-side model"):
        _ = resolve_method("fedtad", around_local).capabilities
    assert method_problems("fedtad", {"base": "finetune", "base_hparams": {"base": "fedavg"}}) == []


def test_reliability_is_uploaded_once_per_client(sbm):
    method = make_method(sbm, "fedtad", {"distill_epochs": 1, "distill_steps": 1})
    history = run_federation(method, 2, EvalConfig())
    num_classes = method.clients[0].num_classes
    first, second = history.rounds[0]["upload_bytes"], history.rounds[1]["upload_bytes"]
    assert [a - b for a, b in zip(first, second)] == [4 * num_classes] * len(method.clients)
    assert set(method.server_reliability) == set(range(len(method.clients)))
    assert all(RELIABILITY not in u.extras for u in all_clients(method, 3).values())


def test_reliability_variants(sbm):
    labelled = make_method(sbm, "fedtad", {"reliability": "labelled"})
    client = labelled.clients[0]
    counts = torch.bincount(client.y[client.train_mask], minlength=client.num_classes).float()
    assert torch.equal(labelled.reliability[0], counts)
    equal = make_method(sbm, "fedtad", {"reliability": "equal"})
    assert all(bool((phi == 1).all()) for phi in equal.reliability)
    noisy = [make_method(sbm, "fedtad", {"reliability_noise": 0.1}).reliability for _ in range(2)]
    clean = make_method(sbm, "fedtad").reliability
    assert all(torch.equal(a, b) for a, b in zip(*noisy))
    assert not all(torch.equal(a, b) for a, b in zip(noisy[0], clean))
    assert all(bool((phi >= 0).all()) for phi in noisy[0])


def test_distillation_on_the_real_graph_pulls_the_global_model_to_the_teachers(sbm):
    method = make_method(sbm, "fedtad", {
        "pseudo_graph": "real", "reliability": "equal", "distill_epochs": 4, "lr_distill": 0.05,
    })
    uploads = all_clients(method, 1)
    assert all(RELIABILITY in u.extras for u in uploads.values())
    method.base.server_update(1, {k: u for k, u in uploads.items()})

    def gap():
        teachers = [method.teacher_model(k, u).eval() for k, u in uploads.items()]
        with torch.no_grad():
            method.base.global_model.eval()
            student = method.base.global_model(method.real_x, method.real_adj)
            return float(sum((student - t(method.real_x, method.real_adj)).abs().mean() for t in teachers))

    before = gap()
    method.server_update(1, uploads)
    assert gap() < before
    assert math.isfinite(gap())


def _real_graph_distillation(data, partition):
    """The global model after one FedTAD-r-eq round (local updates, then distillation)."""
    method = make_method(data, "fedtad", {
        "pseudo_graph": "real", "reliability": "equal", "distill_epochs": 2, "lr_distill": 0.05,
    }, partition=partition)
    method.server_update(1, all_clients(method, 1))
    return method.base.global_model


def test_real_graph_distillation_never_sees_test_labels(sbm):
    partition = PartitionSpec("metis", "random", 0.4, 0.3)  # neither the clients nor the splits depend on labels
    built = build_partition(sbm, partition, 3, seed=0)
    test_nodes = torch.cat([nodes[m] for nodes, m in zip(built.client_nodes, built.test_mask)])
    relabelled = sbm.clone()
    relabelled.y[test_nodes] = 0  # class sizes over all nodes change, those over training nodes do not
    assert same_parameters(_real_graph_distillation(sbm, partition), _real_graph_distillation(relabelled, partition))
    # the check can fail: training labels do reach the distillation weights
    relabelled_train = sbm.clone()
    train_nodes = torch.cat([nodes[m] for nodes, m in zip(built.client_nodes, built.train_mask)])
    relabelled_train.y[train_nodes[:5]] = 0
    assert not same_parameters(
        _real_graph_distillation(sbm, partition), _real_graph_distillation(relabelled_train, partition)
    )


def test_fedtad_after_fedsage_plus_waits_for_the_classifier_and_sees_the_mended_graphs(sbm):
    method = make_method(sbm, "fedtad", {
        "base": "fedsage_plus", "base_hparams": {"generator_rounds": 1, "num_pred": 2}, "distill_epochs": 1,
    })
    assert method.clients is method.base.clients
    uploads = all_clients(method, 1)
    method.server_update(1, uploads)
    assert method.server_models() == []
    assert all(a is not b for a, b in zip(method.clients, method.federation.clients))  # mended
    before = [p.detach().clone() for p in method.base.global_model.parameters()]
    uploads = all_clients(method, 2)
    method.server_update(2, uploads)
    assert method.server_models() == [method.base.global_model]
    assert any(not torch.equal(a, b) for a, b in zip(before, method.base.global_model.parameters()))


def test_sampled_walk_ids_follow_the_authors_code_distribution():
    """The code's walks stay with probability e^{1/d} / (e^{1/d} + N - 1) and otherwise jump
    to a uniformly drawn other node: on a 3-node path, the middle node (d = 3) stays with
    probability e^{1/3} / (e^{1/3} + 2) and the two jumps are equally likely."""
    from fglrepro.components.topology import sampled_walk_ids

    edges = torch.tensor([[0, 1, 1, 2], [1, 0, 2, 1]])
    generator = torch.Generator().manual_seed(0)
    draws = torch.cat([sampled_walk_ids(edges, 3, 2, generator) for _ in range(4000)])
    assert draws.shape == (12000, 3)
    assert torch.equal(draws[:, 0], torch.arange(3.0).repeat(4000)) and torch.equal(draws[:, 0], draws[:, 1])
    middle_next = draws[1::3, 2]
    stay = math.exp(1 / 3) / (math.exp(1 / 3) + 2)
    assert (middle_next == 1).float().mean().item() == pytest.approx(stay, abs=0.03)
    assert (middle_next == 0).sum().item() == pytest.approx((middle_next == 2).sum().item(), rel=0.1)


def test_code_fidelity_changes_reliability_and_is_a_validated_choice(sbm):
    """(Its teachers keep dropout: tests/test_defining_properties.py.)"""
    paper = make_method(sbm, "fedtad", {"distill_epochs": 1})
    code = make_method(sbm, "fedtad", {"distill_epochs": 1, "fidelity": "code"})
    assert not all(torch.allclose(a, b) for a, b in zip(paper.reliability, code.reliability))
    assert all(torch.all(phi >= 0) for phi in code.reliability)
    with pytest.raises(ConfigError, match="fidelity"):
        resolve_method("fedtad", {"fidelity": "authors"})
