"""What model-heterogeneous methods ask of the client zoo.

FedGKC's baselines (LG-FedAvg, FedTGP, FedPPN, FedKD) exchange a linear head or class
prototypes of the head's input, so every client architecture must be "encoder -> common
hidden width ``d`` -> ``Linear(d, C)``": ``model.readout: true`` and one ``model.hidden``
for all clients; ``model(x, adj, return_hidden=True)`` then returns ``(hidden [n, d],
logits [n, C])`` and ``model.readout`` is the head.
"""

from __future__ import annotations

from torch import nn

from fglrepro.config import ConfigError, ModelConfig


def client_configs(model: ModelConfig) -> list[ModelConfig]:
    """The distinct client architectures: each entry of ``model.clients``, or the block itself."""
    return [model.for_client(k) for k in range(len(model.clients))] if model.clients else [model]


def require_common_head(model: ModelConfig, method: str) -> None:
    """Raise :class:`ConfigError` unless every client architecture of ``model`` has a linear
    head (``readout: true``) on one hidden width."""
    configs = client_configs(model)
    without = [f"{c.arch} (entry {i})" for i, c in enumerate(configs) if not c.readout]
    if without:
        raise ConfigError(f"method {method!r} needs a linear head on every client model: set model.readout: true "
                          f"(missing for {without})")
    widths = sorted({c.hidden for c in configs})
    if len(widths) > 1:
        raise ConfigError(f"method {method!r} needs one hidden width (the head's input) for all clients; "
                          f"model.hidden differs across model.clients: {widths}")


def linear_head(model: nn.Module) -> nn.Linear:
    """The model's linear head ``model.readout``; :class:`ConfigError` if it has none."""
    head = getattr(model, "readout", None)
    if not isinstance(head, nn.Linear):
        raise ConfigError(f"{type(model).__name__} has no linear head (readout); set model.readout: true")
    return head
