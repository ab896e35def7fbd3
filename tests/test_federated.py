"""Properties of the round loop, aggregation, metrics and the Local / FedAvg / FedProx methods."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from helpers import SPEC, all_clients, assert_refused, client_models, make_method, method_problems
from sklearn.metrics import accuracy_score, f1_score

from fglrepro.config import ConfigError, EvalConfig, ModelConfig, TrainConfig, from_dict
from fglrepro.fl.aggregation import personalized_average, weighted_average
from fglrepro.fl.clients import build_clients
from fglrepro.fl.loop import run_federation
from fglrepro.fl.training import Diverged, cross_entropy_loss, evaluate, make_optimizer, train_steps
from fglrepro.methods import METHOD_MODULES, get_method, resolve_method
from fglrepro.metrics import accuracy, macro_f1
from fglrepro.models import build_model
from fglrepro.partition.build import build_partition


def test_weighted_average_is_the_weighted_mean():
    gen = torch.Generator().manual_seed(0)
    states = [{"w": torch.randn(3, 4, generator=gen), "b": torch.randn(4, generator=gen)} for _ in range(3)]
    weights = [10.0, 30.0, 60.0]
    avg = weighted_average(states, weights)
    for key in ("w", "b"):
        expected = sum(w * s[key] for w, s in zip(weights, states)) / 100.0
        assert torch.allclose(avg[key], expected, atol=1e-6)


@pytest.mark.parametrize("num_clients", [3, 40])
def test_weighted_average_is_bit_for_bit_the_float64_stack_scaled_then_summed(num_clients):
    """The stored FedAvg runs were made with ``(stack64 * w / sum(w)).sum(0)`` cast back to
    float32: the average must give exactly those values (one accumulated in float32 does not)."""
    gen = torch.Generator().manual_seed(num_clients)
    states = [{"w": torch.randn(64, 33, generator=gen), "b": torch.randn(7, generator=gen)} for _ in range(num_clients)]
    weights = [float(n) for n in torch.randint(20, 300, (num_clients,), generator=gen)]
    w = torch.tensor(weights, dtype=torch.float64)
    out = weighted_average(states, weights)
    for key in ("w", "b"):
        stack = torch.stack([s[key].double() for s in states])
        reference = (stack * (w / w.sum()).view(-1, *([1] * (stack.dim() - 1)))).sum(0).float()
        assert torch.equal(out[key], reference), key


def test_personalized_average_gives_each_receiver_its_weighted_average():
    gen = torch.Generator().manual_seed(1)
    states = [{"w": torch.randn(4, 3, generator=gen), "b": torch.randn(3, generator=gen)} for _ in range(5)]
    weights = torch.rand(3, 5, generator=gen) + torch.tensor([[0.0] * 5, [0.0] * 5, [5.0, 0, 0, 0, 0]])
    weights[0] = torch.tensor([0.0, 0.0, 2.0, 0.0, 0.0])  # one-hot row: the state itself
    mixed = personalized_average(states, weights)
    assert len(mixed) == 3 and all(m["w"].shape == (4, 3) and m["w"].dtype == torch.float32 for m in mixed)
    assert torch.equal(mixed[0]["w"], states[2]["w"]) and torch.equal(mixed[0]["b"], states[2]["b"])
    for receiver, row in zip(mixed, weights):
        expected = weighted_average(states, row.tolist())  # rows need not be normalised
        for key in ("w", "b"):
            assert torch.allclose(receiver[key], expected[key], atol=1e-6)


def test_fedavg_server_model_is_the_weighted_mean_of_uploads(sbm):
    method = make_method(sbm, "fedavg")
    uploads = all_clients(method, 1)
    method.server_update(1, uploads)
    n = np.array([c.num_nodes for c in method.clients], dtype=float)
    for name, p in method.global_model.named_parameters():
        expected = sum(w * uploads[k].params[name] for k, w in enumerate(n / n.sum()))
        assert torch.allclose(p, expected, atol=1e-6)


def test_fedavg_counts_one_model_up_and_down_per_sampled_client(sbm):
    method = make_method(sbm, "fedavg")
    history = run_federation(method, 2, EvalConfig())
    model_bytes = sum(p.numel() * 4 for p in method.global_model.parameters())
    assert all(r["upload_bytes"] == [model_bytes] * 3 == r["download_bytes"] for r in history.rounds)


def test_participation_samples_a_seeded_fraction_of_clients(sbm):
    def sampled(seed):
        method = make_method(sbm, "fedavg", seed=seed, participation=0.34)
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
        method = make_method(sbm, "fedprox", {"mu": mu}, local_epochs=20)
        start = {n: p.detach().clone() for n, p in method.global_model.named_parameters()}
        method.client_update(0, 1)
        return sum(float((p.detach() - start[n]).norm()) for n, p in method.states[0].model.named_parameters())

    assert drift(100.0) < drift(0.0)


def test_local_method_never_communicates(sbm):
    method = make_method(sbm, "local")
    models = client_models(method)
    before = [copy.deepcopy(m.state_dict()) for m in models]
    history = run_federation(method, 2, EvalConfig(model="local", average="unweighted"))
    assert all(sum(r["upload_bytes"]) == 0 and sum(r["download_bytes"]) == 0 for r in history.rounds)
    # each client trained only on its own data: models diverge from the shared init
    assert not torch.equal(models[0].convs[0].lin.weight, models[1].convs[0].lin.weight)
    assert all(not torch.equal(b["convs.0.lin.weight"], m.convs[0].lin.weight) for b, m in zip(before, models))
    assert all(method.eval_model(k, "local") is m for k, m in enumerate(models))


def test_local_method_rejects_global_evaluation(sbm):
    assert_refused(method_problems("local", evaluation=EvalConfig(model="global")),
                   r"'local'.*evaluation.model")
    assert method_problems("local", evaluation=EvalConfig(model="local")) == []
    with pytest.raises(ConfigError, match=r"'local'.*evaluation.model"):
        make_method(sbm, "local", evaluation=EvalConfig(model="global"))
    # after fine-tuning every client holds a model to test at the global stage
    assert method_problems("finetune", {"base": "local"}, evaluation=EvalConfig(model="global")) == []


def test_default_eval_model_is_the_received_model_at_the_global_stage(sbm):
    avg = make_method(sbm, "fedavg")
    for k, state in enumerate(avg.states):
        assert state.received is avg.global_model
        assert avg.eval_model(k, "global") is avg.global_model and avg.eval_model(k, "local") is state.model
    local = make_method(sbm, "local")  # holds nothing from a server: its own model at both stages
    assert all(local.eval_model(k, stage) is s.model
               for k, s in enumerate(local.states) for stage in ("local", "global"))


#: What some methods need to be built on the test federation: hparams, a model with a linear head.
BUILD = {"fedsage_plus": {"hparams": {"generator_rounds": 1}}, "adafgl": {"hparams": {"fedavg_rounds": 1}},
         **{name: {"model": ModelConfig(hidden=16, readout=True)}
            for name in ("lg_fedavg", "fedtgp", "fedppn", "fedproto", "fedgkc", "fedgls")}}


def test_built_methods_declare_the_capabilities_of_their_spec(sbm):
    for name in sorted(METHOD_MODULES):
        hparams, model = BUILD.get(name, {}).get("hparams"), BUILD.get(name, {}).get("model")
        spec = resolve_method(name, hparams)
        method = make_method(sbm, name, hparams, model=model, rounds=1 if spec.capabilities.one_shot else 3)
        assert method.caps == spec.capabilities, name
    fine_tuned_local = resolve_method("finetune", {"base": "local"}).capabilities
    assert fine_tuned_local.global_model and fine_tuned_local.heterogeneous
    assert not fine_tuned_local.server_models
    assert not resolve_method("local", {}).capabilities.global_model
    personal = {"base": "dense", "base_hparams": {"student": "personal"}}
    assert resolve_method("fedtad", personal).capabilities.heterogeneous


def test_train_steps_returns_the_last_loss_and_refuses_a_non_finite_one(sbm):
    method = make_method(sbm, "local")
    state, client = method.states[0], method.clients[0]
    optimizer = make_optimizer(state.model, method.federation.train)
    losses = []

    def objective():
        losses.append(cross_entropy_loss(state.model, client))
        return losses[-1]

    state.model.eval()
    value = train_steps(optimizer, [state.model], 3, objective)
    assert len(losses) == 3 and value == losses[-1].item() and state.model.training
    assert losses[-1].item() < losses[0].item()
    with pytest.raises(Diverged):
        train_steps(optimizer, [state.model], 1, lambda: cross_entropy_loss(state.model, client) * float("nan"))


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
    with pytest.raises(ConfigError, match=r"unknown key\(s\) \['m'\] in hparams of fedprox.*\['mu'\]"):
        resolve_method("fedprox", {"m": 0.1})


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


@pytest.mark.parametrize("seed", range(3))
def test_macro_f1_over_all_classes_agrees_with_scikit_learn_labels(seed):
    gen = torch.Generator().manual_seed(seed)
    target = torch.randint(0, 4, (100,), generator=gen)
    pred = torch.where(torch.rand(100, generator=gen) < 0.7, target, torch.randint(0, 4, (100,), generator=gen))
    expected = f1_score(target, pred, labels=list(range(7)), average="macro", zero_division=0)
    assert macro_f1(pred, target, 7, all_classes=True) == pytest.approx(expected)
    assert macro_f1(pred, target, 7, all_classes=True) < macro_f1(pred, target, 7)


def test_evaluation_with_dropout_is_stochastic_and_without_is_not(sbm):
    client = build_clients(sbm, build_partition(sbm, SPEC, 4, 0), torch.device("cpu"))[0]
    model = build_model(ModelConfig(dropout=0.9), client.x.size(1), client.num_classes)
    torch.manual_seed(0)
    plain = [evaluate(model, client) for _ in range(2)]
    noisy = [tuple(evaluate(model, client, dropout=True).values()) for _ in range(5)]
    assert plain[0] == plain[1]
    assert len(set(noisy)) > 1


def test_unknown_f1_classes_is_an_error():
    with pytest.raises(ConfigError, match=r"evaluation.f1_classes.*'present'.*'all'"):
        EvalConfig(f1_classes="some")
