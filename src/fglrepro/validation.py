"""Checks of study files and the workflow config before any job runs.

Every problem is one line naming the file, the key path, the bad value and the valid
choices, e.g. ``config/studies/x.yaml: unknown key(s) ['muu'] in runs.fedprox.hparams of
fedprox; valid keys: ['mu']``; all problems are reported, not only the first.

A study is checked against its JSON schema (structure, types, enums; the schema's defaults
are filled in), then against the registries and the code: dataset names (all of them, before
``only_datasets`` drops any), client counts against node counts, the partitioner and its
options for each dataset, and for each run and each ``per_dataset`` override of a run the
method name, its hparams, the model/train/evaluation blocks and the method's protocol limits
(one-shot, local epochs, architectures, ...), and the files of reported values.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import yaml

from fglrepro.config import (
    ConfigError,
    EvalConfig,
    ModelConfig,
    TrainConfig,
    describe_value,
    from_dict,
)
from fglrepro.data.registry import DATASETS, get_dataset
from fglrepro.grid import point_entry, split_run_id
from fglrepro.io import read_yaml

#: Study blocks parsed into config dataclasses; runs may override ``model``, ``train`` and
#: (the schema allows its ``model`` key only) ``evaluation``.
BLOCKS = {"model": ModelConfig, "train": TrainConfig, "evaluation": EvalConfig}
RUN_BLOCKS = ("model", "train", "evaluation")


# ---- merging, exactly as the workflow merges (common.smk uses these) ----------------------

def merge(base: Mapping, override: Mapping) -> dict:
    """``base`` updated by ``override``, nested dicts merged key by key."""
    out = dict(base)
    for key, value in override.items():
        out[key] = merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def partition_spec(study: Mapping, dataset: str) -> dict:
    """The study's partition block with its ``per_dataset`` override for ``dataset`` applied."""
    part = dict(study["partition"])
    override = part.pop("per_dataset", {}).get(dataset, {})
    return merge(part, override)


def run_partition_spec(study: Mapping, run: str | None, dataset: str) -> dict:
    """The partition of ``run``'s jobs on ``dataset``: :func:`partition_spec` updated by the run's
    own ``partition`` block and by that of its ``per_dataset`` entry for ``dataset`` (Fed-GNN
    in a FedGLS study: ``partition: {graphless_ratio: 0}``); the table keeps its columns. With
    ``run`` None: the study's own."""
    if run is None:
        return partition_spec(study, dataset)
    entry = study["runs"][run]
    own = merge(entry.get("partition") or {}, (entry.get("per_dataset") or {}).get(dataset, {}).get("partition") or {})
    return merge(partition_spec(study, dataset), own)


def train_spec(study: Mapping, name: str, run_id: str, dataset: str, scheme: str, clients: int, seed: int) -> dict:
    """The spec ``fgl-train --spec`` reads for training run ``run_id`` (a grid point's values
    applied, then the run's ``per_dataset`` entry for ``dataset``) of study ``name`` (its parsed
    file ``study``) on one cell: the run's ``model``, ``train`` and ``evaluation`` keys over the
    study's, key by key."""
    entry = point_entry(study["runs"][split_run_id(run_id)[0]], run_id)
    entry = merge(entry, entry.get("per_dataset", {}).get(dataset, {}))
    return {
        "study": name, "run": run_id, "method": entry["method"], "hparams": entry.get("hparams", {}),
        "model": {**study.get("model", {}), **entry.get("model", {})},
        "train": {**study.get("train", {}), **entry.get("train", {})},
        "evaluation": {**study.get("evaluation", {}), **entry.get("evaluation", {})},
        "dataset": dataset, "scheme": scheme, "clients": int(clients), "seed": int(seed),
    }


# ---- problem collection ---------------------------------------------------------------------

class Problems:
    """The problems of one file: ``<file>: <key path>: <message>`` lines, each once.

    ``flagged`` holds the key paths the schema already reported, so that later checks skip
    those values instead of reporting them twice.
    """

    def __init__(self, file: str) -> None:
        self.file = file
        self.lines: list[str] = []
        self.flagged: list[str] = []

    def add(self, key: str | None, message: str) -> None:
        line = f"{self.file}: {key}: {message}" if key else f"{self.file}: {message}"
        if line not in self.lines:
            self.lines.append(line)

    def is_flagged(self, key: str) -> bool:
        """Whether the schema reported a problem at ``key`` or inside it."""
        return any(f == key or f.startswith((key + ".", key + "[")) for f in self.flagged)

    def clean(self, block: Any, *keys: str) -> tuple[Any, bool]:
        """``block`` (found at any of the key paths ``keys``) without the entries the schema
        reported, and whether any were dropped; ``(None, True)`` if the block itself was
        reported. ``None`` reads as ``{}``."""
        if block is None:
            return {}, False
        if not isinstance(block, Mapping):
            return (None, True) if any(self.is_flagged(key) for key in keys) else (block, False)
        kept = {k: v for k, v in block.items() if not any(self.is_flagged(f"{key}.{k}") for key in keys)}
        return kept, len(kept) < len(block)


def _dotted(parts: Iterable) -> str:
    out = ""
    for part in parts:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


# ---- JSON schema ------------------------------------------------------------------------------

_JSON_TYPES = {"number": "a number", "integer": "an integer", "string": "a string", "boolean": "true or false",
               "object": "a mapping", "array": "a list", "null": "null"}


def _expected(schema: Mapping) -> str:
    """What a (sub)schema accepts, in words."""
    if "const" in schema:
        return repr(schema["const"])
    if "enum" in schema:
        return f"one of {schema['enum']}"
    types = schema.get("type")
    if types:
        return " or ".join(_JSON_TYPES.get(t, t) for t in ([types] if isinstance(types, str) else types))
    return "a valid value"


def _schema_errors(error) -> list[tuple[str, str]]:
    """(key path, problem text) of one jsonschema error, in the words of :func:`from_dict`."""
    path = tuple(error.absolute_path)
    key = _dotted(path) or "the top level"
    kind, value = error.validator, error.instance
    if kind == "additionalProperties" and isinstance(value, Mapping):
        valid = list(error.schema.get("properties", {}))
        return [(_dotted((*path, extra)), f"{_dotted((*path, extra))}: unknown key; valid keys: {valid}")
                for extra in value if extra not in valid]
    if kind == "required" and isinstance(value, Mapping):
        return [(_dotted((*path, name)), f"{_dotted((*path, name))}: required key is missing")
                for name in error.validator_value if name not in value]
    if kind == "type":
        return [(key, f"{key} must be {_expected(error.schema)}, got {describe_value(value)}")]
    if kind == "enum":
        return [(key, f"{key} = {value!r} is not valid; choose one of {error.validator_value}")]
    if kind in ("oneOf", "anyOf") and error.context:
        deeper = [e for e in error.context if e.relative_path]
        if deeper:
            from jsonschema.exceptions import best_match

            return _schema_errors(best_match(deeper))
        choices = " or ".join(_expected(s) for s in error.validator_value)
        return [(key, f"{key} must be {choices}, got {describe_value(value)}")]
    return [(key, f"{key}: {error.message}")]


def schema_problems(instance: Any, schema: str | Path | Mapping, set_defaults: bool = True) -> list[tuple[str, str]]:
    """(key path, problem text) of every way ``instance`` breaks ``schema`` (a YAML/JSON file
    or a loaded schema); with ``set_defaults`` the schema's defaults are filled into ``instance``."""
    from jsonschema import Draft202012Validator, validators

    if not isinstance(schema, Mapping):
        schema = read_yaml(schema)
    validator_class = Draft202012Validator
    if set_defaults:
        check_properties = Draft202012Validator.VALIDATORS["properties"]

        def fill_defaults(validator, properties, instance, subschema):
            if isinstance(instance, dict):
                for name, sub in properties.items():
                    if "default" in sub:
                        instance.setdefault(name, copy.deepcopy(sub["default"]))
            yield from check_properties(validator, properties, instance, subschema)

        validator_class = validators.extend(Draft202012Validator, {"properties": fill_defaults})
    problems = []
    for error in validator_class(schema).iter_errors(instance):
        for problem in _schema_errors(error):
            if problem not in problems:
                problems.append(problem)
    return problems


# ---- the study checks -------------------------------------------------------------------------

def check_study(
    path: str,
    study: Any,
    num_nodes: Mapping[str, int] | None = None,
    *,
    schema: str | Path | Mapping | None = None,
    paper_dir: str | Path | None = None,
) -> list[str]:
    """Every problem of ``study`` (as read from file ``path``), one line each; empty if none.

    Args:
        num_nodes: node count per dataset (default: the registry's official counts).
        schema: the study JSON schema; when given, checked first and its defaults filled
            into ``study`` in place.
        paper_dir: folder of the ``reported`` / ``reported_partition_stats`` files (their
            existence is not checked without it).
    """
    problems = Problems(path)
    if not isinstance(study, Mapping):
        problems.add(None, f"a study file must hold a mapping of study keys, got {describe_value(study)}")
        return problems.lines
    if schema is not None:
        for key, text in schema_problems(study, schema):
            problems.add(None, text)
            problems.flagged.append(key)
    if num_nodes is None:
        num_nodes = {name: spec.num_nodes for name, spec in DATASETS.items() if spec.num_nodes}
    datasets = _check_datasets(problems, study)
    _check_clients(problems, study, datasets, num_nodes)
    _check_partition(problems, study)
    _check_data_overrides(problems, study)
    blocks = _check_study_blocks(problems, study)
    runs = study.get("runs") or {}
    if isinstance(runs, Mapping):
        for run, entry in runs.items():
            if isinstance(entry, Mapping):
                _check_run(problems, f"runs.{run}", entry, blocks)
                _check_run_partition(problems, study, run, datasets)
                _check_grid(problems, f"runs.{run}", entry, blocks)
    _check_files(problems, study, paper_dir)
    return problems.lines


def _check_datasets(problems: Problems, study: Mapping) -> list[str]:
    """Every dataset name must be in the registry; returns the names (duplicates dropped)."""
    names = study.get("datasets")
    if not isinstance(names, list) or problems.is_flagged("datasets"):
        return [d for d in names if isinstance(d, str)] if isinstance(names, list) else []
    seen: list[str] = []
    for i, name in enumerate(names):
        if not isinstance(name, str):
            continue
        if name in seen:
            problems.add(f"datasets[{i}]", f"{name!r} is listed twice")
            continue
        seen.append(name)
        try:
            get_dataset(name)
        except ConfigError as err:
            problems.add(f"datasets[{i}]", str(err))
    return seen


def _unknown_dataset(problems: Problems, key: str, dataset: Any) -> bool:
    """Report a ``per_dataset`` (or ``clients``) key that names no registered dataset. Keys of
    registered datasets the study does not use are allowed: studies share such blocks."""
    try:
        get_dataset(dataset)
    except ConfigError as err:
        problems.add(key, str(err))
        return True
    return False


def _check_clients(problems: Problems, study: Mapping, datasets: list[str], num_nodes: Mapping[str, int]) -> None:
    """A client count for every dataset, and no more clients than the dataset has nodes."""
    clients = study.get("clients")
    if problems.is_flagged("clients") and not isinstance(clients, (list, Mapping)):
        return
    if isinstance(clients, Mapping):
        missing = [d for d in datasets if d not in clients]
        if missing:
            problems.add("clients", f"no client counts for datasets {missing}; give a list for each of {datasets}")
        for dataset in clients:
            _unknown_dataset(problems, f"clients.{dataset}", dataset)
    for dataset in datasets:
        key = f"clients.{dataset}" if isinstance(clients, Mapping) else "clients"
        counts = clients.get(dataset) if isinstance(clients, Mapping) else clients
        nodes = num_nodes.get(dataset)
        if not isinstance(counts, list) or nodes is None:
            continue
        for k in counts:
            if isinstance(k, int) and not isinstance(k, bool) and k > nodes:
                problems.add(key, f"{k} clients for {dataset}, which has {nodes} nodes; use at most {nodes}")


def _partition_problems(spec: Mapping) -> list[str]:
    from fglrepro.partition.build import PartitionSpec

    try:
        PartitionSpec.from_dict(dict(spec))
    except ConfigError as err:
        return [str(err)]
    except (KeyError, TypeError, ValueError) as err:  # malformed split (the schema says how)
        return [f"malformed partition block ({type(err).__name__}: {err})"]
    return []


def _check_partition(problems: Problems, study: Mapping) -> None:
    """The partitioner, its options, the split and the graphless ratio, for each dataset."""
    part = study.get("partition")
    if not isinstance(part, Mapping):
        return
    base = {k: v for k, v in part.items() if k != "per_dataset"}
    base_bad = any(problems.is_flagged(f"partition.{k}") for k in (*base, "partitioner", "split"))
    base_problems = [] if base_bad else _partition_problems(base)
    for message in base_problems:
        problems.add("partition", message)
    overrides = part.get("per_dataset") or {}
    if not isinstance(overrides, Mapping):
        return
    for dataset, override in overrides.items():
        key = f"partition.per_dataset.{dataset}"
        if _unknown_dataset(problems, key, dataset):
            continue
        if not isinstance(override, Mapping) or base_bad or problems.is_flagged(key):
            continue
        for message in _partition_problems(merge(base, override)):
            if message not in base_problems:
                problems.add(key, message)


def _check_data_overrides(problems: Problems, study: Mapping) -> None:
    """Every key of ``data.per_dataset`` names a registered dataset (the schema checks the values)."""
    data = study.get("data")
    overrides = data.get("per_dataset") if isinstance(data, Mapping) else None
    for dataset in overrides if isinstance(overrides, Mapping) else {}:
        _unknown_dataset(problems, f"data.per_dataset.{dataset}", dataset)


def _check_run_partition(problems: Problems, study: Mapping, run: str, datasets: list[str]) -> None:
    """The partition a run's own ``partition`` blocks give its jobs, for each dataset; a problem
    the study's partition has already is not repeated."""
    entry = study["runs"][run]
    overrides = [(f"runs.{run}.per_dataset.{d}.partition", (o or {}).get("partition"))
                 for d, o in (entry.get("per_dataset") or {}).items() if isinstance(o, Mapping)]
    overrides.append((f"runs.{run}.partition", entry.get("partition")))
    if not isinstance(study.get("partition"), Mapping) or not any(o for _, o in overrides):
        return
    if any(problems.is_flagged(key) for key, _ in overrides) or problems.is_flagged("partition"):
        return
    found: dict[str, list[str]] = {}
    for dataset in datasets:
        study_problems = _partition_problems(partition_spec(study, dataset))
        for message in _partition_problems(run_partition_spec(study, run, dataset)):
            if message not in study_problems:
                found.setdefault(message, []).append(dataset)
    for message, where in found.items():
        problems.add(f"runs.{run}.partition", message if where == datasets else f"{', '.join(where)}: {message}")


class _Unknown(Exception):
    """Raised on reading a config value that was invalid (and is reported already)."""


class _Partial:
    """A parsed config block whose invalid fields (``unknown``) raise :class:`_Unknown` when
    read: a protocol check that needs one of them is skipped, the others still run."""

    def __init__(self, config: Any, unknown: set[str]) -> None:
        self._config, self._unknown = config, unknown

    def __getattr__(self, name: str) -> Any:
        if name in self._unknown:
            raise _Unknown(name)
        return getattr(self._config, name)


def _parse_block(cls: type, values: Mapping, where: str) -> tuple[dict | None, set[str], list[str]]:
    """Check block ``values`` with :func:`from_dict`, key by key when it fails. Returns the
    valid values, the names of the invalid keys and the messages (values None if the block
    fails as a whole although each key passes alone)."""
    def message(err: ConfigError) -> str:  # checks of the dataclass itself name no run
        return str(err) if str(err).startswith(where) else f"{where}: {err}"

    try:
        from_dict(cls, values, where)
        return dict(values), set(), []
    except ConfigError as err:
        whole = message(err)
    bad, messages = set(), []
    for key, value in values.items():
        try:
            from_dict(cls, {key: value}, where)
        except ConfigError as err:
            bad.add(key)
            messages.append(message(err))
    if not bad:
        return None, set(), [whole]
    good = {k: v for k, v in values.items() if k not in bad}
    try:
        from_dict(cls, good, where)
    except ConfigError as err:
        return None, bad, [*messages, message(err)]
    return good, bad, messages


def _check_study_blocks(problems: Problems, study: Mapping) -> dict[str, tuple[dict | None, set[str]]]:
    """Check the study-level model/train/evaluation blocks alone; returns for each its valid
    values (None if unusable) and the names of its invalid keys."""
    blocks = {}
    for name, cls in BLOCKS.items():
        values, _ = problems.clean(study.get(name), name)
        if values is None:
            blocks[name] = (None, set())
            continue
        if not isinstance(values, Mapping):
            problems.add(name, f"must be a mapping of keys to values, got {describe_value(values)}")
            blocks[name] = (None, set())
            continue
        good, bad, messages = _parse_block(cls, values, name)
        for message in messages:
            problems.add(None, message)
        bad |= set(study.get(name) or {}) - set(values)
        blocks[name] = (good, bad)
    return blocks


def _check_run(problems: Problems, prefix: str, entry: Mapping, blocks: dict) -> None:
    """A run as most datasets get it, then each ``per_dataset`` override of it; a problem
    an override shares with the run itself is reported once, under the run."""
    if ("method" in entry) == ("not_reproducible" in entry):
        problems.add(prefix, "give either method (a row that runs) or not_reproducible (why the row cannot be run), "
                             f"not {'both' if 'method' in entry else 'neither'}")
        return
    base = {k: v for k, v in entry.items() if k != "per_dataset"}
    found = _variant_problems(problems, prefix, base, blocks)
    for key, message in found:
        problems.add(key, message)
    overrides = entry.get("per_dataset") or {}
    if not isinstance(overrides, Mapping):
        return
    for dataset, override in overrides.items():
        where = f"{prefix}.per_dataset.{dataset}"
        if _unknown_dataset(problems, where, dataset) or not isinstance(override, Mapping):
            continue
        for key, message in _variant_problems(problems, where, merge(base, override), blocks, prefix):
            as_run = (key and key.replace(where, prefix), message.replace(where, prefix))
            if as_run not in found:
                problems.add(key, message)


def _check_grid(problems: Problems, prefix: str, entry: Mapping, blocks: dict) -> None:
    """A run's ``grid`` varies only its method's hparams and ``train`` keys, and every grid
    point is a valid run (checked as the run itself is)."""
    from fglrepro.grid import TRAIN_KEYS, apply_point, grid_points, point_id
    from fglrepro.methods import get_method

    grid = entry.get("grid")
    if not isinstance(grid, Mapping) or not grid or problems.is_flagged(f"{prefix}.grid"):
        return
    try:
        hparam_keys = [f.name for f in dataclasses.fields(get_method(entry.get("method")).Hparams)]
    except (ConfigError, TypeError):
        return  # the unknown method is reported by _check_run
    unknown = [key for key in grid if key not in hparam_keys and key not in TRAIN_KEYS]
    if unknown:
        problems.add(f"{prefix}.grid", f"unknown key(s) {unknown}; a grid varies hparams of "
                                       f"{entry.get('method')} {hparam_keys} or train keys {list(TRAIN_KEYS)}")
        return
    base = {k: v for k, v in entry.items() if k != "per_dataset"}
    for values in grid_points(grid):
        for key, message in _variant_problems(problems, f"{prefix}@{point_id(values)}", apply_point(base, values),
                                              blocks):
            problems.add(key, message)


def _variant_problems(
    problems: Problems, where: str, entry: Mapping, blocks: dict, run: str | None = None
) -> list[tuple[str | None, str]]:
    """(key, message) problems of one run entry (``where``: its key path; ``run``: the run's
    own path when ``entry`` is a ``per_dataset`` override merged over it). A key of None means
    the message names the key path itself."""
    from fglrepro.fl.method import RunSetup
    from fglrepro.methods import check_method, get_method, resolve_method

    def keys(name: str) -> tuple[str, ...]:  # where the values of block ``name`` come from
        return (f"{where}.{name}",) if run is None else (f"{where}.{name}", f"{run}.{name}")

    method = entry.get("method")
    if not isinstance(method, str):
        return []
    try:
        get_method(method)
    except ConfigError as err:
        return [(f"{where}.method", str(err))]
    found: list[tuple[str | None, str]] = []
    spec = None
    hparams, dropped = problems.clean(entry.get("hparams"), *keys("hparams"))
    if hparams is not None and not dropped:
        try:
            spec = resolve_method(method, hparams, f"{where}.hparams")
        except ConfigError as err:
            found.append((None, str(err)))
    configs = {}
    for name, cls in BLOCKS.items():
        study_values, unknown = blocks[name]
        own = entry.get(name) if name in RUN_BLOCKS else None
        own_values, _ = problems.clean(own, *keys(name))
        if own_values is None or study_values is None:
            continue
        if not isinstance(own_values, Mapping):
            found.append((f"{where}.{name}", f"must be a mapping of keys to values, got {describe_value(own)}"))
            continue
        own_bad = set(own or {}) - set(own_values)
        if own_values:
            own_values, bad, messages = _parse_block(cls, own_values, f"{where}.{name}")
            found += [(None, message) for message in messages]
            if own_values is None:
                continue
            own_bad |= bad
        unknown = (unknown - set(own_values)) | own_bad
        try:
            config = from_dict(cls, {**study_values, **own_values}, name)
        except ConfigError as err:
            found.append((where, str(err)))
            continue
        configs[name] = _Partial(config, unknown) if unknown else config
    model = configs.get("model")
    if isinstance(model, ModelConfig):
        model_key = f"{where}.model" if entry.get("model") else "model"
        found += [(model_key, message) for message in _model_problems(model)]
    if spec is not None and len(configs) == len(BLOCKS):
        setup = RunSetup(configs["train"], configs["model"], configs["evaluation"])
        try:
            found += [(where, message) for message in check_method(spec, setup)]
        except _Unknown:
            pass  # the check needs a value that is reported as invalid
    return found


def _model_problems(model: ModelConfig) -> list[str]:
    """Problems that building the model (each client's, with and without edges, for a
    heterogeneous zoo) raises."""
    from fglrepro.models import build_model

    configs, problems = [], []
    for k, graphless in [(k, g) for k in range(max(1, len(model.clients))) for g in (False, True)]:
        try:
            configs.append(model.for_client(k, graphless))
        except ConfigError as err:
            if str(err) not in problems:
                problems.append(str(err))
    for config in configs:
        try:
            build_model(config, in_channels=4, num_classes=3)
        except ConfigError as err:
            if str(err) not in problems:
                problems.append(str(err))
    return problems


def _check_files(problems: Problems, study: Mapping, paper_dir: str | Path | None) -> None:
    """The files of reported values exist in ``paper_dir``."""
    if paper_dir is None:
        return
    for key in ("reported", "reported_partition_stats"):
        name = study.get(key)
        if isinstance(name, str) and not (Path(paper_dir) / name).is_file():
            available = sorted(p.name for p in Path(paper_dir).glob("*.csv"))
            problems.add(key, f"file {name!r} is not in {paper_dir}; files there: {available}")


# ---- the workflow's entry points --------------------------------------------------------------

def read_study(path: str | Path, schema: str | Path | Mapping | None = None,
               paper_dir: str | Path | None = None) -> tuple[Any, list[str]]:
    """Parse study file ``path`` and check it; returns ``(study, problems)`` (defaults filled in)."""
    try:
        study = read_yaml(path)
    except yaml.YAMLError as err:
        return None, [f"{path}: not valid YAML: {' '.join(str(err).split())}"]
    return study, check_study(str(path), study, schema=schema, paper_dir=paper_dir)


def load_studies(
    names: list[str], study_dir: str | Path, *, schema: str | Path | Mapping | None = None,
    paper_dir: str | Path | None = None, only_datasets: list[str] | str = "all",
    skip_runs: Iterable[str] = (), only_seeds: list[int] | str | Mapping = "all",
) -> tuple[dict[str, dict], list[str]]:
    """Read and check the studies ``names`` of ``study_dir``, then apply ``skip_runs``,
    ``only_datasets`` and ``only_seeds`` (seeds, ``all``, or per study ``{study: seeds or all}``
    with ``"*"`` for the other studies); returns ``(studies, problems)`` with the problems
    of all of them."""
    studies, problems = {}, []
    if only_datasets != "all":
        for i, name in enumerate(only_datasets):
            if name not in DATASETS:
                problems.append(f"config: only_datasets[{i}]: unknown dataset {name!r}; "
                                f"valid datasets: {sorted(DATASETS)}")
    for name in names:
        path = Path(study_dir) / f"{name}.yaml"
        if not path.is_file():
            available = sorted(p.stem for p in Path(study_dir).glob("*.yaml"))
            problems.append(f"study {name!r} not found at {path}; available studies: {available}")
            continue
        study, found = read_study(path, schema, paper_dir)
        problems += found
        if found:
            continue
        study["runs"] = {run: entry for run, entry in study["runs"].items() if run not in skip_runs}
        if only_datasets != "all":
            study["datasets"] = [d for d in study["datasets"] if d in only_datasets]
            if not study["datasets"]:
                problems.append(f"{path}: datasets: none of them is in only_datasets={only_datasets}")
        seeds = only_seeds.get(name, only_seeds.get("*", "all")) if isinstance(only_seeds, Mapping) else only_seeds
        if seeds != "all":
            study["seeds"] = [seed for seed in study["seeds"] if seed in seeds]
            if not study["seeds"]:
                problems.append(f"{path}: seeds: none of them is in only_seeds={seeds}")
        studies[name] = study
    return studies, problems


def config_problems(config: Mapping, schema: str | Path | Mapping, where: str = "config") -> list[str]:
    """Problems of the workflow config against its schema (defaults filled in), one line each."""
    return [f"{where}: {text}" for _, text in schema_problems(config, schema)]
