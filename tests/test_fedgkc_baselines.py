"""FedGKC's baselines: LG-FedAvg, FML, FedKD, FedTGP, FedPPN, FIARSE (heterogeneous clients)
and FGSSL, AdaFGL (homogeneous), each by its defining property."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from helpers import all_clients, assert_refused, client_models, hand_client, make_method, method_problems, one_round

from fglrepro.components import prototypes as proto
from fglrepro.config import ConfigError, EvalConfig, ModelConfig
from fglrepro.fl.augment import perturbed_view
from fglrepro.fl.clients import normalized_adjacency
from fglrepro.fl.communication import module_bytes, tensor_bytes
from fglrepro.fl.loop import run_federation
from fglrepro.methods import adafgl, fedkd, fedppn, fedtgp, fgssl, fiarse, fml, lg_fedavg

#: Heterogeneous zoo of the tests: GCNs of different depths with one 16-wide linear head.
ZOO = ModelConfig(hidden=16, readout=True, dropout=0.0, clients=[{"layers": 1}, {"layers": 2}, {"layers": 3}])
#: Model scales for FIARSE: SGC-2 and GCNs of 2 and 3 layers.
SCALES = ModelConfig(hidden=16, dropout=0.0, clients=[{"arch": "sgc", "hops": 2}, {"layers": 2}, {"layers": 3}])
#: One homogeneous model without dropout (bit-for-bit comparisons).
PLAIN = ModelConfig(hidden=16, dropout=0.0)
HEAD = ModelConfig(hidden=16, dropout=0.0, readout=True)


def run(data, name, hparams=None, rounds=3, **kwargs):
    """``name`` built by :func:`make_method` and run for ``rounds`` rounds (local evaluation)."""
    evaluation = kwargs.pop("evaluation", EvalConfig(model="local"))
    method = make_method(data, name, hparams, evaluation=evaluation, rounds=rounds, **kwargs)
    run_federation(method, rounds, evaluation)
    return method


def assert_same_models(a, b, exact=True):
    for p, q in zip(a.parameters(), b.parameters(), strict=True):
        assert torch.equal(p, q) if exact else torch.allclose(p, q, atol=1e-6)


# ---- never averaging parameters of different shapes ------------------------------------

@pytest.mark.parametrize("name, module", [("lg_fedavg", lg_fedavg), ("fml", fml), ("fedkd", fedkd)])
def test_heterogeneous_clients_never_average_parameters_of_different_shapes(sbm, monkeypatch, name, module):
    averaged = []
    real = module.weighted_average

    def spy(states, weights):
        averaged.append(states)
        return real(states, weights)

    monkeypatch.setattr(module, "weighted_average", spy)
    method = make_method(sbm, name, model=ZOO)
    shapes = [{n: p.shape for n, p in model.named_parameters()} for model in client_models(method)]
    assert len({tuple(s.items()) for s in shapes}) == 3          # the private models differ
    one_round(method, 1)
    assert len(averaged) == 1
    states = averaged[0]
    assert len(states) == 3
    for state in states[1:]:
        assert {n: t.shape for n, t in state.items()} == {n: t.shape for n, t in states[0].items()}
    if name == "lg_fedavg":
        assert set(states[0]) == {"readout.weight", "readout.bias"}
    else:
        shared = dict(method.states[0].modules["meme" if name == "fml" else "mentee"].named_parameters())
        assert {n: t.shape for n, t in states[0].items()} == {n: p.shape for n, p in shared.items()}


@pytest.mark.parametrize("name", ["fedtgp", "fedppn"])
def test_prototype_methods_upload_no_parameters_and_one_width(sbm, name):
    method = make_method(sbm, name, model=ZOO)
    uploads = one_round(method, 1)
    assert all(u.params == {} for u in uploads.values())
    assert {u.extras["prototypes"].size(1) for u in uploads.values()} == {16}


def test_fiarse_clients_train_submodels_of_one_global_model(sbm):
    method = make_method(sbm, "fiarse", model=SCALES)
    shapes = {n: p.shape for n, p in method.global_model.named_parameters()}
    assert all({n: p.shape for n, p in s.model.model.named_parameters()} == shapes for s in method.states)
    uploads = one_round(method, 1)
    for k, upload in uploads.items():
        held = method.masks[k]
        assert {n: t.numel() for n, t in upload.params.items()} == {n: int(m.sum()) for n, m in held.items()}


# ---- LG-FedAvg -----------------------------------------------------------------------------

def test_lg_fedavg_with_one_client_is_local_training(sbm):
    lg = run(sbm, "lg_fedavg", model=HEAD, num_clients=1)
    local = run(sbm, "local", model=HEAD, num_clients=1)
    assert_same_models(lg.states[0].model, local.states[0].model)


def test_lg_fedavg_averages_only_the_head_and_clients_receive_it(sbm):
    method = make_method(sbm, "lg_fedavg", model=ZOO, unbalanced=True)
    uploads = all_clients(method, 1)
    method.server_update(1, uploads)
    n = torch.tensor([c.num_nodes for c in method.clients], dtype=torch.float)
    for name, p in method.global_head.named_parameters():
        expected = sum(w * uploads[k].params[f"readout.{name}"] for k, w in enumerate(n / n.sum()))
        assert torch.allclose(p, expected, atol=1e-6)
    encoder = {n: p.clone() for n, p in method.states[1].model.named_parameters() if not n.startswith("readout")}
    method.receive(1, 2)
    model = method.states[1].model
    assert torch.equal(model.readout.weight, method.global_head.weight)
    assert all(torch.equal(p, encoder[n]) for n, p in model.named_parameters() if n in encoder)
    assert uploads[0].num_bytes == module_bytes(method.global_head)


def test_head_methods_need_readout_and_one_width():
    assert_refused(method_problems("lg_fedavg", model=ModelConfig(hidden=16)), "needs a linear head")
    widths = ModelConfig(readout=True, clients=[{"hidden": 8}, {"hidden": 16}])
    for name in ("lg_fedavg", "fedtgp", "fedppn"):
        assert_refused(method_problems(name, model=widths), "one embedding width")
    assert method_problems("lg_fedavg", model=ZOO, evaluation=EvalConfig(model="local")) == []


# ---- FML -------------------------------------------------------------------------------------

def test_fml_without_distillation_is_local_training_plus_fedavg_of_the_meme(sbm):
    """alpha = beta = 1: the private models train as Local, the meme models as FedAvg."""
    method = run(sbm, "fml", {"alpha": 1.0, "beta": 1.0}, model=PLAIN)
    local = run(sbm, "local", model=PLAIN)
    fedavg = run(sbm, "fedavg", model=PLAIN)
    for ours, theirs in zip(client_models(method), client_models(local)):
        assert_same_models(ours, theirs)
    assert_same_models(method.global_meme, fedavg.global_model, exact=False)


def test_fml_losses_by_hand():
    private, meme = torch.tensor([[2.0, 0.0]]), torch.tensor([[0.0, 1.0]])
    labels = torch.tensor([0])
    lp, lm = fml.mutual_losses(private, meme, labels, alpha=0.3, beta=0.6)
    p, q = F.softmax(private, 1), F.softmax(meme, 1)
    kl_qp, kl_pq = (q * (q / p).log()).sum(), (p * (p / q).log()).sum()
    assert torch.isclose(lp, 0.3 * -p[0, 0].log() + 0.7 * kl_qp)
    assert torch.isclose(lm, 0.6 * -q[0, 0].log() + 0.4 * kl_pq)


# ---- FedKD -----------------------------------------------------------------------------------

def test_svd_rank_keeps_the_requested_energy():
    assert fedkd.svd_rank(torch.tensor([3.0, 2.0, 1.0]), 0.9) == 2      # 13/14 >= 0.9 > 9/14
    assert fedkd.svd_rank(torch.tensor([3.0, 2.0, 1.0]), 1.0) == 3


@pytest.mark.parametrize("shape", [(64, 300), (300, 64), (7, 7)])
def test_thin_svd_of_wide_and_tall_matrices_is_torchs_up_to_rounding(shape):
    p = torch.randn(*shape, generator=torch.Generator().manual_seed(1))
    u, s, vh = fedkd.thin_svd(p)
    k = min(shape)
    assert (u.shape, s.shape, vh.shape) == ((shape[0], k), (k,), (k, shape[1]))
    torch.testing.assert_close(s, torch.linalg.svdvals(p))
    torch.testing.assert_close((u * s) @ vh, p, atol=1e-5, rtol=0)
    torch.testing.assert_close(u.T @ u, torch.eye(k), atol=1e-5, rtol=0)
    torch.testing.assert_close(vh @ vh.T, torch.eye(k), atol=1e-5, rtol=0)


@pytest.mark.parametrize("energy", [0.5, 0.95, 0.98])
def test_fedkd_compression_is_smaller_and_within_the_energy_threshold(energy):
    gen = torch.Generator().manual_seed(0)
    matrix = torch.randn(40, 3, generator=gen) @ torch.randn(3, 60, generator=gen) + 0.05 * torch.randn(40, 60,
                                                                                                  generator=gen)
    params = {"w": matrix, "b": torch.randn(40, generator=gen)}
    full, factors = fedkd.compress(params, energy)
    assert set(full) == {"b"} and tensor_bytes([*full.values(), *factors.values()]) < tensor_bytes(params.values())
    restored = fedkd.decompress(full, factors)
    assert torch.equal(restored["b"], params["b"])
    error = (restored["w"] - matrix).pow(2).sum() / matrix.pow(2).sum()
    assert error <= 1 - energy + 1e-5


def test_fedkd_uploads_compressed_mentee_and_server_averages_the_reconstructions(sbm):
    method = make_method(sbm, "fedkd", {"energy_start": 0.5, "energy_end": 0.5},
                         model=ModelConfig(hidden=64, readout=True, dropout=0.0,
                                           clients=[{"layers": 1}, {"layers": 2}]))
    uploads = all_clients(method, 1)
    mentee = method.states[0].modules["mentee"]
    assert all(u.extras and u.num_bytes < module_bytes(mentee) for u in uploads.values())
    method.server_update(1, uploads)
    n = torch.tensor([c.num_nodes for c in method.clients], dtype=torch.float)
    restored = [fedkd.decompress(u.params, u.extras) for u in uploads.values()]
    for name, p in method.global_mentee.named_parameters():
        assert torch.allclose(p, sum(w * r[name] for w, r in zip(n / n.sum(), restored)), atol=1e-6)
    assert method.download_bytes(0) < module_bytes(method.global_mentee)
    uncompressed = make_method(sbm, "fedkd", {"compress": False}, model=ZOO)
    assert all(u.num_bytes == module_bytes(uncompressed.global_mentee) for u in all_clients(uncompressed, 1).values())


def test_fedkd_energy_grows_linearly_over_the_rounds(sbm):
    method = make_method(sbm, "fedkd", model=ZOO, rounds=4)
    assert [round(method.energy(r), 6) for r in (1, 2, 3, 4)] == [0.95, 0.96, 0.97, 0.98]


# ---- prototypes (shared by FedTGP, FedPPN) ---------------------------------------------------

def test_plain_and_weighted_prototype_averages_by_hand():
    hidden = torch.tensor([[1.0, 0.0], [3.0, 2.0], [0.0, 4.0]])
    classes, protos, counts = proto.class_prototypes(hidden, torch.tensor([0, 0, 2]), 3)
    assert classes.tolist() == [0, 2] and counts.tolist() == [2.0, 1.0]
    assert torch.equal(protos, torch.tensor([[2.0, 1.0], [0.0, 4.0]]))
    other = {"classes": torch.tensor([0, 1]), "prototypes": torch.tensor([[4.0, 4.0], [1.0, 1.0]])}
    mine = {"classes": classes, "prototypes": protos}
    mean, present = proto.average_prototypes(proto.plain_mean_parts([mine, other]), 3, 2)
    assert present.tolist() == [True, True, True]
    assert torch.allclose(mean, torch.tensor([[3.0, 2.5], [1.0, 1.0], [0.0, 4.0]]))
    parts = [(classes, protos, counts), (other["classes"], other["prototypes"], torch.tensor([6.0, 1.0]))]
    weighted, _ = proto.average_prototypes(parts, 3, 2)
    assert torch.allclose(weighted[0], (2 * torch.tensor([2.0, 1.0]) + 6 * torch.tensor([4.0, 4.0])) / 8)
    _, absent = proto.average_prototypes([(other["classes"], other["prototypes"], torch.ones(2))], 3, 2)
    assert absent.tolist() == [True, True, False]


def test_prototype_alignment_loss_is_the_per_class_mse_summed():
    hidden = torch.tensor([[1.0, 1.0], [3.0, 1.0], [0.0, 2.0]])
    labels = torch.tensor([0, 0, 1])
    protos = torch.tensor([[2.0, 1.0], [0.0, 0.0]])
    expected = (0.5 + 0.5) / 2 + 2.0                     # class 0: mean of 1/2, 1/2; class 1: 4/2
    assert torch.isclose(proto.prototype_alignment_loss(hidden, labels, protos, torch.tensor([True, True])),
                         torch.tensor(expected))
    only_zero = proto.prototype_alignment_loss(hidden, labels, protos, torch.tensor([True, False]))
    assert torch.isclose(only_zero, torch.tensor(0.5))


# ---- FedTGP ----------------------------------------------------------------------------------

def test_fedtgp_without_alignment_is_local_training(sbm):
    method = run(sbm, "fedtgp", {"lam": 0.0}, model=ZOO)
    local = run(sbm, "local", model=ZOO)
    for ours, theirs in zip(client_models(method), client_models(local)):
        assert_same_models(ours, theirs)


def test_fedtgp_uploads_class_means_and_trains_separated_global_prototypes(sbm):
    method = make_method(sbm, "fedtgp", {"server_epochs": 30}, model=ZOO)
    uploads = all_clients(method, 1)
    model, client = method.states[1].model, method.clients[1]
    model.eval()
    hidden = model(client.x, client.adj, return_hidden=True)[0].detach()
    for c, row in zip(uploads[1].extras["classes"].tolist(), uploads[1].extras["prototypes"]):
        nodes = client.train_mask & (client.y == c)
        assert torch.allclose(row, hidden[nodes].mean(0), atol=1e-5)
    local = torch.cat([u.extras["prototypes"] for u in uploads.values()])
    labels = torch.cat([u.extras["classes"] for u in uploads.values()])
    before = proto.margin_contrastive_loss(local, labels, method.tgp().detach(), 0.0)
    method.server_update(1, uploads)
    assert proto.margin_contrastive_loss(local, labels, method.global_prototypes, 0.0) < before
    average, present = proto.average_prototypes(proto.plain_mean_parts(u.extras for u in uploads.values()), 4, 16)
    gaps = [min(float((average[i] - average[j]).norm()) for j in range(4) if j != i and present[j])
            for i in range(4) if present[i]]
    assert method.margin == pytest.approx(min(max(gaps), 100.0), rel=1e-5)


def test_fedtgp_margin_and_contrastive_loss_by_hand():
    protos = torch.tensor([[0.0, 0.0], [3.0, 4.0], [0.0, 1.0], [7.0, 7.0]])
    present = torch.tensor([True, True, True, False])
    # class-wise nearest distances: 1 (to class 2), sqrt(18) (to class 2), 1 (to class 0)
    assert fedtgp.adaptive_margin(protos, present, 100.0) == pytest.approx(18 ** 0.5)
    assert fedtgp.adaptive_margin(protos, present, 2.0) == 2.0
    assert fedtgp.adaptive_margin(protos, torch.tensor([True, False, False, False]), 7.0) == 7.0
    hidden, labels = torch.tensor([[0.0, 0.0]]), torch.tensor([0])
    centres = torch.tensor([[0.0, 0.0], [3.0, 4.0]])
    expected = -torch.log_softmax(-torch.tensor([0.0 + 1.5, 5.0]), 0)[0]
    assert torch.isclose(proto.margin_contrastive_loss(hidden, labels, centres, 1.5), expected)


# ---- FedPPN ----------------------------------------------------------------------------------

def test_prototype_propagation_is_label_propagation():
    edges = torch.tensor([[0, 1, 1, 2], [1, 0, 2, 1]])
    labels = torch.tensor([[1.0, 0.0], [0.0, 0.0], [0.0, 2.0]])
    adjacency = torch.zeros(3, 3)
    adjacency[edges[1], edges[0]] = 1.0
    expected = labels
    for _ in range(2):
        expected = 0.5 * adjacency @ expected + 0.5 * labels
    assert torch.allclose(fedppn.propagate_prototypes(labels, edges, 2, 0.5, normalize=False), expected)
    degree = adjacency.sum(1)
    normalized = adjacency / degree.sqrt().unsqueeze(1) / degree.sqrt().unsqueeze(0)
    expected = 0.3 * normalized @ labels + 0.7 * labels
    assert torch.allclose(fedppn.propagate_prototypes(labels, edges, 1, 0.3, normalize=True), expected)


def test_fedppn_loss_adds_the_prototype_and_ensemble_cross_entropies(sbm):
    method = make_method(sbm, "fedppn", model=ZOO)
    one_round(method, 1)
    prototypes, present = method.global_prototypes
    client, model = method.clients[2], method.states[2].model
    start = fedppn.initial_prototype_labels(client, prototypes, present)
    train = client.train_mask
    assert torch.equal(start[train], prototypes[client.y[train]]) and not start[~train].any()
    model.train()
    value = method.local_objective(2, 2)()
    mask, y = train, client.y[train]
    logits = model(client.x, client.adj)[mask]
    propagated = fedppn.propagate_prototypes(start, client.edge_index, 2, 0.5, False)[mask]
    proto_logits = model.readout(propagated)
    expected = (F.cross_entropy(logits, y) + F.cross_entropy(proto_logits, y)
                + F.cross_entropy(0.5 * logits + 0.5 * proto_logits, y))
    assert torch.isclose(value, expected)


def test_fedppn_first_round_is_local_training(sbm):
    method = run(sbm, "fedppn", model=ZOO, rounds=1)
    local = run(sbm, "local", model=ZOO, rounds=1)
    for ours, theirs in zip(client_models(method), client_models(local)):
        assert_same_models(ours, theirs)


# ---- FIARSE ----------------------------------------------------------------------------------

def test_fiarse_threshold_keeps_the_largest_magnitudes():
    params = [torch.tensor([[0.5, -3.0], [1.0, 0.1]]), torch.tensor([-2.0, 0.2])]
    assert fiarse.importance_threshold(params, 0.5) == 1.0          # keeps -3, -2, 1
    assert fiarse.importance_threshold(params, 0.01) == 3.0         # at least one
    assert fiarse.importance_threshold(params, 1.0) == 0.1


def test_fiarse_mask_gradient_is_the_threshold_surrogate():
    weight = torch.tensor([0.5, -2.0, 0.1], requires_grad=True)
    tau = torch.tensor(0.4)
    effective = weight * fiarse._ImportanceMask.apply(weight.abs(), tau)
    effective.sum().backward()
    kept = torch.tensor([1.0, 1.0, 0.0])
    slope = 2 * tau / (weight.detach().abs() + tau) ** 2
    assert torch.equal(effective.detach(), weight.detach() * kept)
    assert torch.allclose(weight.grad, kept * (1 + weight.detach().abs() * slope))


def test_fiarse_with_full_submodels_is_fedavg_while_the_threshold_is_zero(sbm):
    """Size 1 keeps every parameter at threshold min |theta|, 0 in round 1 (zero biases):
    the surrogate slope vanishes and the round is FedAvg's; later thresholds are positive."""
    evaluation = EvalConfig(model="global")
    method = run(sbm, "fiarse", {"sizes": [1.0]}, model=PLAIN, evaluation=evaluation, rounds=1)
    fedavg = run(sbm, "fedavg", model=PLAIN, evaluation=evaluation, rounds=1)
    assert_same_models(method.global_model, fedavg.global_model, exact=False)
    smallest = min(float(p.abs().min()) for p in method.global_model.parameters())
    assert float(method.states[0].received.threshold) == smallest > 0


def test_fiarse_budgets_follow_the_architectures_and_updates_stay_in_the_submodels(sbm):
    method = make_method(sbm, "fiarse", model=SCALES)
    counts = [sum(p.numel() for p in m.parameters()) for m in method.federation.client_models]
    assert method.sizes == pytest.approx([c / max(counts) for c in counts])
    start = {n: p.detach().clone() for n, p in method.global_model.named_parameters()}
    uploads = all_clients(method, 1)
    held = {n: sum(method.masks[k][n] for k in uploads) for n in start}
    method.server_update(1, uploads)
    for name, p in method.global_model.named_parameters():
        assert torch.equal(p[held[name] == 0], start[name][held[name] == 0])
        assert not torch.equal(p[held[name] > 0], start[name][held[name] > 0])


def test_fiarse_refuses_architectures_that_are_not_model_scales():
    assert_refused(method_problems("fiarse", model=ModelConfig(clients=[{"arch": "appnp"}, {}])), "submodels")
    with pytest.raises(ConfigError, match=r"hparams.sizes must hold numbers in \(0, 1\], got \[0.0\]"):
        method_problems("fiarse", {"sizes": [0.0]})


# ---- FGSSL -----------------------------------------------------------------------------------

def test_fgssl_without_its_terms_is_fedavg(sbm):
    evaluation = EvalConfig(model="global")
    method = run(sbm, "fgssl", {"structure_weight": 0.0}, model=PLAIN, evaluation=evaluation)
    fedavg = run(sbm, "fedavg", model=PLAIN, evaluation=evaluation)
    assert_same_models(method.global_model, fedavg.global_model, exact=False)


def test_edge_distribution_kl_by_hand():
    edges = torch.tensor([[0, 1], [1, 2]])
    teacher = torch.tensor([[0.0, 0.0], [1.0, 0.0], [1.0, 2.0]])
    assert fgssl.edge_distribution_kl(teacher, teacher, edges, 0.1) == 0.0
    local = torch.tensor([[0.0, 0.0], [0.0, 1.0], [0.0, 1.0]])
    tau = 0.5
    p_teacher = F.softmax(torch.tensor([[1.0, 0.0], [0.0, 2.0]]) / tau, 1)
    p_local = F.softmax(torch.tensor([[0.0, 1.0], [0.0, 0.0]]) / tau, 1)
    expected = (p_teacher * (p_teacher / p_local).log()).sum() / 2
    assert torch.isclose(fgssl.edge_distribution_kl(local, teacher, edges, tau), expected)


def test_semantic_contrast_by_hand():
    local = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    teacher = torch.tensor([[1.0, 0.0], [1.0, 1.0]])
    labels = torch.tensor([0, 1])
    sims = torch.tensor([[1.0, 2 ** -0.5], [0.0, 2 ** -0.5]]) / 0.5
    expected = -(torch.log_softmax(sims[0], 0)[0] + torch.log_softmax(sims[1], 0)[1]) / 2
    assert torch.isclose(fgssl.semantic_contrast(local, teacher, labels, 0.5), expected)


def test_perturbed_views_drop_edges_and_feature_columns():
    client = hand_client(torch.ones(3, 4), [0, 1, 0], [[0, 1, 1, 2], [1, 0, 2, 1]], [True, True, True])
    x, adj = perturbed_view(client, 0.0, 0.0)
    assert torch.equal(x, client.x) and torch.equal(adj.to_dense(), client.adj.to_dense())
    x, adj = perturbed_view(client, 1.0, 1.0)
    assert not x.any() and torch.equal(adj.to_dense(), torch.eye(3))


# ---- AdaFGL ----------------------------------------------------------------------------------

def test_adafgl_is_fedavg_until_it_personalises_then_stops_communicating(sbm):
    evaluation = EvalConfig(model="global")
    method = make_method(sbm, "adafgl", {"fedavg_rounds": 2}, model=PLAIN, evaluation=evaluation, rounds=4)
    history = run_federation(method, 4, evaluation)
    fedavg = run(sbm, "fedavg", model=PLAIN, evaluation=evaluation, rounds=2)
    assert [r["upload_bytes"][0] > 0 for r in history.rounds] == [True, True, False, False]
    assert sum(history.rounds[-1]["download_bytes"]) == 0
    personal = method.eval_model(0, "global")
    assert isinstance(personal, adafgl.PersonalizedPropagation)
    probabilities = personal.eval()(method.clients[0].x, method.clients[0].adj)
    assert torch.allclose(probabilities.sum(1), torch.ones(method.clients[0].num_nodes))
    assert_same_models(method.global_model, fedavg.global_model, exact=False)


def test_adafgl_operators_by_hand():
    edges = torch.tensor([[0, 1, 1, 2], [1, 0, 2, 1]])
    graph = adafgl.dense_adjacency(edges, 3)
    assert torch.allclose(adafgl.r_normalized(graph, 0.5), normalized_adjacency(edges, 3).to_dense())
    assert torch.allclose(adafgl.r_normalized(graph, 1.0).sum(0), torch.ones(3))     # D^0 (A+I) D^-1
    similarity = adafgl.cosine_similarity_matrix(torch.tensor([[5.0, 0.0], [5.0, 0.0], [0.0, 5.0]]))
    assert torch.equal(similarity.diagonal(), torch.zeros(3)) and torch.allclose(similarity, similarity.T)
    assert similarity[0, 1] == pytest.approx(1.0) and similarity[0, 2] < 0.9
    # one class on a connected path: the seeds' label reaches every held-out node; without
    # edges the held-out nodes stay uniform and argmax picks class 0
    labels, train = torch.ones(6, dtype=torch.long), torch.ones(6, dtype=torch.bool)
    path = torch.tensor([[0, 1, 1, 2, 2, 3, 3, 4, 4, 5], [1, 0, 2, 1, 3, 2, 4, 3, 5, 4]])
    connected = adafgl.r_normalized(adafgl.dense_adjacency(path, 6), 0.5)
    assert adafgl.reliability(labels, train, connected, 2, 10, 0.5, torch.Generator().manual_seed(0)) == 1.0
    isolated = adafgl.r_normalized(torch.zeros(6, 6), 0.5)
    assert adafgl.reliability(labels, train, isolated, 2, 10, 0.5, torch.Generator().manual_seed(0)) == 0.0


def test_adafgl_needs_rounds_after_fedavg():
    assert_refused(method_problems("adafgl", {"fedavg_rounds": 3}, rounds=3), "train.rounds must be larger")
    with pytest.raises(ConfigError, match="fedavg_rounds"):
        method_problems("adafgl", {"fedavg_rounds": 0})


# ---- FedGKC's zoos ---------------------------------------------------------------------------

#: FedGKC Table 1 (client k takes architecture k mod 5) and Table 2 (model scales, JK GCNs).
DIVERGENT = ModelConfig(hidden=16, readout=True, clients=[{"arch": a} for a in ("gcn", "gat", "sage", "gin", "sgc")])
MODEL_SCALES = ModelConfig(hidden=16, readout=True, clients=[
    {"arch": "sgc", "hops": 2}, {"layers": 2}, *({"layers": n, "jk": "max"} for n in (4, 6, 8))])


@pytest.mark.parametrize("name", ["lg_fedavg", "fml", "fedkd", "fedtgp", "fedppn", "fedproto"])
@pytest.mark.parametrize("zoo", [DIVERGENT, MODEL_SCALES], ids=["divergent", "scales"])
def test_heterogeneous_baselines_run_on_fedgkc_zoos(sbm, name, zoo):
    method = run(sbm, name, model=zoo, num_clients=5, rounds=2)
    archs = {type(m).__name__ for m in client_models(method)}
    assert len(archs) >= 2


def test_fiarse_runs_on_the_model_scales_and_refuses_divergent_architectures(sbm):
    method = run(sbm, "fiarse", model=MODEL_SCALES, num_clients=5, rounds=2)
    assert len(method.global_model.convs) == 8 and method.sizes[4] == 1.0 and method.sizes[0] < method.sizes[1]
    assert_refused(method_problems("fiarse", model=DIVERGENT), r"architectures \['gat', 'gin', 'sage'\]")
