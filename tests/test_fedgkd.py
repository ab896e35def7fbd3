"""FedGKD: the properties of ../shared/docs/METHOD_NOTES.md section 1 (task relator, distilled
graph, reduction to FedAvg, communication), and its baselines FedPer and FedStar."""

from __future__ import annotations

import pytest
import torch
from helpers import all_clients, assert_refused, client_models, make_method, method_problems, one_round
from test_engine import federation

import fglrepro.methods.fedgkd.graph_distillation as distillation
import fglrepro.methods.fedgkd.task_relator as relator
from fglrepro.components.topology import degree_one_hot, structure_encoding
from fglrepro.config import ConfigError, EvalConfig, ModelConfig, from_dict
from fglrepro.fl.aggregation import parameters_of
from fglrepro.fl.loop import run_federation
from fglrepro.fl.method import Upload
from fglrepro.methods import build_method, get_method, resolve_method
from fglrepro.methods.fedavg import FedAvg
from fglrepro.methods.fedgkd import FedGKDHparams
from fglrepro.methods.fedgkd.graph_distillation import sample_edges
from fglrepro.methods.fedgkd.task_relator import (
    aggregation_weights,
    effective_collaborators,
    kernel_matrix,
    pearson_relatedness,
    relator_weights,
)
from fglrepro.methods.fedstar import DecoupledGCN

READOUT = ModelConfig(hidden=16, readout=True)
LOCAL = EvalConfig(model="local", average="unweighted")


def features(n: int = 4, rows: int = 6, cols: int = 5, seed: int = 0) -> torch.Tensor:
    return torch.randn(n, rows, cols, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("kernel,series_start", [("global", 0), ("global", 1), ("local", 1), ("square", 1)])
def test_weights_are_positive_rows_summing_to_one(kernel, series_start):
    q = relator_weights(features(), kernel, tau=0.5, tau_s=7.0, series_start=series_start)
    assert (q > 0).all()
    assert torch.allclose(q.sum(dim=1), torch.ones(4, dtype=q.dtype))


def test_relatedness_is_symmetric_with_unit_diagonal_and_matches_a_loop():
    m = features()
    r = pearson_relatedness(m)
    assert torch.equal(r, r.T) and torch.equal(r.diagonal(), torch.ones(4, dtype=r.dtype))
    expected = torch.mean(torch.stack([torch.corrcoef(torch.stack([m[0, :, k], m[2, :, k]]))[0, 1]
                                       for k in range(m.size(2))]).double())
    assert r[0, 2].item() == pytest.approx(expected.item(), abs=1e-6)


def test_pearson_of_a_constant_column_is_zero():
    m = features(n=2)
    m[0, :, 1] = 3.0  # constant column of client 0: corr(M_0[:, 1], M_1[:, 1]) is 0/0
    r = pearson_relatedness(m)
    assert torch.isfinite(r).all()
    rest = torch.stack([torch.corrcoef(torch.stack([m[0, :, k], m[1, :, k]]))[0, 1] for k in (0, 2, 3, 4)])
    assert r[0, 1].item() == pytest.approx(rest.sum().item() / 5, abs=1e-6)


def test_relabelling_clients_permutes_the_weights():
    m = features(n=5)
    perm = torch.tensor([3, 0, 4, 1, 2])
    q = relator_weights(m, "global", tau=0.5, tau_s=5.0, series_start=1)
    permuted = relator_weights(m[perm], "global", tau=0.5, tau_s=5.0, series_start=1)
    assert torch.allclose(permuted, q[perm][:, perm], atol=1e-12)


def test_tau_s_zero_gives_uniform_weights():
    q = relator_weights(features(), "global", tau=0.5, tau_s=0.0, series_start=0)
    assert torch.equal(q, torch.full((4, 4), 0.25, dtype=q.dtype))


def test_identical_task_features_give_uniform_weights():
    same = features(n=1).expand(3, -1, -1)
    for kernel in ("global", "local", "square"):
        q = relator_weights(same, kernel, tau=0.5, tau_s=9.0, series_start=1)
        assert torch.allclose(q, torch.full((3, 3), 1 / 3, dtype=q.dtype), atol=1e-12)


def test_one_client_gets_weight_one():
    assert relator_weights(features(n=1), "global", tau=0.5, tau_s=9.0, series_start=0).tolist() == [[1.0]]


def test_series_start_one_is_the_matrix_exponential_minus_identity_and_tends_to_fedavg():
    r = pearson_relatedness(features())
    full, printed = kernel_matrix(r, "global", 0.3, 0), kernel_matrix(r, "global", 0.3, 1)
    assert torch.allclose(full - printed, torch.eye(4, dtype=r.dtype))
    series = sum(torch.linalg.matrix_power(0.3 * r, k) / torch.arange(1, k + 1).prod() for k in range(1, 25))
    assert torch.allclose(printed, series, atol=1e-12)
    near_zero = aggregation_weights(kernel_matrix(r, "global", 1e-9, 1), 9.0)
    assert torch.allclose(near_zero, torch.full((4, 4), 0.25, dtype=r.dtype), atol=1e-7)
    assert torch.allclose(kernel_matrix(r, "square", 0.3, 1), r @ r)


def test_straight_through_edges_are_binary_symmetric_with_gradient_to_the_features():
    x = (0.3 * torch.randn(6, 4, generator=torch.Generator().manual_seed(1))).requires_grad_(True)
    adj = sample_edges(x, gamma=0.0, tau_g=1.0, generator=torch.Generator().manual_seed(2))
    assert set(adj.detach().unique().tolist()) <= {0.0, 1.0} and 0 < adj.sum() < 30
    assert torch.equal(adj, adj.T) and torch.equal(adj.diagonal(), torch.zeros(6))
    (adj * torch.arange(36.0).view(6, 6)).sum().backward()
    assert x.grad is not None and x.grad.abs().sum() > 0


def test_huge_gamma_gives_an_empty_graph():
    x = torch.randn(8, 5, generator=torch.Generator().manual_seed(0))
    assert sample_edges(x, gamma=1e6, tau_g=1.0, generator=torch.Generator().manual_seed(0)).sum() == 0


def test_hparams_are_checked():
    with pytest.raises(ConfigError, match="kernel = 'expm' is not valid; choose one of"):
        from_dict(FedGKDHparams, {"kernel": "expm"}, "hparams")
    with pytest.raises(ConfigError, match="series_start = 2 is not valid"):
        from_dict(FedGKDHparams, {"series_start": 2}, "hparams")
    with pytest.raises(ConfigError, match="task_feature = 'xy' is not valid"):
        from_dict(FedGKDHparams, {"task_feature": "xy"}, "hparams")


class EqualWeightFedAvg(FedAvg):
    """FedAvg whose clients all weigh 1 (the plain mean of the uploads)."""

    def upload(self, k: int, round_: int, loss: float) -> Upload:
        upload = super().upload(k, round_, loss)
        upload.weight = 1.0
        return upload


def test_lambda_and_tau_s_zero_give_the_equal_weight_fedavg_trajectory(sbm):
    """Distillation draws only from the run's generator and runs without dropout, so the
    local steps see the same random numbers as FedAvg's."""
    gkd = make_method(sbm, "fedgkd", {"lambda_prox": 0.0, "tau_s": 0.0}, model=READOUT, unbalanced=True)
    gkd_history = run_federation(gkd, 3, LOCAL)
    avg = make_method(sbm, "fedavg", model=READOUT, unbalanced=True)
    avg.__class__ = EqualWeightFedAvg
    avg_history = run_federation(avg, 3, LOCAL)
    for a, b in zip(client_models(gkd), client_models(avg)):
        for p, q in zip(a.parameters(), b.parameters()):
            assert torch.allclose(p, q, atol=1e-6)
    assert [r["clients"] for r in gkd_history.rounds] == [r["clients"] for r in avg_history.rounds]
    plain = make_method(sbm, "fedgkd", {"lambda_prox": 0.0, "tau_s": 5.0}, model=READOUT, unbalanced=True)
    run_federation(plain, 3, LOCAL)
    assert not torch.allclose(client_models(plain)[0].readout.weight, client_models(gkd)[0].readout.weight)


def test_proximal_term_pulls_towards_the_personalised_model(sbm):
    loose = make_method(sbm, "fedgkd", {"lambda_prox": 0.0}, model=READOUT)
    tight = make_method(sbm, "fedgkd", {"lambda_prox": 10.0}, model=READOUT)
    gaps = []
    for method in (loose, tight):
        one_round(method, 1)
        all_clients(method, 2)
        own, personal = parameters_of(method.states[0].model), parameters_of(method.states[0].received)
        gaps.append(sum((own[n] - personal[n]).pow(2).sum().item() for n in own))
    assert gaps[1] < gaps[0]


@pytest.mark.parametrize("task_feature,width", [("xh", 8 + 16), ("x", 8), ("h", 16), ("labels", 4)])
def test_upload_bytes_are_parameters_plus_the_task_feature(sbm, task_feature, width):
    method = make_method(sbm, "fedgkd", {"nodes_per_class": 3, "task_feature": task_feature}, model=READOUT)
    uploads = one_round(method, 1)
    params = sum(p.numel() for p in method.states[0].model.parameters())
    m_c = 3 * sbm.num_classes
    assert uploads[0].extras["task_feature"].shape == (m_c, width)
    assert uploads[0].num_bytes == 4 * params + 4 * m_c * width


def test_every_client_gets_its_own_weighted_average(sbm):
    method = make_method(sbm, "fedgkd", {"tau_s": 9.0}, model=READOUT)
    uploads = one_round(method, 1)
    q = method.weights
    for i, state in enumerate(method.states):
        expected = sum(q[i, j].item() * uploads[j].params["readout.weight"] for j in range(3))
        assert torch.allclose(state.received.readout.weight, expected, atol=1e-6)
    assert len({id(s.received) for s in method.states}) == 3


def test_effective_collaborators_count_uniform_rows_as_all_clients_and_one_hot_rows_as_one():
    assert torch.allclose(effective_collaborators(torch.full((4, 4), 0.25)), torch.full((4,), 4.0))
    assert torch.equal(effective_collaborators(torch.eye(3)), torch.ones(3))
    spread = effective_collaborators(relator_weights(features(), "global", tau=0.5, tau_s=7.0, series_start=1))
    assert torch.all((spread > 1) & (spread < 4))


@pytest.mark.parametrize("tau_s, level, spread", [(0.0, "INFO", "3.00 of 3"), (1e4, "WARNING", "1.00 of 3")])
def test_first_round_reports_how_far_the_personalised_weights_spread(sbm, caplog, tau_s, level, spread):
    # a huge tau_s makes eq. 9's softmax one-hot: every client would get one client's model
    method = make_method(sbm, "fedgkd", {"tau_s": tau_s}, model=READOUT)
    with caplog.at_level("INFO", logger="fglrepro.methods.fedgkd"):
        one_round(method, 1)
        one_round(method, 2)
    reports = [r for r in caplog.records if "personalised weights q spread" in r.getMessage()]
    assert len(reports) == 1 and reports[0].levelname == level and spread in reports[0].getMessage()


def test_broadcast_is_common_to_all_clients_and_fresh_every_round(sbm):
    method = make_method(sbm, "fedgkd", model=READOUT)
    one_round(method, 1)
    first = method.broadcast[0].clone()
    one_round(method, 2)
    assert not torch.equal(first, method.broadcast[0])
    static = make_method(sbm, "fedgkd", {"extractor": "static", "static_epochs": 3}, model=READOUT)
    up1, up2 = one_round(static, 1), one_round(static, 2)
    assert all("task_feature" in u.extras for u in up1.values()) and not any(u.extras for u in up2.values())
    assert static.download_bytes(0) == sum(4 * p.numel() for p in static.states[0].received.parameters())


def test_engine_reproduces_fedgkd(sbm):
    """The vectorised local steps (proximal term to each client's own W̄_i) equal the sequential ones."""
    from test_engine import max_parameter_gap, run, val_curve

    ref, ref_history = run(sbm, "fedgkd", {"tau_s": 9.0}, readout=True)
    vec, vec_history = run(sbm, "fedgkd", {"tau_s": 9.0}, readout=True, engine="sequential")
    assert max_parameter_gap(ref, vec) < 1e-5
    assert val_curve(vec_history) == pytest.approx(val_curve(ref_history), abs=1e-6)


# ---- FedPer -------------------------------------------------------------------------------

def test_fedper_averages_the_gcn_layers_and_keeps_each_readout(sbm):
    method = make_method(sbm, "fedper", model=READOUT, unbalanced=True)
    uploads = one_round(method, 1)
    assert all(not any(n.startswith("readout.") for n in u.params) for u in uploads.values())
    all_clients(method, 2)  # round 2 starts from the averaged GCN layers, each client's own READOUT
    sizes = torch.tensor([float(c.num_nodes) for c in method.clients])
    expected = sum(w * uploads[k].params["convs.0.lin.weight"] for k, w in enumerate(sizes / sizes.sum()))
    assert torch.allclose(method.global_model.convs[0].lin.weight, expected, atol=1e-6)
    readouts = [s.model.readout.weight for s in method.states]
    assert not torch.allclose(readouts[0], readouts[1])
    headless = make_method(sbm, "fedper")  # without READOUT the last GCN layer is personal
    assert set(one_round(headless, 1)[0].params) == {"convs.0.lin.weight", "convs.0.bias"}
    assert_refused(method_problems("fedper", model=ModelConfig(arch="sgc")), "got model.arch 'sgc', use 'gcn'")
    assert_refused(method_problems("fedper", model=READOUT, evaluation=EvalConfig(model="global")),
                   "no global model")


def test_engine_reproduces_fedper(sbm):
    from test_engine import max_parameter_gap, run, val_curve

    ref, ref_history = run(sbm, "fedper", readout=True)
    vec, vec_history = run(sbm, "fedper", readout=True, engine="sequential")
    assert max_parameter_gap(ref, vec) < 1e-5
    assert val_curve(vec_history) == pytest.approx(val_curve(ref_history), abs=1e-6)


# ---- FedStar ------------------------------------------------------------------------------

def test_structure_encoding_is_return_probabilities_and_one_hot_degree():
    edge_index = torch.tensor([[0, 1, 1, 2, 1, 3], [1, 0, 2, 1, 3, 1]])  # a star around node 1
    assert degree_one_hot(edge_index, 5, 3).argmax(dim=1).tolist() == [1, 2, 1, 1, 0]
    enc = structure_encoding(edge_index, 5, walk_length=4, degree_dim=3)
    assert enc.shape == (5, 7) and enc[4, 0] == 1.0  # isolated node (with its self-loop) returns surely
    assert enc[0, 0].item() == pytest.approx(0.5)  # leaf: 1 self-loop out of degree 2 (with the loop)


def test_fedstar_shares_only_the_structure_channel(sbm):
    method = make_method(sbm, "fedstar", {"walk_length": 4, "degree_dim": 4}, model=READOUT)
    assert all(c.x.size(1) == sbm.num_features + 8 for c in method.clients)
    assert isinstance(method.states[0].model, DecoupledGCN)
    uploads = one_round(method, 1)
    assert set(uploads[0].params) == {n for n, _ in method.states[0].model.named_parameters()
                                      if n.split(".")[0] in ("embedding_s", "convs_s")}
    for k in range(3):
        method.receive(k, 2)  # round 2 starts from the averaged structure channel, the rest private
    a, b = method.states[0].model, method.states[1].model
    assert torch.equal(a.embedding_s.weight, b.embedding_s.weight)
    assert torch.equal(a.convs_s[1].lin.weight, method.global_model.convs_s[1].lin.weight)
    assert not torch.allclose(a.readout.weight, b.readout.weight)
    assert not torch.allclose(a.convs[0].lin.weight, b.convs[0].lin.weight)
    history = run_federation(make_method(sbm, "fedstar", model=READOUT), 3, LOCAL)
    assert history.rounds[-1]["train_loss"] < history.rounds[0]["train_loss"]
    assert get_method("fedstar").capabilities(get_method("fedstar").Hparams()).global_model is False


# ---- numerical robustness (issue 31 item 3) -------------------------------------------------

class LastBitLogSoftmax:
    """``torch.nn.functional`` with ``log_softmax`` off in the last bit of most entries, as the
    AVX2 and AVX-512 kernels of the same torch build differ: what another machine computes."""

    def __getattr__(self, name):
        return getattr(torch.nn.functional, name)

    @staticmethod
    def log_softmax(x, dim):
        out = torch.nn.functional.log_softmax(x, dim)
        return out * (1 + torch.finfo(out.dtype).eps)


@pytest.mark.parametrize("batched", [False, True])
def test_last_bit_differences_in_the_distillation_do_not_reach_the_models(sbm, monkeypatch, batched):
    """Three rounds with the distillation's log_softmax off in the last bit (emulated machine
    difference) upload the same task features, get the same q and the same models as the plain
    run, bit for bit: the float64 distillation and the rounded R and q absorb it (in float32
    without rounding, q and the models differed from the first round on)."""
    def run(perturbed: bool):
        if perturbed:
            monkeypatch.setattr(distillation, "F", LastBitLogSoftmax())
        fed = federation(sbm, clients=4, readout=True, engine="sequential" if batched else None)
        method = build_method(resolve_method("fedgkd", {"tau_s": 9.0, "nodes_per_class": 3}), fed)
        assert method.batched_distillation == batched
        features, weights = [], []
        for round_ in (1, 2, 3):
            uploads = one_round(method, round_)
            features.append([uploads[k].extras["task_feature"] for k in sorted(uploads)])
            weights.append(method.weights.clone())
        return features, weights, [parameters_of(s.received) for s in method.states]

    plain, perturbed = run(False), run(True)
    for round_features, other in zip(plain[0], perturbed[0]):
        assert all(torch.equal(a, b) for a, b in zip(round_features, other))
    assert all(torch.equal(a, b) for a, b in zip(plain[1], perturbed[1]))
    assert all(torch.equal(a[n], b[n]) for a, b in zip(plain[2], perturbed[2]) for n in a)


@pytest.mark.parametrize("stage", ["pearson_relatedness", "kernel_matrix", "aggregation_weights"])
def test_last_bit_differences_in_the_relator_do_not_change_q(monkeypatch, stage):
    """R and q on their grids: a relator stage off in the last float64 bit (another CPU's
    reduction order or exp kernel) gives the same q, whose entries are multiples of 2^-30."""
    m = features(n=6, rows=10, cols=40, seed=3)
    q = relator_weights(m, "global", tau=0.5, tau_s=9.0, series_start=1)
    exact = getattr(relator, stage)
    monkeypatch.setattr(relator, stage, lambda *args: exact(*args) * (1 + torch.finfo(torch.float64).eps))
    assert torch.equal(relator_weights(m, "global", tau=0.5, tau_s=9.0, series_start=1), q)
    assert torch.equal(q * 2 ** 30, torch.round(q * 2 ** 30))
