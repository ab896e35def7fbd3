"""Loss terms shared by methods."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn


def proximal_term(model: nn.Module, reference: dict[str, Tensor]) -> Tensor:
    """``sum ||w - w_ref||^2`` over the parameters named in ``reference`` (FedProx)."""
    total = torch.zeros((), device=next(model.parameters()).device)
    for name, p in model.named_parameters():
        if name in reference:
            total = total + (p - reference[name]).pow(2).sum()
    return total


def model_contrastive_loss(z: Tensor, positive: Tensor, negative: Tensor, temperature: float) -> Tensor:
    """MOON's model-contrastive loss, averaged over rows (nodes).

    ``-log( e^{sim(z, z+)/tau} / (e^{sim(z, z+)/tau} + e^{sim(z, z-)/tau}) )`` with cosine
    similarity ``sim``; ``z``, ``positive``, ``negative`` are ``[n, H]`` representations
    (the local model's, the global model's, the previous local model's).
    """
    sims = torch.stack(
        [F.cosine_similarity(z, positive, dim=-1), F.cosine_similarity(z, negative, dim=-1)], dim=1,
    )
    return -F.log_softmax(sims / temperature, dim=1)[:, 0].mean()
