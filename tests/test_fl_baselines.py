"""Defining rules of SCAFFOLD, FedDC and MOON on the shared round loop."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from helpers import assert_refused, client_models, make_method, method_problems, one_round, same_parameters

from fglrepro.components.control_variates import ControlVariates
from fglrepro.config import ConfigError, EvalConfig, ModelConfig
from fglrepro.fl.aggregation import parameters_of
from fglrepro.fl.loop import run_federation
from fglrepro.fl.losses import model_contrastive_loss, model_contrastive_terms

GLOBAL = EvalConfig(model="global", average="weighted")


# --- SCAFFOLD ---------------------------------------------------------------------------

def test_scaffold_with_zero_variates_and_one_step_equals_fedavg_bit_for_bit(sbm):
    def run(name, rounds, reset_variates):
        method = make_method(sbm, name, local_epochs=1)  # seeds the global RNG (dropout)
        losses = []
        for round_ in range(1, rounds + 1):
            if reset_variates:
                method.variates = ControlVariates(method.global_model, 3)
            losses.append([u.loss for u in one_round(method, round_).values()])
        return method, losses

    avg, avg_losses = run("fedavg", 3, False)
    scaffold, scaffold_losses = run("scaffold", 3, True)
    assert avg_losses == scaffold_losses
    assert same_parameters(avg.global_model, scaffold.global_model)
    # with its own (non-zero) variates from round 2 on, SCAFFOLD departs from FedAvg
    scaffold, _ = run("scaffold", 3, False)
    assert not same_parameters(avg.global_model, scaffold.global_model)


@pytest.mark.parametrize("participation", [1.0, 0.34])
def test_scaffold_variates_follow_option_ii(sbm, participation):
    method = make_method(sbm, "scaffold", participation=participation)
    steps, lr, num_clients = 2, 0.05, 3
    c_k = [{n: torch.zeros_like(p) for n, p in method.global_model.named_parameters()} for _ in range(3)]
    c = {n: torch.zeros_like(p) for n, p in method.global_model.named_parameters()}
    for round_ in (1, 2):
        x = parameters_of(method.global_model)
        uploads = one_round(method, round_)
        new_c = dict(c)
        for k, upload in uploads.items():
            y = upload.params
            expected = {n: c_k[k][n] - c[n] + (x[n] - y[n]) / (steps * lr) for n in x}
            for n in x:
                new_c[n] = new_c[n] + (expected[n] - c_k[k][n]) / num_clients
                assert torch.allclose(method.variates.clients[k][n], expected[n], rtol=1e-5, atol=1e-6)
                uploaded = upload.extras[n]
                assert torch.allclose(uploaded, expected[n] - c_k[k][n], rtol=1e-5, atol=1e-6)
            c_k[k] = expected
        c = new_c
        for n in c:
            assert torch.allclose(method.variates.server[n], c[n], rtol=1e-5, atol=1e-6)
    assert any(float(t.abs().sum()) > 0 for t in c.values())


def test_scaffold_variate_after_one_sgd_step_is_the_local_gradient(sbm):
    # option II with one plain SGD step: c_k+ = c_k - c + (g + c - c_k) = g, the local gradient at x
    method = make_method(sbm, "scaffold", model=ModelConfig(hidden=16, dropout=0.0), local_epochs=1,
                         optimizer="sgd", weight_decay=0.0)
    for round_ in (1, 2):
        grads = []
        for client in method.clients:
            method.global_model.train()
            method.global_model.zero_grad()
            logits = method.global_model(client.x, client.adj)
            F.cross_entropy(logits[client.train_mask], client.y[client.train_mask]).backward()
            grads.append({n: p.grad.clone() for n, p in method.global_model.named_parameters()})
        method.global_model.zero_grad(set_to_none=True)
        one_round(method, round_)
        for k, grad in enumerate(grads):
            for n, g in grad.items():
                assert torch.allclose(method.variates.clients[k][n], g, atol=1e-4), (round_, k, n)


def test_scaffold_sends_model_and_variate_both_ways(sbm):
    method = make_method(sbm, "scaffold")
    history = run_federation(method, 2, GLOBAL)
    model_bytes = sum(p.numel() * 4 for p in method.global_model.parameters())
    assert all(r["upload_bytes"] == [2 * model_bytes] * 3 == r["download_bytes"] for r in history.rounds)


@pytest.mark.parametrize("name", ["scaffold", "feddc"])
def test_variate_methods_need_a_local_step(sbm, name):
    assert_refused(method_problems(name, local_epochs=0), rf"{name} needs train.local_epochs >= 1")
    assert method_problems(name, local_epochs=1) == []
    with pytest.raises(ConfigError, match="local_epochs"):
        make_method(sbm, name, local_epochs=0)


# --- MOON -------------------------------------------------------------------------------

def test_moon_with_zero_mu_equals_fedavg_bit_for_bit(sbm):
    avg_method = make_method(sbm, "fedavg")  # each make_method re-seeds the dropout RNG
    avg = run_federation(avg_method, 3, GLOBAL)
    moon_method = make_method(sbm, "moon", {"mu": 0.0})
    moon = run_federation(moon_method, 3, GLOBAL)
    assert [r["weighted"] for r in avg.rounds] == [r["weighted"] for r in moon.rounds]
    assert [r["train_loss"] for r in avg.rounds] == [r["train_loss"] for r in moon.rounds]
    assert same_parameters(avg_method.global_model, moon_method.global_model)


def test_moon_term_acts_once_a_previous_local_model_exists(sbm):
    def global_after(name, rounds, hparams=None):
        method = make_method(sbm, name, hparams)
        for round_ in range(1, rounds + 1):
            one_round(method, round_)
        return method.global_model

    assert same_parameters(global_after("fedavg", 1), global_after("moon", 1, {"mu": 5.0}))
    assert not same_parameters(global_after("fedavg", 2), global_after("moon", 2, {"mu": 5.0}))


def test_moon_loss_prefers_the_positive():
    gen = torch.Generator().manual_seed(0)
    positive, negative = torch.randn(50, 8, generator=gen), torch.randn(50, 8, generator=gen)
    at_positive = model_contrastive_loss(positive, positive, negative, 0.5)
    at_negative = model_contrastive_loss(negative, positive, negative, 0.5)
    assert at_positive < at_negative


def test_moon_loss_hand_computed():
    z = torch.tensor([[1.0, 0.0], [0.0, 2.0]])
    positive = torch.tensor([[3.0, 0.0], [0.0, 1.0]])  # cosine 1 with z
    negative = torch.tensor([[0.0, 1.0], [-1.0, 0.0]])  # cosine 0 with z
    # -log(e^{1/0.5} / (e^{1/0.5} + e^{0})) = log(1 + e^{-2}) for every node
    loss = model_contrastive_loss(z, positive, negative, 0.5)
    assert float(loss) == pytest.approx(math.log1p(math.exp(-2.0)))
    terms = model_contrastive_terms(z, positive, negative, 0.5)
    assert terms.shape == (2,)
    assert terms.tolist() == pytest.approx([math.log1p(math.exp(-2.0))] * 2)


# --- FedDC ------------------------------------------------------------------------------

def test_feddc_with_zero_alpha_trains_like_fedavg_in_round_one(sbm):
    # round 1, alpha = 0: no penalty and zero variates, so local training is FedAvg's bit
    # for bit; the drift h_k = theta_k - w is added before upload, so the server takes
    # twice FedAvg's step: w_1 = sum_k (n_k/N) (2 theta_k - w_0)
    avg = make_method(sbm, "fedavg")  # each make_method re-seeds the dropout RNG
    avg_start = parameters_of(avg.global_model)
    avg_losses = [u.loss for u in one_round(avg, 1).values()]
    dc = make_method(sbm, "feddc", {"alpha": 0.0})
    dc_losses = [u.loss for u in one_round(dc, 1).values()]
    assert avg_losses == dc_losses
    assert all(same_parameters(a, b) for a, b in zip(client_models(avg), client_models(dc)))
    for name, p in dc.global_model.named_parameters():
        fedavg_step = avg.global_model.get_parameter(name) - avg_start[name]
        assert torch.allclose(p, avg_start[name] + 2 * fedavg_step, atol=1e-6)


def test_feddc_server_model_is_weighted_mean_of_local_plus_drift(sbm):
    method = make_method(sbm, "feddc", unbalanced=True)
    n = np.array([c.num_nodes for c in method.clients], dtype=float)
    shares = n / n.sum()
    drift = [{k: torch.zeros_like(p) for k, p in method.global_model.named_parameters()} for _ in range(3)]
    for round_ in (1, 2):
        w = parameters_of(method.global_model)
        one_round(method, round_)
        local = [parameters_of(m) for m in client_models(method)]
        for k in range(3):
            for name in w:
                drift[k][name] = drift[k][name] + local[k][name] - w[name]
                assert torch.allclose(method.drifts[k][name], drift[k][name], atol=1e-6)
    for name, p in method.global_model.named_parameters():
        expected = sum(s * (local[k][name] + drift[k][name]) for k, s in enumerate(shares))
        plain_mean = sum(s * local[k][name] for k, s in enumerate(shares))
        assert torch.allclose(p, expected, atol=1e-6)
        assert not torch.allclose(p, plain_mean, atol=1e-6)
    for name, c in method.variates.server.items():
        expected = sum(s * method.variates.clients[k][name] for k, s in enumerate(shares))
        assert torch.allclose(c, expected, atol=1e-5)
        assert not torch.allclose(c, sum(method.variates.clients[k][name] for k in range(3)) / 3, atol=1e-5)


def test_feddc_local_penalty_and_gradient_correction_by_hand(sbm):
    method = make_method(sbm, "feddc", {"alpha": 0.3})
    gen = torch.Generator().manual_seed(1)
    params = dict(method.global_model.named_parameters())
    h = {n: torch.randn(p.shape, generator=gen) for n, p in params.items()}
    c = {n: torch.randn(p.shape, generator=gen) for n, p in params.items()}
    c_k = {n: torch.randn(p.shape, generator=gen) for n, p in params.items()}
    method.drifts[1], method.variates.server, method.variates.clients[1] = h, c, c_k
    theta = method.states[1].model
    with torch.no_grad():
        for p in theta.parameters():
            p.add_(torch.randn(p.shape, generator=gen))
    w = {n: p.detach() for n, p in params.items()}
    loss = method.extra_loss(1, 1)(theta)
    loss.backward()
    penalty = sum(0.15 * float((p.detach() + h[n] - w[n]).pow(2).sum()) for n, p in theta.named_parameters())
    assert loss.item() == pytest.approx(penalty, rel=1e-5)  # the correction term has value 0
    for n, p in theta.named_parameters():
        expected_grad = 0.3 * (p.detach() + h[n] - w[n]) + c[n] - c_k[n]
        assert torch.allclose(p.grad, expected_grad, atol=1e-5)
