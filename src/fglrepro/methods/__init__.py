"""Registry of federated methods: one module per method, registered by name.

To add a method: create ``fglrepro/methods/<name>.py`` with a subclass of
:class:`fglrepro.fl.method.FederatedMethod` decorated with ``@register("<name>")``,
and add the module name to :data:`METHOD_MODULES`.
"""

from __future__ import annotations

import importlib
from typing import Callable

from fglrepro.config import ConfigError

#: Method name -> module under fglrepro.methods (one module per method).
METHOD_MODULES: dict[str, str] = {
    "local": "local",
    "fedavg": "fedavg",
    "fedprox": "fedprox",
    "scaffold": "scaffold",
    "moon": "moon",
    "feddc": "feddc",
    "gcfl_plus": "gcfl_plus",
    "fedpub": "fedpub",
    "fedsage_plus": "fedsage_plus",
    "fedgta": "fedgta",
    "fedtad": "fedtad",
    "finetune": "finetune",
    "opfgl": "opfgl",
    "dense": "dense",
    "coboost": "coboost",
}

_REGISTRY: dict[str, type] = {}


def register(name: str) -> Callable[[type], type]:
    """Class decorator adding a method under ``name``; the class gets ``name`` and ``label``."""

    def decorate(cls: type) -> type:
        cls.name = name
        _REGISTRY[name] = cls
        return cls

    return decorate


def get_method(name: str) -> type:
    """The method class registered as ``name``; an unknown name lists the valid ones."""
    if name not in METHOD_MODULES:
        raise ConfigError(f"unknown method {name!r}; valid methods: {sorted(METHOD_MODULES)}")
    importlib.import_module(f"{__name__}.{METHOD_MODULES[name]}")
    return _REGISTRY[name]


def heterogeneous_methods() -> list[str]:
    """Names of the methods that accept clients with different architectures."""
    return sorted(name for name in METHOD_MODULES if get_method(name).heterogeneous_models)
