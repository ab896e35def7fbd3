"""Properties of the round loop, aggregation, metrics and the Local / FedAvg / FedProx methods."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from sklearn.metrics import accuracy_score, f1_score

from fglrepro.config import ConfigError, EvalConfig, ModelConfig, TrainConfig, from_dict
from fglrepro.fl.aggregation import weighted_average
from fglrepro.fl.clients import build_clients
from fglrepro.fl.loop import run_federation
from fglrepro.fl.method import Federation, require_global_model
from fglrepro.methods import get_method
from fglrepro.metrics import accuracy, macro_f1
from fglrepro.models import build_model
from fglrepro.partition.build import PartitionSpec, build_partition

SPEC = PartitionSpec("metis", "stratified", 0.4, 0.3)


def make_method(data, name, hparams=None, rounds=3, epochs=2, seed=0, model=None):
    torch.manual_seed(seed)
    part = build_partition(data, SPEC, 3, seed=seed)
    clients = build_clients(data, part, torch.device("cpu"))
    train = TrainConfig(rounds=rounds, local_epochs=epochs, lr=0.05)
    config = model or ModelConfig(hidden=16)
    net = build_model(config, data.num_features, data.num_classes)
    zoo = [build_model(config.for_client(k), data.num_features, data.num_classes)
           for k in range(len(clients))] if config.clients else None
    cls = get_method(name)
    fed = Federation(clients=clients, model=net, train=train, generator=torch.Generator().manual_seed(seed),
                     client_models=zoo)
    return cls(fed, from_dict(cls.Hparams, hparams, name))


def test_weighted_average_is_the_weighted_mean():
    gen = torch.Generator().manual_seed(0)
    states = [{"w": torch.randn(3, 4, generator=gen), "b": torch.randn(4, generator=gen)} for _ in range(3)]
    weights = [10.0, 30.0, 60.0]
    avg = weighted_average(states, weights)
    for key in ("w", "b"):
        expected = sum(w * s[key] for w, s in zip(weights, states)) / 100.0
        assert torch.allclose(avg[key], expected, atol=1e-6)


def test_fedavg_server_model_is_the_weighted_mean_of_uploads(sbm):
    method = make_method(sbm, "fedavg")
    uploads = {k: method.client_update(k, 1) for k in range(3)}
    method.server_update(1, uploads)
    n = np.array([c.num_nodes for c in method.clients], dtype=float)
    for name, p in method.global_model.named_parameters():
        expected = sum(w * uploads[k].tensors[name] for k, w in enumerate(n / n.sum()))
        assert torch.allclose(p, expected, atol=1e-6)


def test_fedavg_counts_one_model_up_and_down_per_sampled_client(sbm):
    method = make_method(sbm, "fedavg")
    history = run_federation(method, 2, EvalConfig())
    model_bytes = sum(p.numel() * 4 for p in method.global_model.parameters())
    assert all(r["upload_bytes"] == [model_bytes] * 3 == r["download_bytes"] for r in history.rounds)


def test_participation_samples_a_seeded_fraction_of_clients(sbm):
    def sampled(seed):
        method = make_method(sbm, "fedavg", seed=seed)
        method.federation = Federation(method.clients, method.federation.model,
                                       TrainConfig(participation=0.34), torch.Generator().manual_seed(seed))
        return [method.participants(r) for r in range(1, 6)]

    rounds = sampled(0)
    assert all(len(p) == 1 for p in rounds)
    assert sampled(0) == rounds
    assert len({tuple(p) for p in rounds}) > 1


def test_fedprox_with_zero_mu_equals_fedavg_bit_for_bit(sbm):
    evaluation = EvalConfig(model="global", average="weighted")
    avg = run_federation(make_method(sbm, "fedavg"), 3, evaluation)
    prox = run_federation(make_method(sbm, "fedprox", {"mu": 0.0}), 3, evaluation)
    assert [r["weighted"] for r in avg.rounds] == [r["weighted"] for r in prox.rounds]
    assert [r["train_loss"] for r in avg.rounds] == [r["train_loss"] for r in prox.rounds]


def test_fedprox_term_pulls_towards_global_model(sbm):
    def drift(mu):
        method = make_method(sbm, "fedprox", {"mu": mu}, epochs=20)
        start = {n: p.detach().clone() for n, p in method.global_model.named_parameters()}
        method.client_update(0, 1)
        return sum(float((p.detach() - start[n]).norm()) for n, p in method.local_models[0].named_parameters())

    assert drift(100.0) < drift(0.0)


def test_local_method_never_communicates(sbm):
    method = make_method(sbm, "local")
    before = [copy.deepcopy(m.state_dict()) for m in method.models]
    history = run_federation(method, 2, EvalConfig(model="local", average="unweighted"))
    assert all(sum(r["upload_bytes"]) == 0 and sum(r["download_bytes"]) == 0 for r in history.rounds)
    # each client trained only on its own data: models diverge from the shared init
    assert not torch.equal(method.models[0].convs[0].lin.weight, method.models[1].convs[0].lin.weight)
    assert all(not torch.equal(b["convs.0.lin.weight"], m.convs[0].lin.weight) for b, m in zip(before, method.models))


def test_local_method_rejects_global_evaluation(sbm):
    method = make_method(sbm, "local")
    with pytest.raises(ConfigError, match="evaluation.model"):
        require_global_model(method, "local", "global")


def test_best_round_and_early_stopping(sbm):
    history = run_federation(make_method(sbm, "fedavg", rounds=30), 30,
                             EvalConfig(model="global", average="weighted", patience=2))
    vals = [r["weighted"]["val_acc"] for r in history.rounds]
    assert history.best["weighted"]["val_acc"] == max(vals)
    assert history.best_index == int(np.argmax(vals))
    if history.stopped_early:
        assert len(vals) - 1 - history.best_index == 2


def test_weighted_and_unweighted_averages_are_recorded(sbm):
    history = run_federation(make_method(sbm, "fedavg"), 1, EvalConfig())
    r = history.rounds[0]
    n = np.array([c.num_nodes for c in make_method(sbm, "fedavg").clients], dtype=float)
    per = np.array([c["test_acc"] for c in r["clients"]])
    assert r["weighted"]["test_acc"] == pytest.approx(float(per @ (n / n.sum())))
    assert r["unweighted"]["test_acc"] == pytest.approx(float(per.mean()))


@pytest.mark.parametrize("seed", range(5))
def test_metrics_agree_with_scikit_learn(seed):
    gen = torch.Generator().manual_seed(seed)
    target = torch.randint(0, 5, (200,), generator=gen)
    pred = torch.where(torch.rand(200, generator=gen) < 0.6, target, torch.randint(0, 6, (200,), generator=gen))
    assert accuracy(pred, target) == pytest.approx(accuracy_score(target, pred))
    assert macro_f1(pred, target, 6) == pytest.approx(f1_score(target, pred, average="macro", zero_division=0))


def test_unknown_method_lists_valid_names():
    with pytest.raises(ConfigError, match=r"unknown method 'fedsgd'.*'fedavg'.*'fedprox'.*'local'"):
        get_method("fedsgd")


def test_unknown_hyperparameter_is_an_error():
    cls = get_method("fedprox")
    with pytest.raises(ConfigError, match=r"unknown key\(s\) \['m'\].*\['mu'\]"):
        from_dict(cls.Hparams, {"m": 0.1}, "hparams of fedprox")


def test_wrong_type_is_an_error():
    with pytest.raises(ConfigError, match="train.rounds"):
        from_dict(TrainConfig, {"rounds": "many"}, "train")


def test_readout_model_shapes(sbm):
    net = build_model(ModelConfig(hidden=8, readout=True), sbm.num_features, 4)
    clients = build_clients(sbm, build_partition(sbm, SPEC, 2, 0), torch.device("cpu"))
    assert net(clients[0].x, clients[0].adj).shape == (clients[0].num_nodes, 4)
    assert net.readout is not None


def test_early_stopping_rules():
    from fglrepro.fl.loop import EarlyStopping

    scores = [0.5, 0.6, 0.55, 0.54, 0.6, 0.59, 0.58]

    def stop_round(rule, patience):
        stopper = EarlyStopping(EvalConfig(patience=patience, stop_rule=rule))
        return next((i for i, x in enumerate(scores, 1) if stopper.should_stop(x)), None)

    assert stop_round("no_improvement", 2) == 4
    assert stop_round("no_improvement", 3) == 5  # equalling the best is no improvement
    assert stop_round("consecutive_decrease", 2) == 4
    assert stop_round("consecutive_decrease", 3) is None  # the rise at round 5 resets the count
    assert stop_round("no_improvement", None) is None
