"""Weight decay under Adam on features a client never sees (FedTAD Table 2's FedProx gap,
docs/notes/fedtad.md): such a feature's first-layer weights get no cross-entropy gradient, only
the decay's (and FedProx's proximal term's). Adam normalises that gradient, so coupled L2 decay
walks them to zero by ``lr`` per step whatever ``weight_decay`` is, unless the proximal term
holds them at ``w_g * mu / (mu + weight_decay)``; AdamW's decoupled decay shrinks them by
``1 - lr * weight_decay`` per step."""

from __future__ import annotations

import pytest
import torch
from conftest import make_sbm
from helpers import make_method

from fglrepro.fl.aggregation import parameters_of
from fglrepro.fl.engine import VectorisedEngine

LR, STEPS, UNSEEN = 0.01, 20, 3
FIRST_LAYER = "convs.0.lin.weight"  # [hidden, features]


def unseen_weights(engine: str, optimizer: str, mu: float, weight_decay: float = 5e-4) -> tuple[torch.Tensor, ...]:
    """The first-layer weights of feature ``UNSEEN`` (zero at every node) in the global model
    and in client 0's model after ``STEPS`` local steps of FedProx (``[hidden]`` each)."""
    data = make_sbm()
    data.x[:, UNSEEN] = 0.0
    method = make_method(data, "fedprox", {"mu": mu}, optimizer=optimizer, lr=LR, weight_decay=weight_decay,
                         local_epochs=STEPS)
    if engine == "vectorised":
        method.federation.engine = VectorisedEngine(method.federation)
    start = parameters_of(method.global_model)[FIRST_LAYER][:, UNSEEN].clone()
    local = method.client_updates([0], 1)[0].params[FIRST_LAYER][:, UNSEEN]
    return start, local


@pytest.mark.parametrize("engine", ["sequential", "vectorised"])
@pytest.mark.parametrize("weight_decay", [5e-4, 5e-6])
def test_coupled_decay_walks_unseen_weights_to_zero_by_lr_per_step(engine, weight_decay):
    start, local = unseen_weights(engine, "adam", mu=0.0, weight_decay=weight_decay)
    far = start.abs() > STEPS * LR
    assert far.sum() >= 3 and (~far).sum() >= 3
    # a little under lr per step: the decay gradient shrinks with the weight, Adam's second
    # moment remembers its larger past values; weights that reach zero swing around it
    shrink = start[far].abs() - local[far].abs()
    assert shrink.min() >= 0.85 * STEPS * LR and shrink.max() <= STEPS * LR * (1 + 1e-5)
    assert local[~far].abs().max() <= 3 * LR


@pytest.mark.parametrize("engine", ["sequential", "vectorised"])
def test_coupled_decay_with_a_proximal_term_keeps_unseen_weights_at_its_fixed_point(engine):
    mu, weight_decay = 0.01, 5e-4
    start, local = unseen_weights(engine, "adam", mu=mu, weight_decay=weight_decay)
    assert (local - start * mu / (mu + weight_decay)).abs().max() <= LR


@pytest.mark.parametrize("engine", ["sequential", "vectorised"])
def test_decoupled_decay_shrinks_unseen_weights_geometrically(engine):
    start, local = unseen_weights(engine, "adamw", mu=0.0)
    torch.testing.assert_close(local, start * (1 - LR * 5e-4) ** STEPS, rtol=1e-6, atol=1e-7)
    start, local = unseen_weights(engine, "adamw", mu=0.01)
    assert (local - start).abs().max() <= LR
