"""Fast dropout (:func:`fglrepro.models.set_fast_dropout`) and the fused local optimisers that
come with the fast kernels: the same distribution / the same update, and off they change nothing."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from fglrepro.config import ModelConfig, TrainConfig, from_dict
from fglrepro.fl.training import make_optimizer
from fglrepro.models import build_model, dropout, fast_dropout, fast_kernels


def test_off_it_is_torch_dropout_draw_for_draw():
    x = torch.randn(50, 40)
    torch.manual_seed(3)
    expected = F.dropout(x, p=0.3, training=True)
    torch.manual_seed(3)
    with fast_dropout(False):
        assert torch.equal(dropout(x, 0.3, True), expected)


@pytest.mark.parametrize("p", [0.2, 0.5, 0.8])
def test_on_it_keeps_a_share_one_minus_p_scaled_by_its_inverse(p):
    torch.manual_seed(0)
    x = torch.rand(400, 500) + 1.0  # no zero inputs: a zero output means dropped
    with fast_dropout():
        out = dropout(x, p, True)
    kept = out != 0
    assert abs(kept.float().mean().item() - (1 - p)) < 0.01
    torch.testing.assert_close(out[kept], x[kept] / (1 - p))


def test_on_its_gradient_is_the_mask_over_the_keep_probability():
    torch.manual_seed(1)
    x = torch.randn(30, 20, requires_grad=True)
    with fast_dropout():
        out = dropout(x, 0.5, True)
    out.sum().backward()
    kept = (out != 0).float()
    torch.testing.assert_close(x.grad, kept * 2.0)


def test_on_it_draws_other_masks_than_torch_and_nothing_in_eval_or_at_p_zero():
    x = torch.ones(64, 64)
    torch.manual_seed(5)
    torch_mask = F.dropout(x, p=0.5, training=True) != 0
    torch.manual_seed(5)
    with fast_dropout():
        assert not torch.equal(dropout(x, 0.5, True) != 0, torch_mask)
        assert torch.equal(dropout(x, 0.5, False), x)
        assert torch.equal(dropout(x, 0.0, True), x)


def test_a_zoo_model_in_train_mode_uses_the_fast_masks_only_when_switched_on():
    model = build_model(from_dict(ModelConfig, {"hidden": 16, "dropout": 0.5}, "model"), 12, 3).train()
    x, adj = torch.randn(9, 12), torch.eye(9).to_sparse_csr()
    outputs = {}
    for enabled in (False, True):
        torch.manual_seed(7)
        with fast_dropout(enabled):
            outputs[enabled] = model(x, adj)
    assert not torch.allclose(outputs[False], outputs[True])
    torch.manual_seed(7)
    torch.testing.assert_close(model(x, adj), outputs[False], rtol=0, atol=0)


@pytest.mark.parametrize("optimizer", ["adam", "sgd"])
def test_local_optimisers_are_fused_with_the_fast_kernels_only(optimizer):
    config = TrainConfig(optimizer=optimizer)
    model = torch.nn.Linear(4, 2)
    assert not make_optimizer(model, config).fused
    with fast_kernels():
        assert make_optimizer(model, config).fused
        assert not make_optimizer(model, config, fused=False).fused
