"""Typed configuration blocks shared by every training run.

A study YAML gives ``model``, ``train`` and ``evaluation`` blocks plus per-method
hyperparameters; each block is parsed into a frozen dataclass here. Unknown keys are
an error that names the key and lists the valid ones, never silently ignored.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, fields
from typing import Any, Mapping, TypeVar, get_type_hints

T = TypeVar("T")


class ConfigError(ValueError):
    """A configuration value a user has to fix; the message names key and valid choices."""


def from_dict(cls: type[T], values: Mapping[str, Any] | None, where: str) -> T:
    """Build dataclass ``cls`` from ``values``, rejecting unknown keys and wrong types.

    ``where`` names the config block in error messages (e.g. ``"hparams of fedprox"``,
    ``"runs.fedavg.train"``).
    """
    if values is not None and not isinstance(values, Mapping):
        raise ConfigError(f"{where} must be a mapping of keys to values, got {values!r}")
    values = dict(values or {})
    hints = get_type_hints(cls)
    names = [f.name for f in fields(cls)]
    unknown = sorted(set(values) - set(names), key=str)
    if unknown:
        raise ConfigError(
            f"unknown key(s) {unknown} in {where}; valid keys: {names or 'none'}"
        )
    kwargs = {}
    for name, value in values.items():
        kwargs[name] = _coerce(value, hints[name], _key(where, name))
    return cls(**kwargs)


def _key(where: str, name: str) -> str:
    """Dotted name of key ``name`` of block ``where``; a block named ``"<path> of <owner>"``
    (as :func:`fglrepro.methods.resolve_method` names hparams) gives ``"<path>.<name> of <owner>"``."""
    path, sep, owner = where.partition(" of ")
    return f"{path}.{name}{sep}{owner}"


_TYPE_NAMES = {float: "a number", int: "an integer", str: "a string", bool: "true or false",
               list: "a list", dict: "a mapping"}


def _coerce(value: Any, hint: Any, key: str) -> Any:
    """``value`` checked against type ``hint`` (``X | None`` allows None; int -> float).

    An int field rejects bools and floats (``3.0`` included); a bool field rejects 0 and 1; a
    number written as a string (YAML 1.1 reads ``1e-3`` as one) gets a hint how to write it.
    """
    args = getattr(hint, "__args__", ())
    optional = type(None) in args  # Optional[X] or X | None
    if optional:
        if value is None:
            return None
        hint = next(a for a in args if a is not type(None))
    if hint is float and isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    if hint in (int, str, bool) and type(value) is hint:
        return value
    if hint in (list, dict) and isinstance(value, (list if hint is list else Mapping)):
        return value
    if hint in _TYPE_NAMES:
        expected = _TYPE_NAMES[hint] + (" or null" if optional else "")
        raise ConfigError(f"{key} must be {expected}, got {describe_value(value)}")
    return value


def describe_value(value: Any) -> str:
    """``value`` for an error message, with its type when that is the surprise: a bool, a
    float where an integer is expected, or a string holding a number (with how to write it)."""
    if isinstance(value, bool):
        return f"{value!r} (a bool)"
    if isinstance(value, float):
        return f"{value!r} (a float)"
    if isinstance(value, str):
        return f"the string {value!r}{float_string_hint(value)}"
    return repr(value)


_NUMBER = re.compile(r"^[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?$")
_EXPONENT_WITHOUT_DOT = re.compile(r"^([+-]?[0-9]+)([eE][+-]?[0-9]+)$")


def float_string_hint(value: Any) -> str:
    """For a string that holds a decimal number (else ``""``): why it is a string and how to
    write it as a number. PyYAML follows YAML 1.1, which reads ``1e-3`` (no dot) as a string."""
    if not isinstance(value, str) or not _NUMBER.match(value.strip()):
        return ""
    match = _EXPONENT_WITHOUT_DOT.match(value.strip())
    if match:
        fixed = f"{match.group(1)}.0{match.group(2)}"
        return (f"; YAML 1.1 (PyYAML) reads a number in exponent notation without a dot as a "
                f"string: write {fixed} instead of {value}")
    return f"; write the number without quotes: {value.strip()}"


def choice(value: str, valid: tuple[str, ...], key: str) -> str:
    """Return ``value`` if it is one of ``valid``, else raise a ConfigError naming both."""
    if value not in valid:
        raise ConfigError(f"{key} = {value!r} is not valid; choose one of {list(valid)}")
    return value


@dataclass(frozen=True)
class ModelConfig:
    """Backbone architecture of every client, or with ``clients`` a heterogeneous zoo.

    hops, alpha: propagation steps K and teleport/self weight of the decoupled models
        (``sgc``, ``ssgc``, ``appnp``); ``None`` takes the architecture's default.
    jk: jumping knowledge of a deep GCN (``max`` or ``cat`` over the layers' outputs before
        the readout); ``None``: none.
    clients: per-client overrides of the other keys; client k uses ``clients[k % len]``
        (O-pFGL Tables 11-12). Empty: every client uses this block.
    graphless: overrides that graphless clients take on top of that (``{arch: mlp}``: a GCN
        on clients with edges, an MLP on the others, as FedGLS's Fed-GNNMLP and FedProto).
    """

    arch: str = "gcn"
    hidden: int = 64
    layers: int = 2
    dropout: float = 0.5
    readout: bool = False
    hops: int | None = None
    alpha: float | None = None
    jk: str | None = None
    clients: list = dataclasses.field(default_factory=list)
    graphless: dict = dataclasses.field(default_factory=dict)

    @property
    def heterogeneous(self) -> bool:
        """Whether clients may get different architectures (``clients`` or ``graphless`` set)."""
        return bool(self.clients or self.graphless)

    def for_client(self, k: int, graphless: bool = False) -> "ModelConfig":
        """The configuration of client ``k``'s model (``graphless``: the client has no edges)."""
        config = self
        if self.clients:
            config = self._override(self.clients[k % len(self.clients)], f"model.clients[{k % len(self.clients)}]")
        if graphless and self.graphless:
            config = config._override(self.graphless, "model.graphless")
        return config

    def variants(self) -> list["ModelConfig"]:
        """Every distinct configuration a client can get (each ``clients`` entry, with and
        without edges)."""
        out = []
        for k in range(max(1, len(self.clients))):
            for graphless in (False, True):
                config = self.for_client(k, graphless)
                if config not in out:
                    out.append(config)
        return out

    def _override(self, values: Any, where: str) -> "ModelConfig":
        """This block without ``clients``/``graphless``, updated by the mapping ``values``."""
        nested = ("clients", "graphless")
        if not isinstance(values, Mapping) or any(key in values for key in nested):
            raise ConfigError(f"{where} must be a mapping of model keys other than {list(nested)}, got {values!r}")
        base = {f.name: getattr(self, f.name) for f in fields(self) if f.name not in nested}
        return from_dict(ModelConfig, {**base, **values}, where)


ENGINES = ("auto", "sequential", "vectorised")


@dataclass(frozen=True)
class TrainConfig:
    """Federated schedule and local optimiser."""

    rounds: int = 100
    local_epochs: int = 3
    #: ``adam`` (torch's Adam: L2 weight decay added to the gradient, then normalised with it),
    #: ``adamw`` (torch's AdamW: decay decoupled from the gradient, ``p *= 1 - lr * weight_decay``)
    #: or ``sgd`` (no momentum)
    optimizer: str = "adam"
    lr: float = 0.01
    weight_decay: float = 5e-4
    #: fraction of clients sampled (uniformly, without replacement) each round
    participation: float = 1.0
    #: ``auto``: the vectorised engine (all participants' local steps as one batched
    #: computation) when the method and model allow it, else the per-client loop, both with
    #: the fast kernels (sparse first layers, fused optimisers, batched method-specific steps;
    #: equal to the reference up to float rounding) and fast dropout masks (other random
    #: numbers, the same distribution); ``sequential``: always the per-client loop with dense
    #: kernels (the reference, bit for bit as the runs of earlier commits); ``vectorised``:
    #: the engine, an error where it cannot run.
    engine: str = "auto"

    def __post_init__(self) -> None:
        choice(self.optimizer, ("adam", "adamw", "sgd"), "train.optimizer")
        choice(self.engine, ENGINES, "train.engine")
        if self.rounds < 1 or self.local_epochs < 0:
            raise ConfigError("train.rounds must be >= 1 and train.local_epochs >= 0")
        if not 0.0 < self.participation <= 1.0:
            raise ConfigError(f"train.participation must be in (0, 1], got {self.participation}")


@dataclass(frozen=True)
class EvalConfig:
    """Which model is tested, how client metrics are averaged, and round selection.

    ``model = "global"``: after the server step, the model each client receives (the
    global model for non-personalised methods) is tested on the client's data.
    ``model = "local"``: each client's own model right after its local training.
    ``average`` picks the average (weighted by client node count, or plain mean over
    clients) that selects the best-validation round; both are always recorded.
    ``patience`` with ``stop_rule``: stop after ``patience`` rounds without a new best
    validation accuracy (``no_improvement``), or after ``patience`` consecutive rounds in
    which it decreased (``consecutive_decrease``, FedGKD's wording).
    ``dropout``: test with dropout active (the authors' code of FedTAD applies dropout
    unconditionally, also when testing). ``f1_classes``: macro-F1 over the classes ``present``
    in a client's labels or predictions (scikit-learn's default), or over ``all`` C classes,
    absent ones scoring 0 (the authors' code of O-pFGL passes ``labels=range(C)``).
    """

    model: str = "global"
    average: str = "weighted"
    patience: int | None = None
    stop_rule: str = "no_improvement"
    dropout: bool = False
    f1_classes: str = "present"

    def __post_init__(self) -> None:
        choice(self.model, ("global", "local"), "evaluation.model")
        choice(self.f1_classes, ("present", "all"), "evaluation.f1_classes")
        choice(self.average, ("weighted", "unweighted"), "evaluation.average")
        choice(self.stop_rule, ("no_improvement", "consecutive_decrease"), "evaluation.stop_rule")


def as_dict(obj: Any) -> dict[str, Any]:
    """Plain-dict view of a config dataclass (for the run JSON)."""
    return dataclasses.asdict(obj)


#: ``--config claims=...`` values that mean "no claims table" (the command line passes strings).
CLAIMS_OFF = ("", "null", "none", "None", "false", "False")


def claims_file(claims: str | None, study_dir: str, paper_dir: str, default_study_dir: str) -> str | None:
    """Path of the claims file to check, or None for no claims table.

    ``claims`` is off for ``null``/``none`` (also as command-line strings) and, when the project's own
    claims file would be checked against a user's own ``study_dir`` (the claims name the project's
    studies), it defaults to off as well.
    """
    if claims is None or claims in CLAIMS_OFF:
        return None
    from pathlib import Path

    foreign = Path(study_dir).resolve() != Path(default_study_dir).resolve()
    project_paper_dir = Path(paper_dir).resolve() == (Path(default_study_dir).parent / "paper").resolve()
    return None if foreign and project_paper_dir else str(Path(paper_dir) / claims)
