"""Server-side aggregation helpers shared by parameter-averaging methods."""

from __future__ import annotations

from typing import Sequence

import torch
from torch import Tensor, nn


def weighted_average(states: Sequence[dict[str, Tensor]], weights: Sequence[float]) -> dict[str, Tensor]:
    """Parameter-wise average ``sum_k w_k * state_k / sum_k w_k``.

    Args:
        states: K dicts with identical keys and shapes.
        weights: K non-negative weights (e.g. client node counts n_k).
    """
    w = torch.as_tensor(weights, dtype=torch.float64)
    w = w / w.sum()
    out = {}
    for key in states[0]:
        stacked = torch.stack([s[key] for s in states]).double()
        shape = (-1,) + (1,) * (stacked.dim() - 1)
        out[key] = (w.to(stacked.device).view(shape) * stacked).sum(0).to(states[0][key].dtype)
    return out


def personalized_average(states: Sequence[dict[str, Tensor]], weight_matrix: Tensor) -> list[dict[str, Tensor]]:
    """One weighted average per receiver: row ``i`` of ``weight_matrix`` ``[R, K]`` weights
    the K ``states`` for receiver ``i`` (rows need not be normalised)."""
    return [weighted_average(states, row.tolist()) for row in weight_matrix]


def parameters_of(model: nn.Module) -> dict[str, Tensor]:
    """Detached copy of the model's trainable parameters (the uploaded payload)."""
    return {name: p.detach().clone() for name, p in model.named_parameters()}


@torch.no_grad()
def load_parameters(model: nn.Module, params: dict[str, Tensor]) -> None:
    """Copy ``params`` into ``model`` in place (keeps optimiser state bound to it)."""
    for name, p in model.named_parameters():
        if name in params:
            p.copy_(params[name])
