"""FedGKC: KAMA's node scores and weights, the neighbourhood distillation of eq. 1, the
reduction to FML, and what heterogeneous clients exchange (METHOD_NOTES section 2)."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from helpers import all_clients, assert_refused, hand_client, make_method, method_problems, one_round, train_config

from fglrepro.config import ConfigError, EvalConfig, ModelConfig
from fglrepro.fl.aggregation import load_parameters, parameters_of, weighted_average
from fglrepro.fl.clients import normalized_adjacency
from fglrepro.fl.communication import module_bytes
from fglrepro.fl.loop import run_federation
from fglrepro.fl.losses import kl_divergence, neighbourhood_kl
from fglrepro.fl.training import make_optimizer
from fglrepro.methods import METHOD_MODULES
from fglrepro.methods.fedgkc import (
    FedGKCHparams,
    kama_weights,
    knowledge_level,
    mean_neighbour_cosine,
    mutual_losses,
    node_scores,
    self_distillation_loss,
)
from fglrepro.models import edge_index_of

#: Table 1's zoo (client k gets architecture k mod 5), as encoder -> 16 -> head.
DIVERGENT = ModelConfig(hidden=16, readout=True, clients=[
    {"arch": "gcn"}, {"arch": "gat"}, {"arch": "sage"}, {"arch": "gin"}, {"arch": "sgc", "hops": 2}])
#: Table 2's zoo: SGC-2, GCN-2/4/6 with jumping knowledge.
SCALES = ModelConfig(hidden=16, readout=True, clients=[
    {"arch": "sgc", "hops": 2}, {"arch": "gcn"}, {"arch": "gcn", "layers": 4, "jk": "max"},
    {"arch": "gcn", "layers": 6, "jk": "max"}])
LOCAL = EvalConfig(model="local")


def random_graph(n: int = 9, seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    edges = torch.randint(0, n - 1, (2, 2 * n), generator=gen)
    edges = torch.cat([edges, edges.flip(0)], dim=1)
    return edges[:, edges[0] != edges[1]].unique(dim=1)  # node n-1 isolated


# ---- KAMA ---------------------------------------------------------------------------------

def test_node_score_is_the_affine_form_of_eq_14():
    gen = torch.Generator().manual_seed(0)
    probs = F.softmax(3 * torch.randn(9, 5, generator=gen), dim=-1)
    edges = random_graph()
    lam, num_classes = 0.3, 5
    similarity = torch.zeros(9)
    for i in range(9):
        neighbours = edges[0, edges[1] == i].tolist()
        if neighbours:
            similarity[i] = sum(F.cosine_similarity(probs[i], probs[j], dim=0) for j in neighbours) / len(neighbours)
    assert float(similarity[8]) == 0.0  # the isolated node has no over-smoothing penalty
    top = probs.max(dim=-1).values
    expected = (1 + 2 / (num_classes - 1)) * top - 1 / (num_classes - 1) - lam * similarity
    assert torch.allclose(node_scores(probs, edges, lam), expected, atol=1e-6)
    assert torch.allclose(mean_neighbour_cosine(probs, edges), similarity, atol=1e-6)
    # each switch drops its term
    assert torch.allclose(node_scores(probs, edges, lam, strength=False), expected - top, atol=1e-6)
    assert torch.allclose(node_scores(probs, edges, lam, class_clarity=False),
                          top - lam * similarity, atol=1e-6)
    assert torch.allclose(node_scores(probs, edges, lam, assoc_clarity=False), expected + lam * similarity, atol=1e-6)


@pytest.mark.parametrize("num_classes", [2, 3, 7])
def test_a_one_hot_prediction_without_neighbours_scores_one_plus_one_over_m_minus_one(num_classes):
    probs = F.one_hot(torch.arange(4) % num_classes, num_classes).float()
    scores = node_scores(probs, torch.empty(2, 0, dtype=torch.long), lam=0.1)
    assert torch.allclose(scores, torch.full((4,), 1 + 1 / (num_classes - 1)))
    uniform = node_scores(torch.full((1, num_classes), 1 / num_classes), torch.empty(2, 0, dtype=torch.long), 0.1)
    assert torch.allclose(uniform, torch.tensor([1 / (num_classes * (num_classes - 1))]))


def test_kama_weights_sum_to_one_and_mix_volume_and_knowledge():
    gen = torch.Generator().manual_seed(0)
    for _ in range(20):
        volumes = torch.rand(6, generator=gen, dtype=torch.float64) * 100 + 1
        knowledge = torch.randn(6, generator=gen, dtype=torch.float64)
        weights = kama_weights(volumes, knowledge)
        assert torch.isclose(weights.sum(), torch.tensor(1.0, dtype=torch.float64)) and (weights >= 0).all()
    volumes = torch.tensor([10.0, 30.0, 60.0], dtype=torch.float64)
    w_vol = volumes / volumes.sum()
    equal = kama_weights(volumes, torch.full((3,), 0.7, dtype=torch.float64))
    assert torch.allclose(equal, (w_vol + 1 / 3) / 2)  # equal knowledge: not the volume weights
    knowledge = torch.tensor([1.0, 3.0, 1.0], dtype=torch.float64)
    assert torch.allclose(kama_weights(volumes, knowledge), (w_vol + knowledge / 5) / 2)


def test_a_negative_knowledge_level_counts_as_zero_and_none_positive_gives_volume_weights():
    volumes = torch.tensor([10.0, 30.0, 60.0], dtype=torch.float64)
    w_vol = volumes / volumes.sum()
    weights = kama_weights(volumes, torch.tensor([-0.5, 1.0, 3.0], dtype=torch.float64))
    assert torch.isclose(weights[0], w_vol[0] / 2)  # half its volume weight, never negative
    assert torch.allclose(weights[1:], (w_vol[1:] + torch.tensor([0.25, 0.75], dtype=torch.float64)) / 2)
    assert torch.isclose(weights.sum(), torch.tensor(1.0, dtype=torch.float64))
    none_positive = kama_weights(volumes, torch.tensor([-0.5, 0.0, -0.01], dtype=torch.float64))
    assert torch.allclose(none_positive, w_vol)


def test_near_uniform_predictions_give_a_negative_knowledge_level():
    """Round one's case: near-uniform copilot predictions on a connected graph score below 0."""
    edges = random_graph(n=6)
    client = hand_client(torch.randn(6, 3), [0, 1, 2, 0, 1, 2], edges.tolist(), [True] * 6, num_classes=3)

    class Uniform(torch.nn.Module):
        def forward(self, x, adj):
            return torch.zeros(x.size(0), 3)

    assert float(knowledge_level(Uniform(), client, FedGKCHparams(lam=0.5))) < 0


# ---- SMKD ---------------------------------------------------------------------------------

def test_neighbourhood_kl_is_the_sum_over_each_neighbourhood_averaged_over_nodes():
    gen = torch.Generator().manual_seed(1)
    teacher, student = torch.randn(9, 4, generator=gen), torch.randn(9, 4, generator=gen)
    edges = random_graph()
    adj = normalized_adjacency(edges, 9)
    expected = 0.0
    for i in range(9):
        for j in [i] + edges[0, edges[1] == i].tolist():
            expected += float(kl_divergence(teacher[j], student[i], reduction="sum"))
    assert float(neighbourhood_kl(teacher, student, adj)) == pytest.approx(expected / 9, rel=1e-5)
    for seed in range(5):
        a, b = torch.randn(9, 4, generator=gen) * seed, torch.randn(9, 4, generator=gen)
        assert float(neighbourhood_kl(a, b, adj)) >= 0.0
    no_edges = normalized_adjacency(torch.empty(2, 0, dtype=torch.long), 9)
    assert float(neighbourhood_kl(teacher, teacher, no_edges)) == pytest.approx(0.0, abs=1e-7)
    assert float(neighbourhood_kl(teacher, teacher, adj)) > 0.0  # neighbours differ


def test_without_beta_and_self_distillation_the_objective_is_fml():
    """beta = 0 (or smkd off): L_local = a CE(y, p_l) + (1 - a) KL(p_c || p_l) and L_cop the
    mirror image, on the training nodes; self-distillation adds nothing."""
    gen = torch.Generator().manual_seed(2)
    edges = random_graph()
    train = [True, False] * 4 + [True]
    client = hand_client(torch.randn(9, 3, generator=gen), [0, 1, 2] * 3, edges.tolist(), train, num_classes=3)
    outputs = [(torch.randn(9, 5, generator=gen), torch.randn(9, 3, generator=gen)) for _ in range(2)]
    mask, labels = client.train_mask, client.y[client.train_mask]
    (_, logits_l), (_, logits_c) = outputs
    fml_local = 0.6 * F.cross_entropy(logits_l[mask], labels) + 0.4 * kl_divergence(logits_c[mask], logits_l[mask])
    fml_copilot = 0.6 * F.cross_entropy(logits_c[mask], labels) + 0.4 * kl_divergence(logits_l[mask], logits_c[mask])
    for hp in (FedGKCHparams(beta=0.0), FedGKCHparams(smkd=False), FedGKCHparams(coarse_alignment=True)):
        loss_l, loss_c = mutual_losses(outputs[0], outputs[1], client, hp)
        assert torch.equal(loss_l, fml_local) and torch.equal(loss_c, fml_copilot)
    loss_l, loss_c = mutual_losses(outputs[0], outputs[1], client, FedGKCHparams(mutual=False))
    assert torch.equal(loss_l, 0.6 * F.cross_entropy(logits_l[mask], labels))
    for space, (teacher, student) in (("logits", (logits_c, logits_l)), ("hidden", (outputs[1][0], outputs[0][0]))):
        full_l, _ = mutual_losses(outputs[0], outputs[1], client, FedGKCHparams(neighbour_space=space))
        neigh = neighbourhood_kl(teacher, student, client.adj)
        assert torch.allclose(full_l, 0.6 * F.cross_entropy(logits_l[mask], labels) + 0.2 * neigh
                              + 0.2 * kl_divergence(logits_c[mask], logits_l[mask]))


def test_each_loss_reaches_only_its_own_model():
    gen = torch.Generator().manual_seed(3)
    client = hand_client(torch.randn(9, 3, generator=gen), [0, 1, 2] * 3, random_graph().tolist(), [True] * 9,
                         num_classes=3)
    for space in ("logits", "hidden"):
        leaves = [torch.randn(9, d, generator=gen, requires_grad=True) for d in (5, 3, 5, 3)]
        loss_l, _ = mutual_losses((leaves[0], leaves[1]), (leaves[2], leaves[3]), client,
                                  FedGKCHparams(neighbour_space=space))
        loss_l.backward()
        assert leaves[1].grad.abs().sum() > 0 and leaves[2].grad is None and leaves[3].grad is None
        # L_neigh reaches the local hidden embeddings only when it compares them
        assert (leaves[0].grad is not None) == (space == "hidden")


def test_self_distillation_vanishes_without_perturbation_and_reaches_every_parameter(sbm):
    method = make_method(sbm, "fedgkc", model=DIVERGENT, num_clients=5)
    client = method.clients[0]
    model = method.states[0].model.eval()  # no dropout: identical views give identical outputs
    none = FedGKCHparams(weak_edge_drop=0.0, weak_feature_mask=0.0, strong_edge_drop=0.0, strong_feature_mask=0.0)
    assert float(self_distillation_loss(model, client, none).detach()) == pytest.approx(0.0, abs=1e-7)
    loss = self_distillation_loss(model, client, FedGKCHparams())
    assert float(loss) > 0
    loss.backward()
    assert all(p.grad is not None for p in model.parameters())


# ---- the method on the round loop -------------------------------------------------------------

def test_without_beta_self_distillation_and_kama_fedgkc_runs_fml():
    """Two rounds of FedGKC(beta = 0, no self-distillation, no KAMA) equal a hand-written FML
    (Shen et al.) with alpha = beta = 0.6 on the same clients, bit for bit: private models of
    the zoo, meme models averaged with n_k."""
    from conftest import make_sbm

    data = make_sbm()
    hparams = {"beta": 0.0, "self_distill": False, "kama": False}
    method = make_method(data, "fedgkc", hparams, model=DIVERGENT, num_clients=5)
    reference = make_method(data, "fedgkc", hparams, model=DIVERGENT, num_clients=5)
    clients = reference.clients
    private = [copy.deepcopy(s.model) for s in reference.states]
    meme_global = copy.deepcopy(reference.global_copilot)
    meme = [copy.deepcopy(meme_global) for _ in clients]
    schedule = train_config()
    optimizers = [make_optimizer(torch.nn.ModuleList([p, m]), schedule) for p, m in zip(private, meme)]
    torch.manual_seed(7)
    for round_ in (1, 2):
        for k, client in enumerate(clients):
            load_parameters(meme[k], parameters_of(meme_global))
            mask, labels = client.train_mask, client.y[client.train_mask]
            private[k].train(), meme[k].train()
            for _ in range(schedule.local_epochs):
                optimizers[k].zero_grad()
                p, m = private[k](client.x, client.adj)[mask], meme[k](client.x, client.adj)[mask]
                loss = (0.6 * F.cross_entropy(p, labels) + 0.4 * kl_divergence(m.detach(), p)
                        + 0.6 * F.cross_entropy(m, labels) + 0.4 * kl_divergence(p.detach(), m))
                loss.backward()
                optimizers[k].step()
        load_parameters(meme_global, weighted_average([parameters_of(m) for m in meme],
                                                      [float(c.num_nodes) for c in clients]))
    torch.manual_seed(7)
    for round_ in (1, 2):
        one_round(method, round_)
    for state, expected in zip(method.states, private):
        assert all(torch.equal(a, b) for a, b in zip(state.model.parameters(), expected.parameters()))
    assert all(torch.equal(a, b) for a, b in zip(method.global_copilot.parameters(), meme_global.parameters()))


@pytest.mark.skipif("fml" not in METHOD_MODULES, reason="the FML baseline module is not on this branch")
def test_without_beta_self_distillation_and_kama_fedgkc_equals_the_fml_method():
    from conftest import make_sbm

    data = make_sbm()
    histories = []
    for name, hparams in (("fedgkc", {"beta": 0.0, "self_distill": False, "kama": False}),
                          ("fml", {"alpha": 0.6, "beta": 0.6})):
        method = make_method(data, name, hparams, model=DIVERGENT, num_clients=5)  # seeds torch
        histories.append(run_federation(method, 2, LOCAL).rounds)
    assert [r["weighted"] for r in histories[0]] == [r["weighted"] for r in histories[1]]


@pytest.mark.parametrize("zoo", [DIVERGENT, SCALES], ids=["divergent", "scales"])
def test_heterogeneous_clients_exchange_only_the_copilot(sbm, zoo):
    """Uploads hold the copilot's parameters (same names and shapes for every architecture)
    and one knowledge level; the server never touches the clients' own models."""
    method = make_method(sbm, "fedgkc", model=zoo, num_clients=5)
    names = [type(s.model).__name__ for s in method.states]
    assert len(set(names)) > 1
    uploads = all_clients(method, 1)
    copilot_shapes = {n: p.shape for n, p in method.global_copilot.named_parameters()}
    own = [copy.deepcopy(s.model.state_dict()) for s in method.states]
    for k, upload in uploads.items():
        assert {n: p.shape for n, p in upload.params.items()} == copilot_shapes
        assert list(upload.extras) == ["knowledge"] and upload.extras["knowledge"].numel() == 1
        assert upload.num_bytes == module_bytes(method.global_copilot) + 4
    method.server_update(1, uploads)
    for state, before in zip(method.states, own):
        assert all(torch.equal(before[n], v) for n, v in state.model.state_dict().items())
    # the server's copilot is the KAMA-weighted average of the uploaded copilots
    levels = torch.cat([uploads[k].extras["knowledge"] for k in sorted(uploads)]).double()
    volumes = torch.tensor([uploads[k].weight for k in sorted(uploads)], dtype=torch.float64)
    weights = kama_weights(volumes, levels)
    assert torch.allclose(method.weights, weights)
    expected = weighted_average([uploads[k].params for k in sorted(uploads)], weights.tolist())
    assert all(torch.equal(p, expected[n]) for n, p in method.global_copilot.named_parameters())


def test_upload_bytes_do_not_depend_on_the_local_architecture(sbm):
    by_zoo = []
    for zoo in (DIVERGENT, SCALES, ModelConfig(hidden=16, readout=True)):
        method = make_method(sbm, "fedgkc", model=zoo, num_clients=5)
        by_zoo.append([u.num_bytes for u in one_round(method, 1).values()])
    assert by_zoo[0] == by_zoo[1] == by_zoo[2]
    fedavg_like = make_method(sbm, "fedgkc", {"kama": False}, model=DIVERGENT, num_clients=5)
    assert [u.num_bytes for u in one_round(fedavg_like, 1).values()] == [b - 4 for b in by_zoo[0]]


def test_fedgkc_trains_every_zoo_and_the_local_models_are_tested(sbm):
    method = make_method(sbm, "fedgkc", model=DIVERGENT, num_clients=5, rounds=3)
    history = run_federation(method, 3, LOCAL)
    assert all(torch.isfinite(torch.tensor(r["train_loss"])) for r in history.rounds)
    assert history.rounds[-1]["train_loss"] < history.rounds[0]["train_loss"]
    assert [method.eval_model(k, "local") is s.model for k, s in enumerate(method.states)] == [True] * 5
    assert method.weights is not None and torch.isclose(method.weights.sum(), torch.tensor(1.0, dtype=torch.float64))


def test_protocol_limits_name_the_keys():
    assert method_problems("fedgkc", model=DIVERGENT, evaluation=LOCAL) == []
    assert_refused(method_problems("fedgkc", model=ModelConfig(hidden=16, clients=DIVERGENT.clients),
                                   evaluation=LOCAL), "set model.readout: true")
    uneven = ModelConfig(hidden=16, readout=True, clients=[{"arch": "gcn"}, {"arch": "gat", "hidden": 32}])
    assert_refused(method_problems("fedgkc", model=uneven, evaluation=LOCAL), r"one hidden width.*\[16, 32\]")
    assert_refused(method_problems("fedgkc", model=DIVERGENT), "no global model to evaluate")
    with pytest.raises(ConfigError, match="alpha \\+ beta <= 1"):
        FedGKCHparams(alpha=0.9, beta=0.2)
    with pytest.raises(ConfigError, match=r"neighbour_space must be one of \['hidden', 'logits'\], got 'embedding'"):
        FedGKCHparams(neighbour_space="embedding")
    with pytest.raises(ConfigError, match="hparams.strong_edge_drop must be in"):
        FedGKCHparams(strong_edge_drop=1.0)


def test_edges_of_the_operator_drive_the_association_clarity():
    edges = torch.tensor([[0, 1], [1, 0]])
    probs = torch.tensor([[0.9, 0.1], [0.9, 0.1], [0.5, 0.5]])
    scores = node_scores(probs, edge_index_of(normalized_adjacency(edges, 3)), lam=1.0)
    # nodes 0 and 1 are identical neighbours (cosine 1); node 2 is isolated
    assert torch.allclose(scores, torch.tensor([0.9 + 0.8 - 1.0, 0.9 + 0.8 - 1.0, 0.5]))
