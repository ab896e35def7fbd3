"""Properties that fail when the term that defines a stage or method is dropped, negated or
swapped: each test here catches at least one mutation of scripts/mutations.yaml (issue 30)."""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass

import pytest
import torch
import torch.nn.functional as F
from helpers import all_clients, hand_client, make_method, one_round

from fglrepro.config import EvalConfig, ModelConfig
from fglrepro.fl.aggregation import parameters_of
from fglrepro.fl.clients import normalized_adjacency
from fglrepro.fl.engine import VectorisedEngine
from fglrepro.fl.evaluation import evaluate_each
from fglrepro.fl.loop import run_federation
from fglrepro.methods import adafgl, fedgkc, fedstar, fedtad, fgssl, fiarse, moon, opfgl
from fglrepro.methods.fedgkd.task_relator import aggregation_weights, relator_weights
from fglrepro.metrics import macro_f1
from fglrepro.partition.partitioners import PARTITIONERS, get_partitioner, louvain_membership

#: FedGKC distils hidden embeddings: its model needs a readout layer.
READOUT = ModelConfig(hidden=16, readout=True)

def recorded_calls(monkeypatch, module, name: str) -> list[tuple]:
    """Replace ``module.name`` by a wrapper that calls it and records each call's positional
    arguments in the returned list."""
    calls = []
    real = getattr(module, name)

    def wrapper(*args):
        calls.append(args)
        return real(*args)

    monkeypatch.setattr(module, name, wrapper)
    return calls


# ---- the round loop: which round is reported --------------------------------------------------


@dataclass
class ScriptedClient:
    num_nodes: int


class ScriptedMethod:
    """A method that trains nothing; the tested metrics come from a scripted evaluator."""

    def __init__(self, sizes: list[int]) -> None:
        self.clients = [ScriptedClient(n) for n in sizes]

    def participants(self, round_: int) -> list[int]:
        return []

    def client_updates(self, ks: list[int], round_: int) -> dict:
        return {}

    def server_update(self, round_: int, uploads: dict) -> None:
        pass

    def eval_model(self, k: int, stage: str) -> None:
        return None

    def on_run_end(self, round_: int) -> bool:
        return False


def scripted_evaluator(curves: list[list[tuple[float, float]]]):
    """Evaluator returning, at its r-th call, client k's ``(val_acc, test_acc) = curves[r][k]``."""
    calls = iter(curves)

    def evaluate(models, clients) -> list[dict[str, float]]:
        return [{"val_acc": v, "val_f1_macro": v, "test_acc": t, "test_f1_macro": t} for v, t in next(calls)]

    return evaluate


def test_best_round_is_selected_by_validation_not_test_accuracy():
    # round 2 has the best validation accuracy, round 1 the best test accuracy
    curves = [[(0.5, 0.9)], [(0.7, 0.6)], [(0.6, 0.8)]]
    history = run_federation(ScriptedMethod([10]), 3, EvalConfig(), evaluator=scripted_evaluator(curves))
    assert history.best_index == 1
    assert history.best["weighted"]["test_acc"] == pytest.approx(0.6)


def test_best_round_follows_the_configured_average_and_the_first_of_ties():
    # client 0 has 9 of 10 nodes: the weighted mean peaks in round 1, the plain mean in round 2
    curves = [[(0.8, 0.0), (0.0, 0.0)], [(0.5, 0.0), (1.0, 0.0)], [(0.8, 0.0), (0.0, 0.0)]]
    weighted = run_federation(ScriptedMethod([9, 1]), 3, EvalConfig(), evaluator=scripted_evaluator(curves))
    plain = run_federation(ScriptedMethod([9, 1]), 3, EvalConfig(average="unweighted"),
                           evaluator=scripted_evaluator(curves))
    assert weighted.best_index == 0  # rounds 1 and 3 tie at 0.72: the earlier one
    assert plain.best_index == 1
    assert weighted.final["weighted"]["val_acc"] == pytest.approx(0.72)


class StagedMethod(ScriptedMethod):
    """Records, in order, the server updates and the (client, stage) of every model tested."""

    def __init__(self, sizes: list[int]) -> None:
        super().__init__(sizes)
        self.events: list[tuple] = []

    def server_update(self, round_: int, uploads: dict) -> None:
        self.events.append(("server", round_))

    def eval_model(self, k: int, stage: str) -> tuple[int, str]:
        self.events.append(("test", k, stage))
        return k, stage


@pytest.mark.parametrize("model", ["local", "global"])
def test_the_tested_models_are_the_trained_local_ones_before_the_server_step_or_the_received_global_ones_after_it(
        model):
    method = StagedMethod([4, 6])
    constant = [[(0.5, 0.5), (0.5, 0.5)]] * 2
    run_federation(method, 2, EvalConfig(model=model), evaluator=scripted_evaluator(constant))
    tests = [("test", 0, model), ("test", 1, model)]
    rounds = [[*tests, ("server", r)] if model == "local" else [("server", r), *tests] for r in (1, 2)]
    assert method.events == rounds[0] + rounds[1]


def test_accuracy_counts_only_the_nodes_of_its_split():
    """Predictions right on the test nodes only: test accuracy 1, validation accuracy 0, whatever
    the training nodes get."""
    client = hand_client(torch.eye(6), [0, 1, 0, 1, 0, 1], [[0, 1], [1, 0]], train=[True, True] + [False] * 4,
                         val=[False, False, True, True, False, False], test=[False] * 4 + [True, True])

    class Fixed(torch.nn.Module):
        def forward(self, x, adj):
            right = F.one_hot(client.y, 2).float()
            return torch.cat([right[:2].flip(1), right[2:4].flip(1), right[4:]])  # wrong on train and val

    (metrics,) = evaluate_each([Fixed()], [client])
    assert metrics["test_acc"] == 1.0 and metrics["val_acc"] == 0.0


# ---- FedAvg: weights n_k / N ------------------------------------------------------------------


@pytest.mark.parametrize("name", ["fedavg", "fedavg_by_arch"])
def test_fedavg_weights_clients_by_node_count(sbm, name):
    method = make_method(sbm, name, unbalanced=True, local_epochs=2)
    uploads = one_round(method, 1)
    sizes = torch.tensor([float(method.clients[k].num_nodes) for k in uploads], dtype=torch.float64)
    assert sizes.min() < sizes.max()  # the property needs unequal clients
    (server,) = method.server_models()
    for key, value in parameters_of(server).items():
        stacked = torch.stack([uploads[k].params[key].double() for k in uploads])
        weighted = (sizes.view(-1, *[1] * value.dim()) * stacked).sum(0) / sizes.sum()
        assert torch.allclose(value.double(), weighted, atol=1e-6)
        if key.endswith("weight"):
            assert not torch.allclose(value.double(), stacked.mean(0), atol=1e-6)


# ---- metrics ------------------------------------------------------------------------------------


def test_macro_f1_counts_classes_that_are_only_predicted():
    # class 2 never occurs in the target but is predicted once: F1 of (1, 2/3, 0) over 3 classes
    target, pred = torch.tensor([0, 1, 1]), torch.tensor([0, 1, 2])
    assert macro_f1(pred, target, 4) == pytest.approx((1 + 2 / 3 + 0) / 3)
    assert macro_f1(pred, target, 4, all_classes=True) == pytest.approx((1 + 2 / 3) / 4)


# ---- partitioners: seed sensitivity where it matters --------------------------------------------


def test_louvain_depends_on_its_seed_on_cora(cora):
    def membership(seed: int):
        return louvain_membership(cora.edge_index, cora.num_nodes, seed).tolist()

    assert membership(3) == membership(3)
    assert membership(3) != membership(4)


#: options of every seeded partitioner on Cora with 10 clients (the external one reads a file)
SEEDED = {"louvain": {"delta": 5}, "louvain_plus": {"num_communities": 16, "delta": 5}, "metis": {},
          "metis_plus": {"num_communities": 16}, "metis_overlap": {}, "louvain_communities": {},
          "dirichlet": {"min_size": 5}}


@pytest.mark.parametrize("name", sorted(SEEDED))
def test_every_seeded_partitioner_gives_another_partition_for_another_seed_on_cora(cora, name):
    def clients(seed: int) -> list[list[int]]:
        return [c.tolist() for c in get_partitioner(name)(cora, 10, seed, **SEEDED[name])]

    assert set(SEEDED) == set(PARTITIONERS) - {"external"}
    assert clients(3) == clients(3)
    assert clients(3) != clients(4)


# ---- FedGKD: eq. 9 ------------------------------------------------------------------------------


def test_fedgkd_weights_favour_related_clients_by_eq_9():
    kernel = torch.tensor([[1.0, 0.0], [0.0, 1.0]], dtype=torch.float64)
    q = aggregation_weights(kernel, tau_s=2.0)
    e2 = math.exp(2.0)
    assert q[0].tolist() == pytest.approx([e2 / (e2 + 1), 1 / (e2 + 1)])


def test_fedgkd_relator_gives_the_correlated_client_more_weight():
    # client 1's task features equal client 0's, client 2's are their negation
    base = torch.tensor([[1.0, 0.0], [2.0, 1.0], [3.0, 3.0]])
    q = relator_weights(torch.stack([base, base, -base]), "local", tau=1.0, tau_s=1.0, series_start=0)
    # R row 0 = (1, 1, -1): q_0 = softmax(1, 1, -1)
    expected = torch.softmax(torch.tensor([1.0, 1.0, -1.0], dtype=torch.float64), 0)
    assert q[0].tolist() == pytest.approx(expected.tolist())
    assert q[0, 1] > q[0, 2]


# ---- FedGKC: KAMA's knowledge level and SMKD's detached weak view -----------------------------


def test_fedgkc_uploads_the_copilots_knowledge_level(sbm):
    method = make_method(sbm, "fedgkc", num_clients=3, model=READOUT)
    with torch.no_grad():
        for p in method.states[0].model.parameters():
            p.mul_(-3.0)
    client, state = method.clients[0], method.states[0]
    of_copilot = fedgkc.knowledge_level(state.modules["copilot"], client, method.hparams)
    of_local = fedgkc.knowledge_level(state.model, client, method.hparams)
    assert not torch.isclose(of_copilot, of_local)
    uploaded = method.upload(0, 1, 0.0).extras["knowledge"]
    assert torch.allclose(uploaded, of_copilot.view(1))


def test_fedgkc_self_distillation_sends_no_gradient_through_the_weak_view(sbm, monkeypatch):
    method = make_method(sbm, "fedgkc", num_clients=3, model=READOUT)
    views = []

    def leaf_view(client, edge_drop, feature_mask):
        x = client.x.clone().requires_grad_(True)
        views.append(x)
        return x, client.adj

    monkeypatch.setattr(fedgkc, "perturbed_view", leaf_view)
    model = method.states[0].model.eval()
    fedgkc.self_distillation_loss(model, method.clients[0], method.hparams).backward()
    weak, strong = views
    assert weak.grad is None
    assert strong.grad is not None and strong.grad.abs().sum() > 0


# ---- FedTAD: code fidelity keeps the teachers' dropout ------------------------------------------


@pytest.mark.parametrize("fidelity", ["paper", "code"])
def test_fedtad_teachers_are_in_training_mode_only_with_code_fidelity(sbm, monkeypatch, fidelity):
    calls = recorded_calls(monkeypatch, fedtad, "uploaded_teachers")
    method = make_method(sbm, "fedtad", {"distill_epochs": 1, "fidelity": fidelity}, local_epochs=1)
    one_round(method, 1)
    assert [training for _, _, training, _ in calls] == [fidelity == "code"]


# ---- O-pFGL: the focal-loss variant -------------------------------------------------------------


def test_focal_loss_reduces_to_cross_entropy_and_matches_a_hand_value():
    logits = torch.tensor([[2.0, 0.0], [0.0, 1.0]])
    labels = torch.tensor([0, 0])
    assert opfgl.focal_loss(logits, labels, 0.0) == pytest.approx(float(F.cross_entropy(logits, labels)))
    p1, p2 = 1 / (1 + math.exp(-2)), 1 / (1 + math.exp(1))  # p_t of each node
    expected = (-(1 - p1) ** 2 * math.log(p1) - (1 - p2) ** 2 * math.log(p2)) / 2
    assert opfgl.focal_loss(logits, labels, 2.0) == pytest.approx(expected)


@pytest.mark.parametrize("engine", ["sequential", "auto"])
@pytest.mark.parametrize("variant", ["ft", "ft_focal"])
def test_opfgl_ft_focal_finetunes_with_the_focal_loss(sbm, monkeypatch, variant, engine):
    """Both paths (per client; batched with ``engine: auto``) fine-tune ``ft_focal`` with the
    focal terms of ``focal_gamma`` and ``ft`` without."""
    calls = recorded_calls(monkeypatch, opfgl, "focal_terms")
    fast = {"surrogate_iterations": 5, "stage1_steps": 2, "finetune_steps": 2, "eval_every": 1, "focal_gamma": 1.5}
    method = make_method(sbm, "opfgl", {**fast, "variant": variant}, rounds=1, engine=engine)
    assert (method.stacked is None) == (engine == "sequential")
    one_round(method, 1)
    assert (len(calls) > 0) == (variant == "ft_focal")
    assert {gamma for _, gamma in calls} <= {1.5}


# ---- FedProx: the proximal term pulls local models to the received one ---------------------------


@pytest.mark.parametrize("engine", ["sequential", "auto"])
def test_fedprox_proximal_term_keeps_local_models_near_the_global_one(sbm, engine):
    def distance(mu: float) -> float:
        method = make_method(sbm, "fedprox", {"mu": mu}, engine=engine, local_epochs=5)
        start = {n: p.detach().clone() for n, p in parameters_of(method.global_model).items()}
        uploads = method.client_updates([0, 1, 2], 1)
        return sum(float((u.params[n] - start[n]).norm()) for u in uploads.values() for n in start)

    assert distance(10.0) < 0.9 * distance(0.0)


# ---- local objectives written out: FedTGP, FedKD ------------------------------------------------


def test_fedtgp_local_loss_is_cross_entropy_plus_lam_times_prototype_alignment(sbm):
    method = make_method(sbm, "fedtgp", {"lam": 2.0}, model=ModelConfig(hidden=16, readout=True, dropout=0.0))
    client, model = method.clients[0], method.states[0].model
    method.global_prototypes = torch.randn(method.num_classes, 16, generator=torch.Generator().manual_seed(0))
    mask, labels = client.train_mask, client.y[client.train_mask]
    hidden, logits = model(client.x, client.adj, return_hidden=True)
    mse = torch.stack([(hidden[mask][labels == c] - method.global_prototypes[c]).pow(2).mean()
                       for c in labels.unique()]).sum()
    expected = F.cross_entropy(logits[mask], labels) + 2.0 * mse
    assert float(method.local_objective(0, 2)()) == pytest.approx(float(expected), rel=1e-5)


def test_fedkd_mentor_and_mentee_distil_each_other_scaled_by_their_cross_entropies(sbm):
    method = make_method(sbm, "fedkd", model=ModelConfig(hidden=16, readout=True, dropout=0.0))
    client, state = method.clients[0], method.states[0]
    with torch.no_grad():
        for p in state.modules["mentee"].parameters():
            p.mul_(2.0)
    mask, labels = client.train_mask, client.y[client.train_mask]
    h_mentor, z_mentor = (t[mask] for t in state.model(client.x, client.adj, return_hidden=True))
    h_mentee, z_mentee = (t[mask] for t in state.modules["mentee"](client.x, client.adj, return_hidden=True))
    ce_mentor, ce_mentee = F.cross_entropy(z_mentor, labels), F.cross_entropy(z_mentee, labels)
    scale = ce_mentor + ce_mentee

    def kl(teacher, student):  # KL(p_teacher || p_student), mean over nodes
        return (F.softmax(teacher, 1) * (F.log_softmax(teacher, 1) - F.log_softmax(student, 1))).sum(1).mean()

    hidden = F.mse_loss(h_mentor, state.modules["hidden_map"](h_mentee)) / scale
    assert float(kl(z_mentee, z_mentor)) > 1e-3
    expected = scale + (kl(z_mentee, z_mentor) + kl(z_mentor, z_mentee)) / scale + 2 * hidden
    assert float(method.local_objective(0, 1)()) == pytest.approx(float(expected), rel=1e-5)


# ---- FedSage+: the cross-client term trains the neighbour generator ---------------------------


def test_fedsage_plus_peer_gradients_steer_the_generator(sbm):
    def generator_after(scale: float) -> list[torch.Tensor]:
        method = make_method(sbm, "fedsage_plus", {"generator_rounds": 2, "num_pred": 2}, rounds=3)
        n_train = len(method.train_nodes[0])
        method.peer_grads[0] = torch.full((n_train, 2, sbm.num_features), scale)
        method.generator_update(0)
        return [p.detach().clone() for p in method.neighgens[0].parameters()]

    one, ten = generator_after(1.0), generator_after(10.0)
    assert not all(torch.allclose(a, b) for a, b in zip(one, ten))


# ---- AdaFGL: the prediction mixes the homophilous and heterophilous branches by rho ------------


def test_adafgl_prediction_mixes_homophilous_and_heterophilous_probabilities_by_rho():
    gen = torch.Generator().manual_seed(0)
    features, smoothed, soft = torch.randn(6, 4, generator=gen), torch.randn(6, 5, generator=gen), torch.randn(6, 3)
    model = adafgl.PersonalizedPropagation(features, smoothed, soft, rho=0.3, hidden=8).eval()
    homo, *hete = model.branches()
    homophilous = (F.softmax(homo, 1) + F.softmax(soft, 1)) / 2
    heterophilous = sum(F.softmax(z, 1) for z in hete) / 3
    out = model(features, None)
    assert torch.allclose(out, 0.3 * homophilous + 0.7 * heterophilous, atol=1e-6)
    assert not torch.allclose(out, homophilous, atol=1e-3)


# ---- FGSSL: the structure distillation term ---------------------------------------------------


def test_fgssl_loss_adds_the_weighted_edge_distribution_kl(sbm, monkeypatch):
    monkeypatch.setattr(fgssl, "perturbed_view", lambda client, edge_drop, feature_mask: (client.x, client.adj))
    method = make_method(sbm, "fgssl", {"structure_weight": 2.0}, model=ModelConfig(hidden=16, dropout=0.0))
    client, model = method.clients[0], method.states[0].model
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(1.5)
    mask = client.train_mask
    hidden, logits = model(client.x, client.adj, return_hidden=True)
    teacher = method.global_model.eval()(client.x, client.adj, return_hidden=True)[0]
    kl = fgssl.edge_distribution_kl(hidden, teacher, client.edge_index, method.hparams.temperature)
    assert float(kl) > 1e-4
    expected = F.cross_entropy(logits[mask], client.y[mask]) + 2.0 * kl
    assert float(method.local_objective(0, 1)()) == pytest.approx(float(expected), rel=1e-5)


# ---- FIARSE: a client computes with its submodel only -----------------------------------------


class Affine(torch.nn.Module):
    """``x W^T + b`` with the ``(x, adj)`` interface of the graph models."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(3, 2)

    def forward(self, x: torch.Tensor, adj: torch.Tensor | None) -> torch.Tensor:
        return self.linear(x)


def test_fiarse_submodel_zeroes_parameters_below_the_threshold():
    model = Affine()
    with torch.no_grad():
        model.linear.weight.copy_(torch.tensor([[0.1, -2.0, 0.5], [3.0, -0.2, 1.0]]))
        model.linear.bias.copy_(torch.tensor([0.3, -1.5]))
    x = torch.tensor([[1.0, 1.0, 1.0]])
    out = fiarse.MaskedSubmodel(model, torch.tensor(0.9))(x, None)
    # kept: -2.0, 3.0, 1.0 and the bias -1.5
    assert out[0].tolist() == pytest.approx([-2.0, 3.0 + 1.0 - 1.5])


def test_fiarse_evaluation_mask_without_autograd_gives_the_training_outputs():
    torch.manual_seed(0)
    model = Affine()
    threshold = fiarse.importance_threshold(list(model.parameters()), 0.5)
    submodel = fiarse.MaskedSubmodel(model, threshold)
    x = torch.randn(5, 3)
    trained = submodel(x, None)
    with torch.no_grad():
        evaluated = submodel(x, None)
    assert torch.equal(evaluated, trained.detach())
    assert not torch.equal(evaluated, model(x, None).detach())


def test_fiarse_thresholds_of_all_sizes_are_the_topk_ranks_of_the_magnitudes():
    """One partial sort for every capacity gives each size's ``torch.topk`` threshold."""
    torch.manual_seed(0)
    params = [torch.randn(30, 7), torch.zeros(5), torch.randn(11).round()]  # ties: zeros, whole numbers
    magnitude = torch.cat([p.abs().flatten() for p in params])
    sizes = [1.0, 0.5, 0.26, 1 / 3, 0.001, 0.999]
    expected = [torch.topk(magnitude, max(1, int(magnitude.numel() * s))).values[-1] for s in sizes]
    assert fiarse.importance_thresholds(params, sizes).tolist() == torch.stack(expected).tolist()


def reference_fiarse_server_update(method, uploads, masks):
    """FIARSE's server step entry by entry with boolean masks (the formula of its docstring)."""
    with torch.no_grad():
        for name, p in method.global_model.named_parameters():
            total, weight = torch.zeros_like(p), torch.zeros_like(p)
            for k, upload in uploads.items():
                held = masks[k][name]
                total[held] += upload.weight * upload.params[name]
                weight[held] += upload.weight
            covered = weight > 0
            p[covered] += method.hparams.server_lr * total[covered] / weight[covered]


def test_fiarse_flat_uploads_and_aggregation_give_the_per_entry_server_step(sbm):
    """Uploads are each submodel's update on its own entries; the flat server step equals the
    entry-by-entry formula exactly; download bytes count the received submodel's entries."""
    scales = ModelConfig(hidden=16, dropout=0.0, clients=[{"arch": "sgc", "hops": 2}, {"layers": 2}, {"layers": 3}])
    method = make_method(sbm, "fiarse", model=scales, num_clients=5, optimizer="adam")
    start = {n: p.detach().clone() for n, p in method.global_model.named_parameters()}
    uploads = all_clients(method, 1)
    masks = {k: {n: p.abs() >= method.states[k].model.threshold for n, p in start.items()} for k in uploads}
    assert len({float(method.states[k].model.threshold) for k in uploads}) == 3
    for k, upload in uploads.items():
        trained = dict(method.states[k].model.model.named_parameters())
        for name, values in upload.params.items():
            assert torch.equal(values, (trained[name] - start[name])[masks[k][name]])
        assert upload.num_bytes == 4 * sum(int(m.sum()) for m in masks[k].values())
    reference = make_method(sbm, "fiarse", model=scales, num_clients=5, optimizer="adam")
    reference_fiarse_server_update(reference, uploads, masks)
    method.server_update(1, uploads)
    for p, q in zip(method.global_model.parameters(), reference.global_model.parameters(), strict=True):
        assert torch.equal(p, q)
    received = [{n: p.abs() >= method.states[k].received.threshold for n, p in method.global_model.named_parameters()}
                for k in uploads]
    assert [method.download_bytes(k) for k in uploads] == [4 * sum(int(m.sum()) for m in r.values())
                                                           for r in received]


# ---- MOON: the contrastive term pulls towards the global model, away from the previous local one ---


@pytest.mark.parametrize("engine", [False, True])
def test_moon_moves_representations_towards_the_global_model_and_away_from_the_previous_local_one(
        sbm, engine):
    """After round 1 every client has a previous local model (MOON's negative); in round 2 the
    contrastive term must raise ``cos(z, z_glob) - cos(z, z_prev)`` above what cross-entropy
    alone (``mu = 0``) reaches, on the sequential path and on the engine's batched terms."""

    def margin(mu: float) -> float:
        method = make_method(sbm, "moon", {"mu": mu}, model=ModelConfig(hidden=16, dropout=0.0), local_epochs=10)
        if engine:
            method.federation.engine = VectorisedEngine(method.federation)
        one_round(method, 1)
        previous = [copy.deepcopy(state.model) for state in method.states]
        received = copy.deepcopy(method.global_model)
        method.client_updates([0, 1, 2], 2)
        total = 0.0
        for client, state, prev in zip(method.clients, method.states, previous):
            z = moon.node_representations(state.model, client)
            positive = moon.node_representations(received, client)
            negative = moon.node_representations(prev, client)
            total += float((F.cosine_similarity(z, positive) - F.cosine_similarity(z, negative)).mean())
        return total / len(method.clients)

    assert margin(5.0) > margin(0.0) + 0.05


# ---- Local: every client trains alone and goes on from where it stopped -------------------------------


@pytest.mark.parametrize("engine", [False, True])
def test_local_clients_depend_on_their_own_data_only(sbm, engine):
    def client_zero(name: str, scramble: bool) -> list[torch.Tensor]:
        method = make_method(sbm, name)
        if engine:
            method.federation.engine = VectorisedEngine(method.federation)
        if scramble:  # the other clients' features and labels, shapes (and dropout draws) unchanged
            gen = torch.Generator().manual_seed(1)
            for client in method.clients[1:]:
                client.x.copy_(torch.rand(client.x.shape, generator=gen))
                client.y.copy_(client.y[torch.randperm(client.num_nodes, generator=gen)])
        for round_ in (1, 2):
            one_round(method, round_)
        return [p.detach().clone() for p in method.states[0].model.parameters()]

    assert all(torch.equal(a, b) for a, b in zip(client_zero("local", False), client_zero("local", True)))
    # the scrambling reaches client 0 as soon as anything is shared
    assert not all(torch.equal(a, b) for a, b in zip(client_zero("fedavg", False), client_zero("fedavg", True)))


def test_local_training_goes_on_across_rounds_from_the_clients_own_models(sbm):
    """Without dropout, 2 rounds of 2 local epochs are 1 round of 4: nothing resets a client's
    model or optimiser between rounds."""

    def models(rounds: int, epochs: int) -> list[torch.Tensor]:
        method = make_method(sbm, "local", model=ModelConfig(hidden=16, dropout=0.0), local_epochs=epochs)
        for round_ in range(1, rounds + 1):
            one_round(method, round_)
        return [p.detach().clone() for state in method.states for p in state.model.parameters()]

    assert all(torch.equal(a, b) for a, b in zip(models(2, 2), models(1, 4)))
    assert not all(torch.equal(a, b) for a, b in zip(models(1, 2), models(1, 4)))


# ---- FedPer: the personal layer stays, the others are the n_k-weighted average --------------------


@pytest.mark.parametrize("engine", [False, True])
def test_fedper_keeps_each_clients_readout_and_averages_the_gcn_layers_by_node_count(sbm, engine):
    method = make_method(sbm, "fedper", model=ModelConfig(hidden=16, readout=True), unbalanced=True)
    if engine:
        method.federation.engine = VectorisedEngine(method.federation)
    method.client_updates([0, 1, 2], 1)
    trained = [{n: p.detach().clone() for n, p in state.model.named_parameters()} for state in method.states]
    method.server_update(1, {k: method.upload(k, 1, 0.0) for k in range(3)})
    for k in range(3):
        method.receive(k, 2)
    sizes = torch.tensor([float(c.num_nodes) for c in method.clients], dtype=torch.float64)
    weights = sizes / sizes.sum()
    assert weights[0] < 0.2  # client 0 is small: a plain mean would differ
    for name, param in method.states[0].model.named_parameters():
        for k, state in enumerate(method.states):
            own = dict(state.model.named_parameters())[name]
            if name.startswith("readout."):
                assert torch.equal(own, trained[k][name])
            else:
                average = sum(w * trained[i][name].double() for i, w in enumerate(weights)).float()
                assert torch.allclose(own, average, atol=1e-6), name


# ---- FedStar: structure feeds the feature channel, only the structure channel is averaged ----------


def test_fedstar_feature_channel_reads_the_structure_channel_and_not_the_reverse():
    model = fedstar.DecoupledGCN(in_channels=5, structure_dim=4, hidden=8, out_channels=3, layers=2,
                                 dropout=0.0).eval()
    gen = torch.Generator().manual_seed(0)
    edges = torch.tensor([[0, 1, 1, 2, 2, 3, 3, 4, 4, 5], [1, 0, 2, 1, 3, 2, 4, 3, 5, 4]])
    adj = normalized_adjacency(edges, 6)
    x = torch.rand(6, 9, generator=gen)
    structure, features = x.clone(), x.clone()
    structure[:, 5:] += torch.rand(6, 4, generator=gen)  # another structure encoding
    features[:, :5] += torch.rand(6, 5, generator=gen)  # other node features
    hidden, hidden_structure, hidden_features = (model(v, adj, return_hidden=True)[0] for v in
                                                 (x, structure, features))
    h, s = slice(0, 8), slice(8, 16)  # hidden = [h_L || s_L]
    assert not torch.allclose(hidden[:, h], hidden_structure[:, h], atol=1e-4)  # h_L reads s
    assert torch.equal(hidden[:, s], hidden_features[:, s])  # s_L never reads the features
    assert not torch.allclose(hidden[:, h], hidden_features[:, h], atol=1e-4)
