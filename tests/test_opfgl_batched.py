"""O-pFGL's fast path (``train.engine`` not ``sequential``) against the sequential reference:
the surrogate graph's fast generation, the clients' two stages trained batched, and the
PyG-free label propagation."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from helpers import client_models, make_method
from test_opfgl import random_statistics

from fglrepro.components.class_statistics import pool_statistics
from fglrepro.components.surrogate_graph import (
    BatchedAlignment,
    SurrogateSettings,
    UpperSmoothness,
    alignment_loss,
    build_link_predictor,
    generate_surrogate_graph,
    kink_safe_sqrt,
    smoothness_loss,
)
from fglrepro.config import ModelConfig
from fglrepro.methods.opfgl import OPFGL, label_propagation

#: Short stages with frequent checks and little patience, so that the clients stop at
#: different checks; learning rates large enough to change validation accuracy.
STAGES = {"surrogate_iterations": 30, "stage1_steps": 150, "finetune_steps": 150, "eval_every": 10,
          "patience": 2, "stage1_lr": 0.02, "finetune_lr": 0.005}


def opfgl(data, engine: str, hparams: dict | None = None) -> OPFGL:
    """O-pFGL with :data:`STAGES` on 4 clients of ``data`` under ``train.engine: engine``."""
    method = make_method(data, "opfgl", {**STAGES, **(hparams or {})}, rounds=1, engine=engine,
                         model=ModelConfig(hidden=16, dropout=0.0), num_clients=4)
    assert isinstance(method, OPFGL)
    return method


def test_label_propagation_is_pyg_bit_for_bit(sbm):
    from torch_geometric.nn import LabelPropagation

    for client in opfgl(sbm, "sequential").clients:
        seeds = F.one_hot(client.y, client.num_classes).float()
        expected = LabelPropagation(3, 0.8)(seeds, client.edge_index, mask=client.train_mask)
        expected[expected.sum(dim=1) == 0] = 1.0 / client.num_classes
        assert torch.equal(label_propagation(client, 3, 0.8), expected)


def test_factorised_predictor_scores_pairs_as_the_pair_mlp():
    torch.manual_seed(0)
    pairs = build_link_predictor("mlp", 5, 6, 8, torch.Generator())
    torch.manual_seed(0)
    factorised = build_link_predictor("mlp", 5, 6, 8, torch.Generator(), factorised=True)
    x = torch.randn(5, 6, requires_grad=True)
    expected, got = pairs(x), factorised(x)
    assert torch.allclose(got, expected, atol=1e-6)
    for a, b in zip(torch.autograd.grad(expected.sigmoid().sum(), [x, *pairs.parameters()]),
                    torch.autograd.grad(got.sigmoid().sum(), [x, *factorised.parameters()])):
        assert torch.allclose(a, b, atol=1e-6)


def test_batched_losses_equal_the_per_class_and_all_pairs_losses():
    gen = torch.Generator().manual_seed(4)
    _, parts = random_statistics(gen, [[6, 5, 0, 4], [4, 6, 0, 3]], dim=6, num_classes=4)
    target = pool_statistics(parts)
    target = type(target)(**{k: v.float() for k, v in vars(target).items()})
    labels = torch.tensor([0, 1, 1, 2, 3, 3, 3])  # class 2 absent from the target, class 1, 3 several nodes
    x = torch.randn(7, 6, generator=gen, requires_grad=True)
    expected, got = alignment_loss(x, labels, target), BatchedAlignment(labels, target)(x)
    assert torch.allclose(got, expected)
    assert torch.allclose(*(torch.autograd.grad(v, x)[0] for v in (got, expected)), atol=1e-7)
    weights = torch.rand(7, 7, generator=gen)
    weights = (weights + weights.T) * (1 - torch.eye(7))
    upper = UpperSmoothness(7)
    expected, got = smoothness_loss(x, weights), upper(x, weights)
    assert torch.allclose(got, expected)
    assert torch.allclose(*(torch.autograd.grad(v, x)[0] for v in (got, expected)), atol=1e-7)
    assert upper(x, torch.zeros(7, 7)) == 0


def test_kink_safe_sqrt_is_sqrt_bit_for_bit_above_zero_with_gradient_zero_at_it():
    value = torch.tensor([0.0, 1e-30, 0.3, 4.0, 0.0], requires_grad=True)
    plain = torch.tensor([1e-30, 0.3, 4.0], requires_grad=True)
    safe = kink_safe_sqrt(value)
    assert torch.equal(safe[1:4], plain.sqrt()) and torch.equal(safe[[0, 4]], torch.zeros(2))
    weights = torch.tensor([2.0, 3.0, -1.0, 0.5, 7.0])
    (grad,) = torch.autograd.grad((weights * safe).sum(), value)
    (plain_grad,) = torch.autograd.grad((weights[1:4] * plain.sqrt()).sum(), plain)
    assert torch.equal(grad[1:4], plain_grad) and torch.equal(grad[[0, 4]], torch.zeros(2))


def test_batched_alignment_gradient_is_the_sequential_one_where_a_classs_nodes_are_equal_in_a_dimension():
    gen = torch.Generator().manual_seed(4)
    _, parts = random_statistics(gen, [[6, 5, 4], [4, 6, 3]], dim=6, num_classes=3)
    target = pool_statistics(parts)
    target = type(target)(**{k: v.float() for k, v in vars(target).items()})
    labels = torch.tensor([0, 0, 1, 1, 2, 2])  # two nodes per class (O-pFGL Table 22)
    x = torch.randn(6, 6, generator=gen)
    x[1, 2] = x[0, 2]  # class 0's std is 0 in dimension 2: torch.std's gradient there is NaN
    x.requires_grad_(True)
    (expected,) = torch.autograd.grad(alignment_loss(x, labels, target), x)  # torch.std: gradient 0 at 0
    (got,) = torch.autograd.grad(BatchedAlignment(labels, target)(x), x)
    assert torch.isfinite(got).all() and got[0, 2] == got[1, 2]  # only the mean term moves them there
    assert torch.allclose(got, expected, atol=1e-7)


@pytest.mark.parametrize("predictor", ["mlp", "direct", "inner_product"])
def test_fast_surrogate_generation_follows_the_sequential_steps(predictor):
    gen = torch.Generator().manual_seed(3)
    _, parts = random_statistics(gen, [[6, 5, 7], [4, 6, 3]], dim=6)
    target = pool_statistics(parts)
    settings = SurrogateSettings(link_predictor=predictor, iterations=25, predictor_steps=5, feature_steps=5,
                                 hops=1, hidden=16)

    def generate(fast):
        torch.manual_seed(0)
        generator = torch.Generator().manual_seed(0)
        return generate_surrogate_graph(target, [1, 2, 2], 3, settings, generator, fast=fast)

    sequential, fast = generate(False), generate(True)
    initial = torch.randn(5, 3, generator=torch.Generator().manual_seed(0))
    assert not torch.allclose(sequential.x, initial, atol=1e-2)  # the generation moved the features
    assert torch.allclose(fast.x, sequential.x, rtol=1e-4, atol=1e-5)
    assert torch.allclose(fast.weights, sequential.weights, rtol=1e-4, atol=1e-5)


def run_round(method: OPFGL) -> None:
    """The loop's one round without the evaluation."""
    ks = method.participants(1)
    method.server_update(1, method.client_updates(ks, 1))
    for k in ks:
        method.on_download(k, 1)


@pytest.mark.parametrize("variant", ["full", "ft_focal", "global"])
def test_batched_stages_train_each_client_as_the_per_client_path(sbm, variant):
    sequential, batched = opfgl(sbm, "sequential", {"variant": variant}), opfgl(sbm, "auto", {"variant": variant})
    assert sequential.stacked is None and batched.stacked is not None
    run_round(sequential)
    # the same surrogate graph for both: only the clients' training is compared here
    ks = batched.participants(1)
    batched.client_updates(ks, 1)
    batched.surrogate = sequential.surrogate
    batched.train_batched(ks)
    initial = opfgl(sbm, "sequential").states[0].model
    ends = set()
    for seq_model, fast_model in zip(client_models(sequential), client_models(batched)):
        assert not torch.allclose(seq_model.convs[0].bias, initial.convs[0].bias, atol=1e-3)
        for a, b in zip(seq_model.parameters(), fast_model.parameters()):
            torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-5)
        ends.add(float(seq_model.convs[0].bias.detach().abs().sum()))
    assert len(ends) > 1  # clients kept different checks


def test_batched_runs_stop_clients_at_different_checks(sbm, monkeypatch):
    method = opfgl(sbm, "auto")
    sizes = []
    forward = method.stacked.forward

    def record(params, batch, training, masks=None):
        if training:
            sizes.append(batch.num_clients)
        return forward(params, batch, training, masks)

    monkeypatch.setattr(method.stacked, "forward", record)
    run_round(method)
    assert sizes[0] == len(method.clients) and len(set(sizes)) > 1 and sizes == sorted(sizes, reverse=True)


def test_sequential_engine_and_heterogeneous_clients_train_one_by_one(sbm):
    assert opfgl(sbm, "sequential").stacked is None
    hetero = make_method(sbm, "opfgl", STAGES, rounds=1, num_clients=4,
                         model=ModelConfig(hidden=16, dropout=0.0, clients=[{"hidden": 8}, {"hidden": 16}]))
    assert hetero.stacked is None
