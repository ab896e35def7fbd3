"""Registry of federated methods: one module (or package) per method, registered by name.

To add a method: create ``fglrepro/methods/<name>.py`` with a subclass of
:class:`fglrepro.fl.method.FederatedMethod` decorated with ``@register("<name>")``,
and add the module name to :data:`METHOD_MODULES`. A method with parts of its own is a package
``fglrepro/methods/<name>/``: the method in its ``__init__.py``, the parts beside it; building
blocks shared by several methods are in :mod:`fglrepro.components`.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any, Callable, Mapping

from fglrepro.config import ConfigError, from_dict
from fglrepro.fl.method import Capabilities, FederatedMethod, Federation, RunSetup, check_capabilities

#: Method name -> module (or package) under fglrepro.methods, one per method.
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
    "fedproto": "fedproto",
    # FedGLS and its graphless-client baselines
    "fedgls": "fedgls",
    "knn_graph": "knn_graph",
    "fedavg_by_arch": "fedavg_by_arch",
    # FedGKC's baselines (heterogeneous: Tables 1-2; homogeneous: Table 3)
    "lg_fedavg": "lg_fedavg",
    "fml": "fml",
    "fedkd": "fedkd",
    "fedtgp": "fedtgp",
    "fedppn": "fedppn",
    "fiarse": "fiarse",
    "fgssl": "fgssl",
    "adafgl": "adafgl",
    # FedGKC
    "fedgkc": "fedgkc",
    # FedGKD and its baselines
    "fedgkd": "fedgkd",
    "fedper": "fedper",
    "fedstar": "fedstar",
    # O-pFGL's further baselines (issue 29)
    "renode": "renode",
    "fedspray": "fedspray",
    "fedgm": "fedgm",
    "fedlog": "fedlog",
    "ghost": "ghost",
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


@dataclass(frozen=True)
class MethodSpec:
    """A method resolved from its name and hyperparameters; a wrapper holds its base's spec.

    Attributes:
        name: registry name. cls: the method class. hparams: its ``Hparams`` instance.
        base: for a wrapper (FedTAD, +ft), the spec of the method it runs around.
    """

    name: str
    cls: type
    hparams: Any
    base: "MethodSpec | None" = None

    @property
    def capabilities(self) -> Capabilities:
        if self.base is None:
            return self.cls.capabilities(self.hparams)
        return self.cls.wrap_capabilities(self.hparams, self.base.capabilities)


def resolve_method(name: str, hparams: Mapping[str, Any] | None, where: str = "hparams") -> MethodSpec:
    """The :class:`MethodSpec` of method ``name`` with ``hparams`` (a mapping; unknown keys and
    wrong types are errors naming ``where``), wrappers' bases resolved recursively."""
    from fglrepro.fl.wrapper import MethodWrapper

    cls = get_method(name)
    values = from_dict(cls.Hparams, hparams, f"{where} of {name}")
    if not issubclass(cls, MethodWrapper):
        return MethodSpec(name, cls, values)
    if values.base == name:
        raise ConfigError(f"{where}.base = {name!r} is not valid: a method cannot wrap itself")
    return MethodSpec(name, cls, values, resolve_method(values.base, values.base_hparams, f"{where}.base_hparams"))


def check_method(spec: MethodSpec, setup: RunSetup) -> list[str]:
    """Every reason why ``spec`` cannot run under ``setup`` (empty if it can): its
    capabilities against the protocol, then each level's own protocol limits."""
    try:
        problems = check_capabilities(spec.name, spec.capabilities, setup)
    except ConfigError as err:
        return [str(err)]
    if setup.model.heterogeneous and not spec.capabilities.heterogeneous:
        problems.append(f"methods that accept different architectures: {heterogeneous_methods()}, and the "
                        "wrappers fedtad and finetune around one of them")
    level: MethodSpec | None = spec
    while level is not None:
        try:
            level.cls.check_protocol(level.hparams, setup)
        except ConfigError as err:
            problems.append(str(err))
        level = level.base
    return problems


def build_method(spec: MethodSpec, federation: Federation) -> FederatedMethod:
    """Construct ``spec`` on ``federation`` (a wrapper's ``prepare`` first, then its base)."""
    if spec.base is None:
        return spec.cls(federation, spec.hparams)
    spec.cls.prepare(federation, spec.hparams)
    return spec.cls(federation, spec.hparams, build_method(spec.base, federation))
