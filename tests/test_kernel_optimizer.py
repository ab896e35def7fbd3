"""KernelOptimizer: torch's Adam / AdamW / SGD updates without a torch.optim.Optimizer (whose
construction imports torch._dynamo, about a second per training process); the engine's
StackedOptimizer: the same updates for clients stacked in one tensor."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from fglrepro.config import TrainConfig
from fglrepro.fl.engine import StackedOptimizer
from fglrepro.fl.kernel_optimizer import KernelOptimizer


def parameters(seed: int = 0) -> list[torch.nn.Parameter]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.nn.Parameter(torch.randn(shape, generator=gen)) for shape in [(4, 3), (3,), (2, 5)]]


def run(optimizer_of, steps: int = 6) -> list[torch.Tensor]:
    """``steps`` updates of :func:`parameters` on a fixed loss; the last parameter gets no
    gradient at odd steps (as a parameter outside a step's graph)."""
    params = parameters()
    optimizer = optimizer_of(params)
    for step in range(steps):
        optimizer.zero_grad(set_to_none=True)
        used = params if step % 2 == 0 else params[:-1]
        sum((p.sin() * (i + 1)).sum() + p.square().sum() for i, p in enumerate(used)).backward()
        optimizer.step()
    return [p.detach() for p in params]


@pytest.mark.parametrize("fused", [None, True])
@pytest.mark.parametrize("momentum", [None, 0.0, 0.9])
def test_updates_equal_torch_optimisers_bit_for_bit(fused, momentum):
    if momentum is None:
        reference = lambda ps: torch.optim.Adam(ps, lr=0.01, weight_decay=5e-4, fused=fused)  # noqa: E731
    else:
        reference = lambda ps: torch.optim.SGD(ps, lr=0.01, weight_decay=5e-4, momentum=momentum,  # noqa: E731
                                               fused=fused)
    expected = run(reference)
    got = run(lambda ps: KernelOptimizer(ps, lr=0.01, weight_decay=5e-4, momentum=momentum, fused=fused))
    assert not torch.equal(got[0], parameters()[0])
    for a, b in zip(got, expected):
        assert torch.equal(a, b)


@pytest.mark.parametrize("fused", [None, True])
def test_decoupled_updates_equal_torch_adamw_bit_for_bit(fused):
    expected = run(lambda ps: torch.optim.AdamW(ps, lr=0.01, weight_decay=5e-2, fused=fused))
    got = run(lambda ps: KernelOptimizer(ps, lr=0.01, weight_decay=5e-2, fused=fused, decoupled=True))
    coupled = run(lambda ps: KernelOptimizer(ps, lr=0.01, weight_decay=5e-2, fused=fused))
    assert not torch.equal(got[0], coupled[0])
    for a, b in zip(got, expected):
        assert torch.equal(a, b)


@pytest.mark.parametrize("decoupled", [False, True])
def test_a_step_from_gradient_tiles_equals_the_step_from_the_whole_gradient_bit_for_bit(decoupled):
    gen = torch.Generator().manual_seed(2)
    whole, tiled = (torch.nn.Parameter(torch.randn(300, 16, generator=gen)) for _ in range(2))
    with torch.no_grad():
        tiled.copy_(whole)
    start = whole.detach().clone()
    make = lambda p: KernelOptimizer([p], lr=0.01, weight_decay=5e-2, fused=True, decoupled=decoupled)  # noqa: E731
    a, b = make(whole), make(tiled)
    for _ in range(4):
        grad = torch.randn(300, 16, generator=gen)
        grad[128:256] = 0  # a tile without loss gradient: only the weight decay moves it
        whole.grad = grad
        a.step()
        b.step_tiles(tiled, ((slice(s, min(300, s + 128)), grad[s:s + 128].clone()) for s in range(0, 300, 128)))
        assert tiled.grad is None
    assert torch.equal(whole, tiled) and (whole != start).all()
    assert all(torch.equal(x, y) for x, y in zip(a.state[0], b.state[0]))


@pytest.mark.parametrize("kind", [dict(momentum=0.0, fused=True), dict(fused=None)])
def test_gradient_tiles_need_fused_adam(kind):
    p = torch.nn.Parameter(torch.zeros(3))
    optimizer = KernelOptimizer([p], lr=0.1, **kind)
    assert not optimizer.can_step_tiles
    with pytest.raises(ValueError, match="fused Adam"):
        optimizer.step_tiles(p, [(slice(0, 3), torch.ones(3))])


def test_gradient_tiles_of_a_parameter_the_optimiser_does_not_step_are_refused():
    optimizer = KernelOptimizer([torch.nn.Parameter(torch.zeros(3))], lr=0.1, fused=True)
    with pytest.raises(ValueError, match="not one this optimiser steps"):
        optimizer.step_tiles(torch.nn.Parameter(torch.zeros(3)), [(slice(0, 3), torch.ones(3))])


def test_train_optimizer_adamw_selects_decoupled_decay_and_sgd_refuses_it():
    params = parameters()
    assert KernelOptimizer.of(params, TrainConfig(optimizer="adamw")).decoupled
    assert not KernelOptimizer.of(params, TrainConfig(optimizer="adam")).decoupled
    with pytest.raises(ValueError, match="momentum must be None"):
        KernelOptimizer(params, lr=0.1, momentum=0.0, decoupled=True)


@pytest.mark.parametrize("name, reference", [("adam", torch.optim.Adam), ("adamw", torch.optim.AdamW)])
def test_stacked_optimizer_steps_each_client_as_its_own_torch_optimiser(name, reference):
    """Rows of ``[K, ...]`` stacks, stepped for a changing subset of clients: each client's
    row follows its own torch optimiser (fused kernel) bit for bit, idle clients keep theirs."""
    gen = torch.Generator().manual_seed(2)
    stacks = [torch.randn(3, 4, 2, generator=gen), torch.randn(3, 2, generator=gen)]
    config = TrainConfig(optimizer=name, lr=0.05, weight_decay=0.1)
    stacked = StackedOptimizer(stacks, 3, config)
    rows = [[s[k].clone().requires_grad_(True) for s in stacks] for k in range(3)]
    alone = [reference(r, lr=0.05, weight_decay=0.1, fused=True) for r in rows]
    for ks in ([0, 1, 2], [0, 2], [1], [0, 1, 2]):
        params = [s[ks].clone().requires_grad_(True) for s in stacks]
        grads = torch.autograd.grad(sum((p.sin() * p).sum() for p in params), params)
        stacked.step(ks, params, list(grads))
        for s, p in zip(stacks, params):
            s[ks] = p.detach()
        for k in ks:
            alone[k].zero_grad()
            sum((p.sin() * p).sum() for p in rows[k]).backward()
            alone[k].step()
    for j, s in enumerate(stacks):
        assert torch.equal(s, torch.stack([r[j].detach() for r in rows]))


def test_selected_rows_continue_as_each_row_alone():
    """Stacked rows stepped together, then some rows dropped: the kept rows' updates equal
    those of one optimiser per row (up to float rounding: the fused kernel vectorises a whole
    tensor differently from one row)."""
    gen = torch.Generator().manual_seed(1)
    start = torch.randn(3, 4, generator=gen)
    stacked = KernelOptimizer([start.clone().requires_grad_(True)], lr=0.1, fused=True)
    alone = [KernelOptimizer([row.clone().requires_grad_(True)], lr=0.1, fused=True) for row in start]
    for step in range(5):
        if step == 2:
            stacked.select_rows(torch.tensor([True, True, False]))
            alone = alone[:2]
        (param,) = stacked.params
        param.grad = torch.autograd.grad((param ** 3).sum(), param)[0]
        stacked.step()
        for opt in alone:
            (p,) = opt.params
            p.grad = torch.autograd.grad((p ** 3).sum(), p)[0]
            opt.step()
    torch.testing.assert_close(stacked.params[0], torch.stack([opt.params[0] for opt in alone]),
                               rtol=1e-6, atol=1e-7)


def test_does_not_import_dynamo():
    code = ("import sys, torch; from fglrepro.fl.kernel_optimizer import KernelOptimizer; "
            "p = torch.nn.Parameter(torch.ones(3)); o = KernelOptimizer([p], lr=0.1, fused=True); "
            "p.grad = torch.ones(3); o.step(); print('torch._dynamo' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


def test_no_training_row_imports_dynamo(cli_inputs):
    """Every row of the studies (tests/test_cuda.py's) trains without importing torch._dynamo:
    tests/dynamo_probe.py refuses the import and prints each row that asked."""
    probe = Path(__file__).with_name("dynamo_probe.py")
    out = subprocess.run([sys.executable, str(probe), str(cli_inputs)], capture_output=True, text=True,
                         check=True).stdout
    assert out == ""
