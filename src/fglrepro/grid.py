"""Hyperparameter grids of study runs.

A run may declare ``grid: {key: [values], ...}`` over its method's hparams and ``train`` keys.
The workflow trains every grid point as its own run ``<run>@<point>`` (``point`` =
``key=value,key=value`` in the grid's key order) and the aggregation keeps, for each
(dataset, scheme, clients, seed), the point with the best validation accuracy: the run JSON's
best-round ``val_acc`` under the study's ``evaluation.average``. Test metrics are never read
to choose; the metrics CSV names the chosen point.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from dataclasses import fields

from fglrepro.config import TrainConfig

#: Separates a run id from its grid point in the ids of grid-point runs.
SEPARATOR = "@"
TRAIN_KEYS = tuple(f.name for f in fields(TrainConfig))


def grid_points(grid: Mapping[str, list]) -> list[dict]:
    """Every combination of the grid's values, the first key varying slowest."""
    keys = list(grid)
    return [dict(zip(keys, values)) for values in itertools.product(*(grid[k] for k in keys))]


def point_id(values: Mapping) -> str:
    """``key=value,key=value`` (path-safe for numbers, booleans and plain strings)."""
    return ",".join(f"{key}={value}" for key, value in values.items())


def run_ids(run: str, entry: Mapping) -> list[str]:
    """The training runs of study run ``run``: itself, or one ``run@point`` per grid point."""
    if not entry.get("grid"):
        return [run]
    return [f"{run}{SEPARATOR}{point_id(p)}" for p in grid_points(entry["grid"])]


def split_run_id(run_id: str) -> tuple[str, str | None]:
    """``(run, point)`` of a training run id; ``point`` is None outside a grid."""
    run, sep, point = run_id.partition(SEPARATOR)
    return run, (point if sep else None)


def apply_point(entry: Mapping, values: Mapping) -> dict:
    """Run ``entry`` with a grid point's ``values`` set (``train`` keys in its ``train``
    block, all others in its ``hparams``; they override the entry's own values) and without
    its ``grid``."""
    out = {k: v for k, v in entry.items() if k != "grid"}
    train = {k: v for k, v in values.items() if k in TRAIN_KEYS}
    hparams = {k: v for k, v in values.items() if k not in TRAIN_KEYS}
    out["train"] = {**entry.get("train", {}), **train}
    out["hparams"] = {**entry.get("hparams", {}), **hparams}
    return out


def point_entry(entry: Mapping, run_id: str) -> dict:
    """The entry a training run id trains: ``entry`` itself, or with its grid point applied."""
    _, point = split_run_id(run_id)
    if point is None:
        return dict(entry)
    for values in grid_points(entry.get("grid") or {}):
        if point_id(values) == point:
            return apply_point(entry, values)
    raise KeyError(f"run {run_id!r}: {point!r} is not a point of its grid {entry.get('grid')}")


def validation_score(record: Mapping) -> float:
    """What a grid point is chosen by: the best-round validation accuracy of an ``ok`` run
    (``-inf`` for a failed one). Only ``metrics.best.val_acc`` is read."""
    if record.get("status") != "ok":
        return float("-inf")
    return float(record["metrics"]["best"]["val_acc"])


def select_grid_points(records: list[dict]) -> list[dict]:
    """``records`` (run JSONs) with every group of grid points of one run, dataset, scheme,
    client count and seed replaced by its point of best :func:`validation_score` (the first in
    grid order on ties, or the first point when none succeeded), relabelled as the run itself
    with ``grid_point`` (the chosen point) and ``grid_size`` (the points compared) added.
    Records outside grids pass unchanged, in their order."""
    groups: dict[tuple, list[dict]] = {}
    out: list[dict | tuple] = []
    for record in records:
        run, point = split_run_id(record["run"])
        if point is None:
            out.append(record)
            continue
        key = (run, record["dataset"], record["scheme"], record["clients"], record["seed"])
        if key not in groups:
            groups[key] = []
            out.append(key)
        groups[key].append(record)
    chosen = []
    for item in out:
        if not isinstance(item, tuple):
            chosen.append(item)
            continue
        points = groups[item]
        best = max(points, key=validation_score)  # max keeps the first of equal scores
        chosen.append({**best, "run": item[0], "grid_point": split_run_id(best["run"])[1],
                       "grid_size": len(points)})
    return chosen
