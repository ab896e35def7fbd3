"""Local training and evaluation of one model on one client, full batch."""

from __future__ import annotations

import copy
import math
from functools import partial
from typing import Callable, Iterable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fglrepro.config import TrainConfig
from fglrepro.fl.clients import ClientData
from fglrepro.fl.kernel_optimizer import KernelOptimizer
from fglrepro.metrics import accuracy, macro_f1
from fglrepro.models import fast_kernels_enabled


class Diverged(RuntimeError):
    """The training loss became NaN or infinite."""


def make_optimizer(model: nn.Module, config: TrainConfig, fused: bool | None = None) -> KernelOptimizer:
    """The local optimiser named by ``config.optimizer``: torch's Adam, AdamW or SGD update, bit for
    bit, without constructing a ``torch.optim.Optimizer`` (:class:`KernelOptimizer`: that
    construction imports ``torch._dynamo``, ~1 s CPU per process). ``fused`` selects torch's
    single-pass kernel (same update up to float rounding; ~3x faster per step on CPU for a
    2-layer GCN's six tensors, ~6x for tens of millions of entries such as FedSage+'s fGen);
    by default it is on with the fast kernels (:func:`fglrepro.models.set_fast_kernels`)."""
    fused = fast_kernels_enabled() if fused is None else fused
    return KernelOptimizer.of(model.parameters(), config, fused=True if fused else None)


def cross_entropy_loss(model: nn.Module, client: ClientData) -> Tensor:
    """Cross-entropy of one full-batch forward pass on the client's training nodes."""
    logits = model(client.x, client.adj)
    return F.cross_entropy(logits[client.train_mask], client.y[client.train_mask])


def check_finite(value: float) -> float:
    """``value``, or :class:`Diverged` if it is NaN or infinite."""
    if not math.isfinite(value):
        raise Diverged(f"training loss became {value}")
    return value


def train_steps(
    optimizer: KernelOptimizer, modules: Iterable[nn.Module], steps: int, objective: Callable[[], Tensor],
) -> float:
    """``steps`` full-batch steps of ``optimizer`` on ``objective()`` with ``modules`` in
    training mode.

    Returns the last step's loss; raises :class:`Diverged` if it is not finite.
    """
    for module in modules:
        module.train()
    value = float("nan")
    for _ in range(steps):
        optimizer.zero_grad(set_to_none=True)
        loss = objective()
        loss.backward()
        optimizer.step()
        value = check_finite(loss.detach().item())
    return value


def train_best_validation(
    model: nn.Module, optimizer: KernelOptimizer, client: ClientData, steps: int, patience: int,
    objective: Callable[[], Tensor] | None = None, eval_every: int = 1, start_is_candidate: bool = False,
) -> float:
    """Up to ``steps`` steps of ``objective`` (cross-entropy of ``model`` on the client's
    training nodes by default) with early stopping on the client's validation accuracy,
    checked every ``eval_every`` steps: training stops after ``patience`` checks without a
    new best, and the model is left holding the best checked state (the starting state is
    a candidate when ``start_is_candidate``).

    Used by the one-shot "+ft" fine-tuning and O-pFGL's two training stages. Returns the
    last step's loss.
    """
    objective = objective or partial(cross_entropy_loss, model, client)
    best_acc, best_state, stale, value = -1.0, None, 0, float("nan")
    if start_is_candidate:
        best_acc, best_state = validation_accuracy(model, client), copy.deepcopy(model.state_dict())
    for step in range(1, steps + 1):
        value = train_steps(optimizer, [model], 1, objective)
        if step % eval_every:
            continue
        acc = validation_accuracy(model, client)
        if acc > best_acc:
            best_acc, best_state, stale = acc, copy.deepcopy(model.state_dict()), 0
        else:
            stale += 1
            if stale >= patience:
                break
    if best_state is not None:
        model.load_state_dict(best_state)
    return value


@torch.no_grad()
def validation_accuracy(model: nn.Module, client: ClientData) -> float:
    """Accuracy on the client's validation nodes (0 without any)."""
    model.eval()
    pred = model(client.x, client.adj).argmax(dim=-1)
    return accuracy(pred[client.val_mask], client.y[client.val_mask])


@torch.no_grad()
def evaluate(model: nn.Module, client: ClientData, dropout: bool = False, all_classes: bool = False,
             ) -> dict[str, float]:
    """Accuracy and macro-F1 of ``model`` on the client's val and test nodes (with dropout
    active if ``dropout``; macro-F1 over all classes if ``all_classes``, see
    :class:`~fglrepro.config.EvalConfig`).

    Returns ``{"val_acc", "val_f1_macro", "test_acc", "test_f1_macro"}``.
    """
    model.train(dropout)
    pred = model(client.x, client.adj).argmax(dim=-1)
    out = {}
    for split, mask in (("val", client.val_mask), ("test", client.test_mask)):
        out[f"{split}_acc"] = accuracy(pred[mask], client.y[mask])
        out[f"{split}_f1_macro"] = macro_f1(pred[mask], client.y[mask], client.num_classes, all_classes)
    return out
