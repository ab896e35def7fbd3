"""fGen's output layer evaluated only at the used (row, slot) pairs gives the dense layer's
numbers there: outputs, gradients, random draws, and whole FedSage+ rounds."""

from __future__ import annotations

import pytest
import torch
from helpers import make_method

from fglrepro.config import EvalConfig
from fglrepro.fl.kernel_optimizer import KernelOptimizer
from fglrepro.fl.loop import run_federation
from fglrepro.methods.fedsage_plus.neighbor_generation import NeighGen, SlotLinear, used_slots

EVAL = EvalConfig(model="global", average="weighted")


def random_layer(rows=7, hidden=6, num_pred=3, features=4, dtype=torch.float32):
    gen = torch.Generator().manual_seed(0)
    h = torch.randn(rows, hidden, generator=gen, dtype=dtype, requires_grad=True)
    weight = torch.randn(num_pred * features, hidden, generator=gen, dtype=dtype, requires_grad=True)
    bias = torch.randn(num_pred * features, generator=gen, dtype=dtype, requires_grad=True)
    used = torch.rand(rows, num_pred, generator=gen) < 0.5
    used[0] = False  # a row using no slot
    used[:, 1] = False  # a slot no row uses
    return h, weight, bias, used


def test_used_slots_are_the_first_floor_count_ones():
    count = torch.tensor([0.0, 0.9, 1.0, 2.7, 9.0])
    assert used_slots(count, 3).tolist() == [
        [False, False, False], [False, False, False], [True, False, False],
        [True, True, False], [True, True, True],
    ]


def test_slot_linear_equals_the_dense_layer_and_tanh_at_used_pairs_and_is_zero_elsewhere():
    h, weight, bias, used = random_layer()
    dense = torch.tanh(torch.nn.functional.linear(h, weight, bias)).view(h.size(0), used.size(1), -1)
    sliced = SlotLinear.apply(h, weight, bias, used)
    assert sliced.shape == dense.shape
    torch.testing.assert_close(sliced[used], dense[used])
    assert (sliced[~used] == 0).all()


@pytest.mark.parametrize("rows", [7, 40])  # few and many rows per slot
def test_slot_linear_gradients_equal_the_dense_layer_and_tanh_with_unused_pairs_masked(rows):
    h, weight, bias, used = random_layer(rows=rows)
    upstream = torch.randn(h.size(0), used.size(1), weight.size(0) // used.size(1))
    mask = used[:, :, None].float()
    dense = torch.tanh(torch.nn.functional.linear(h, weight, bias)).view_as(upstream)
    expected = torch.autograd.grad((dense * upstream * mask).sum(), (h, weight, bias))
    got = torch.autograd.grad((SlotLinear.apply(h, weight, bias, used) * upstream).sum(), (h, weight, bias))
    for g, e in zip(got, expected):
        assert g.shape == e.shape  # dense gradients, zero at unused slots
        torch.testing.assert_close(g, e)
    features = weight.size(0) // used.size(1)
    assert (got[1][features:2 * features] == 0).all() and (got[2][features:2 * features] == 0).all()


def test_slot_linear_passes_gradcheck():
    h, weight, bias, used = random_layer(rows=5, hidden=3, num_pred=2, features=2, dtype=torch.float64)
    assert torch.autograd.gradcheck(SlotLinear.apply, (h, weight, bias, used))


@pytest.mark.parametrize("features", [300, 64])  # tiles of 128, 128 and 44 rows per slot; one of 64
def test_slot_linear_stepping_its_weight_in_the_backward_pass_equals_gradient_then_step(features):
    h, weight, bias, used = random_layer(rows=30, hidden=16, num_pred=3, features=features)
    stepped = weight.detach().clone().requires_grad_(True)
    reference = KernelOptimizer([weight, bias], lr=0.01, weight_decay=5e-4, fused=True)
    tiled = KernelOptimizer([stepped, bias], lr=0.01, weight_decay=5e-4, fused=True)
    upstream = torch.randn(30, 3, features, generator=torch.Generator().manual_seed(4))
    for _ in range(3):  # slot 1 unused: weight decay alone moves its rows
        expected = torch.autograd.grad((SlotLinear.apply(h, weight, bias, used) * upstream).sum(), (h, weight, bias))
        weight.grad = expected[1]
        reference.step()
        got = torch.autograd.grad((SlotLinear.apply(h, stepped, bias, used, tiled) * upstream).sum(), (h, bias))
        assert stepped.grad is None
        assert torch.equal(got[0], expected[0]) and torch.equal(got[1], expected[2])
        assert torch.equal(stepped, weight)
    assert all(torch.equal(a, b) for a, b in zip(reference.state[0], tiled.state[0]))


def test_generating_at_used_slots_draws_the_same_noise_and_dropout():
    model = NeighGen(in_channels=6, hidden=8, latent=5, num_pred=3, dropout=0.5).train()
    z = torch.randn(10, 5)
    used = used_slots(torch.linspace(0, 4, 10), 3)

    def run(mask):
        torch.manual_seed(3)
        out = model.generate(z, mask)
        return out, torch.get_rng_state()

    sliced, state_sliced = run(used)
    dense, state_dense = run(None)
    assert torch.equal(state_sliced, state_dense)
    torch.testing.assert_close(sliced[used], dense[used])
    assert (sliced[~used] == 0).all() and (dense[~used] != 0).all()


def fedsage(sbm, engine):
    """FedSage+ with SGD (Adam's first steps move weights whose gradient is ~0 by about
    ``lr`` in a direction set by float rounding, which would hide what is compared here)
    and dGen spreading the counts over 0..3, so that rows use different numbers of slots."""
    method = make_method(sbm, "fedsage_plus", {"generator_rounds": 4, "num_pred": 3}, rounds=6, engine=engine,
                         optimizer="sgd")
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for g in method.neighgens:
            g.dgen.bias.fill_(1.5)
            g.dgen.weight.copy_(0.3 * torch.randn(g.dgen.weight.shape, generator=gen))
    return method


def test_fedsage_rounds_on_used_slots_match_the_dense_reference(sbm):
    sliced = fedsage(sbm, "auto")
    step_slots, beyond_counts = sliced.step_slots, []

    def recording_step_slots(k, region_count, in_train):
        used = step_slots(k, region_count, in_train)
        beyond_counts.append(bool((used & ~used_slots(region_count, 3)).any()))
        return used

    sliced.step_slots = recording_step_slots
    sliced_gens = list(sliced.neighgens)  # the method drops them after mending
    ours = run_federation(sliced, 6, EVAL).rounds
    dense = fedsage(sbm, "sequential")  # built after the first run: same classifier dropout draws
    dense_gens = list(dense.neighgens)
    reference = run_federation(dense, 6, EVAL).rounds
    assert sliced.only_used_slots and not dense.only_used_slots
    # some step read slots beyond this round's counts: those of the peer gradient
    assert any(beyond_counts)
    assert len(sliced_gens) == len(dense_gens) == len(sliced.clients)
    for a, b in zip(sliced_gens, dense_gens):
        for (name, p), q in zip(a.named_parameters(), b.parameters()):
            torch.testing.assert_close(p, q, rtol=1e-4, atol=1e-6, msg=name)
    for a, b in zip(sliced.clients, dense.clients):
        assert a.num_nodes == b.num_nodes
        torch.testing.assert_close(a.x, b.x, rtol=1e-4, atol=1e-5)
    for r, s in zip(ours, reference):
        assert r["train_loss"] == pytest.approx(s["train_loss"], rel=1e-4)
        for key in ("val_acc", "test_acc", "test_f1_macro"):
            assert r["weighted"][key] == pytest.approx(s["weighted"][key], abs=1e-6)


def test_a_reused_gradient_buffer_is_zero_at_slots_the_next_call_leaves_unused():
    gen = torch.Generator().manual_seed(1)
    h = torch.randn(6, 256, generator=gen, requires_grad=True)
    weight = torch.randn(2 * 512, 256, generator=gen, requires_grad=True)  # 1 MB: pooled between calls
    bias = torch.zeros(2 * 512, requires_grad=True)
    every_slot = torch.ones(6, 2, dtype=torch.bool)
    torch.autograd.grad(SlotLinear.apply(h, weight, bias, every_slot).sum(), weight)  # fills the buffer
    first_only = every_slot.clone()
    first_only[:, 1] = False
    (grad,) = torch.autograd.grad(SlotLinear.apply(h, weight, bias, first_only).sum(), weight)
    assert (grad[512:] == 0).all() and (grad[:512] != 0).any()


def test_fedsage_rounds_with_adam_are_the_same_whether_fgen_steps_in_the_backward_pass_or_after(sbm, monkeypatch):
    """The fast path with fused Adam steps fGen's output weight tile by tile in the backward
    pass (SlotLinear with the optimizer): the same runs bit for bit as the gradient then step."""
    def run():
        method = make_method(sbm, "fedsage_plus", {"generator_rounds": 3, "num_pred": 3}, rounds=4, engine="auto")
        assert method.only_used_slots and method.gen_optimizers[0].fused
        return run_federation(method, 4, EVAL).rounds, method.clients

    tiled_rounds, tiled_clients = run()
    monkeypatch.setattr(KernelOptimizer, "can_step_tiles", property(lambda self: False))
    rounds, clients = run()
    assert tiled_rounds == rounds
    assert all(torch.equal(a.x, b.x) for a, b in zip(tiled_clients, clients))
