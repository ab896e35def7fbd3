"""Loss terms shared by methods."""

from __future__ import annotations

import torch
from torch import Tensor, nn


def proximal_term(model: nn.Module, reference: dict[str, Tensor]) -> Tensor:
    """``sum ||w - w_ref||^2`` over the parameters named in ``reference`` (FedProx)."""
    total = torch.zeros((), device=next(model.parameters()).device)
    for name, p in model.named_parameters():
        if name in reference:
            total = total + (p - reference[name]).pow(2).sum()
    return total
