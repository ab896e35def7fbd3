"""What model-heterogeneous methods ask of the client zoo.

FedGKC's baselines (LG-FedAvg, FedTGP, FedPPN) exchange a linear head or class prototypes
of the head's input, so every client architecture must be "encoder -> common hidden width
``d`` -> ``Linear(d, C)``": ``model.readout: true`` and one embedding width for all clients
(:func:`fglrepro.models.hidden_width`); ``model(x, adj, return_hidden=True)`` then returns
``(hidden [n, d], logits [n, C])`` and ``model.readout`` is the head.
"""

from __future__ import annotations

from torch import nn

from fglrepro.config import ConfigError, ModelConfig
from fglrepro.models import hidden_width


def require_common_head(model: ModelConfig, method: str) -> None:
    """Raise :class:`ConfigError` unless every client architecture of ``model`` has a linear
    head (``readout: true``) on one embedding width."""
    configs = model.variants()
    without = sorted({c.arch for c in configs if not c.readout})
    if without:
        raise ConfigError(f"method {method!r} needs a linear head on every client model: set model.readout: true "
                          f"(missing for arch {without})")
    widths = sorted({hidden_width(c) for c in configs})
    if len(widths) > 1:
        raise ConfigError(f"method {method!r} needs one embedding width (the head's input) on every client; "
                          f"the clients' models give {widths} (model.hidden, or model.jk: cat)")


def linear_head(model: nn.Module) -> nn.Linear:
    """The model's linear head ``model.readout``; :class:`ConfigError` if it has none."""
    head = getattr(model, "readout", None)
    if not isinstance(head, nn.Linear):
        raise ConfigError(f"{type(model).__name__} has no linear head (readout); set model.readout: true")
    return head
