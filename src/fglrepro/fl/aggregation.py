"""Server-side aggregation helpers shared by parameter-averaging methods."""

from __future__ import annotations

from typing import Sequence

import torch
from torch import Tensor, nn

from fglrepro.fl.buffers import BufferPool

#: float64 stacks of the uploads, reused across rounds (a stack of 100 clients' Cora GCNs is 73 MB)
_STACKS = BufferPool(keep=8)


def _stacked64(states: Sequence[dict[str, Tensor]], key: str, scale: Tensor | None = None) -> Tensor:
    """``[K, ...]`` float64 stack of tensor ``key`` of the K ``states``, row ``k`` times
    ``scale[k]`` (``[K]`` float64) if given. Each row is scaled right after its copy, while it
    is in cache (the same float64 products as scaling the whole stack afterwards)."""
    first = states[0][key]
    stacked = _STACKS.empty((len(states), *first.shape), torch.float64, first.device)
    if scale is None:
        for row, state in zip(stacked, states):
            row.copy_(state[key])
    else:
        for row, state, factor in zip(stacked, states, scale.to(first.device).unbind(0)):
            row.copy_(state[key]).mul_(factor)
    return stacked


def weighted_average(states: Sequence[dict[str, Tensor]], weights: Sequence[float]) -> dict[str, Tensor]:
    """Parameter-wise average ``sum_k w_k * state_k / sum_k w_k``, accumulated in float64.

    Args:
        states: K dicts with identical keys and shapes.
        weights: K non-negative weights (e.g. client node counts n_k).
    """
    w = torch.as_tensor(weights, dtype=torch.float64)
    w = w / w.sum()
    return {key: _stacked64(states, key, w).sum(0).to(first.dtype) for key, first in states[0].items()}


def personalized_average(states: Sequence[dict[str, Tensor]], weight_matrix: Tensor) -> list[dict[str, Tensor]]:
    """One weighted average per receiver: row ``i`` of ``weight_matrix`` ``[R, K]`` weights
    the K ``states`` for receiver ``i`` (rows need not be normalised). Each parameter is
    stacked once as ``[K, P]`` and mixed for all receivers by one float64 matrix product
    ``W_norm [R, K] @ stacked [K, P]``."""
    weights = torch.as_tensor(weight_matrix, dtype=torch.float64)
    weights = weights / weights.sum(dim=1, keepdim=True)
    out: list[dict[str, Tensor]] = [{} for _ in range(len(weights))]
    for key, first in states[0].items():
        stacked = _stacked64(states, key)
        mixed = (weights.to(stacked.device) @ stacked.reshape(len(states), -1)).to(first.dtype)
        for receiver, row in zip(out, mixed):
            receiver[key] = row.view(first.shape)
    return out


def parameters_of(model: nn.Module) -> dict[str, Tensor]:
    """Detached copy of the model's trainable parameters (the uploaded payload)."""
    return {name: p.detach().clone() for name, p in model.named_parameters()}


@torch.no_grad()
def load_parameters(model: nn.Module, params: dict[str, Tensor]) -> None:
    """Copy ``params`` into ``model`` in place (keeps optimiser state bound to it)."""
    for name, p in model.named_parameters():
        if name in params:
            p.copy_(params[name])
