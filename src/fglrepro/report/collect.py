"""Run JSONs -> one tidy metrics table (a row per run) and one curves table (a row per round).

All metric columns are in percent, like the papers.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

ID_COLUMNS = ["study", "paper", "table", "run", "method", "label", "dataset", "partition",
              "scheme", "clients", "seed"]
METRICS = ("test_acc", "test_f1_macro", "val_acc", "val_f1_macro")


def scheme_partitioner(scheme: str, names=None) -> str:
    """The partitioner a scheme slug (``<partitioner><-option value>..._<split>..._<prep>``,
    see ``scheme_slug`` in workflow/rules/common.smk) starts with: the longest registered
    partitioner name followed by ``-``, ``_`` or the end (``louvain_plus``, not ``louvain``)."""
    if names is None:
        from fglrepro.partition.partitioners import PARTITIONERS

        names = PARTITIONERS
    matches = [n for n in names if scheme == n or scheme.startswith((f"{n}-", f"{n}_"))]
    if not matches:
        raise ValueError(f"scheme {scheme!r} starts with no known partitioner; known: {sorted(names)}")
    return max(matches, key=len)


def partitioner_of(run: dict, meta: dict) -> str:
    """The partitioner of a run: from the study meta's ``schemes`` (scheme -> partitioner, as
    the workflow passes it), else from the scheme slug."""
    return meta.get("schemes", {}).get(run["scheme"]) or scheme_partitioner(run["scheme"])


#: share of a run's highest test accuracy that defines its convergence round (:func:`converge_round`)
CONVERGED = 0.99


def converge_round(rounds: list[int], test_acc: list[float], share: float = CONVERGED) -> int | None:
    """The first of ``rounds`` whose test accuracy reaches ``share`` of the highest of ``test_acc``
    (one value per round, NaN where not evaluated): how many communication rounds a run takes to
    converge, the measure of "converges within fewer rounds" (FedTAD Fig. 3). None without a
    positive accuracy."""
    top = max((value for value in test_acc if value == value), default=0.0)
    if top <= 0:
        return None
    return next(r for r, value in zip(rounds, test_acc) if value >= share * top)


def metrics_row(run: dict, meta: dict) -> dict:
    """One CSV row for a run JSON: ids, status, best-round metrics (selected average and both
    averages), final-round test metrics, the convergence round (:func:`converge_round` of the test
    accuracy curve, selected average), cost, communication (``upload_mb`` / ``download_mb``: MB,
    10^6 bytes, each client sent / received over the run, mean over clients) and provenance."""
    row = {
        "study": run["study"], "paper": meta["paper"], "table": meta["table"], "run": run["run"],
        "method": run["method"], "label": meta["labels"].get(run["run"], run["run"]),
        "dataset": run["dataset"], "partition": partitioner_of(run, meta),
        "scheme": run["scheme"], "clients": run["clients"], "seed": run["seed"],
        "grid_point": run.get("grid_point"), "grid_size": run.get("grid_size"),
        "status": run["status"], "learning": run.get("learning"),
        "wall_s": run.get("wall_s"), "cpu_s": run.get("cpu_s"), "peak_memory_mb": run.get("peak_memory_mb"),
        "device": run.get("device"), "git_commit": run.get("git_commit"), "git_dirty": run.get("git_dirty"),
    }
    sent = run.get("communication") or {}
    for direction in ("upload", "download"):
        per_client = sent.get(f"{direction}_bytes")
        if per_client:
            row[f"{direction}_mb"] = sum(per_client) / len(per_client) / 1e6
    if run["status"] == "ok":
        best, final = run["metrics"]["best"], run["metrics"]["final"]
        row["best_round"] = best["round"]
        row["rounds_run"] = final["round"]
        for key in METRICS:
            row[key] = 100 * best[key]
            for average in ("weighted", "unweighted"):
                row[f"{key}_{average}"] = 100 * best[average][key]
        row["final_test_acc"] = 100 * final["test_acc"]
        row["final_test_f1_macro"] = 100 * final["test_f1_macro"]
        curves = run.get("curves") or {}
        if curves.get("round"):
            accuracy = curves[f"{run['evaluation']['average']}_test_acc"]
            row["converge_round"] = converge_round(curves["round"], accuracy)
    return row


#: columns of the curves table (also when no run finished, so that its CSV has a header).
CURVE_COLUMNS = ["study", "run", "label", "dataset", "clients", "seed", "round", "train_loss", "val_acc", "test_acc",
                 "test_f1_macro"]


def curve_rows(run: dict, meta: dict) -> list[dict]:
    """Per-round rows (selected average) of an ``ok`` run."""
    if run["status"] != "ok":
        return []
    curves = run["curves"]
    average = run["evaluation"]["average"]
    label = meta["labels"].get(run["run"], run["run"])
    return [
        {"study": run["study"], "run": run["run"], "label": label, "dataset": run["dataset"],
         "clients": run["clients"], "seed": run["seed"], "round": r,
         "train_loss": curves["train_loss"][i],
         "val_acc": 100 * curves[f"{average}_val_acc"][i],
         "test_acc": 100 * curves[f"{average}_test_acc"][i],
         "test_f1_macro": 100 * curves[f"{average}_test_f1_macro"][i]}
        for i, r in enumerate(curves["round"])
    ]


#: keys every run JSON has (written by ``fgl-train``); one missing means a damaged file.
RUN_KEYS = ("study", "run", "method", "dataset", "scheme", "clients", "seed", "status")


def read_run(path: str | Path) -> dict:
    """A run JSON, checked: raises ``DamagedFileError`` naming ``path`` for a truncated file or a missing key."""
    from fglrepro.io import DamagedFileError, damaged_message, read_json

    run = read_json(path, "train")
    missing = [key for key in RUN_KEYS if not isinstance(run, dict) or key not in run]
    if missing:
        raise DamagedFileError(damaged_message(path, "train", KeyError(f"keys {missing} missing")))
    return run


def unreadable_run(path: str | Path, message: str) -> dict:
    """Stand-in for a damaged run JSON at ``.../runs/<study>/<run>/<dataset>/<scheme>/k<clients>/seed<seed>.json``:
    its ids from the path, status ``unreadable`` and the message, so the tables show the cell as failed."""
    parts = Path(path).with_suffix("").parts[-6:]
    study, run, dataset, scheme, clients, seed = parts
    return {"study": study, "run": run, "method": run.split("@")[0], "dataset": dataset, "scheme": scheme,
            "clients": int(clients.removeprefix("k")), "seed": int(seed.removeprefix("seed")),
            "status": "unreadable", "message": message}


def collect(run_paths: list[str | Path], meta: dict) -> tuple[pd.DataFrame, pd.DataFrame, list[str]]:
    """Read run JSONs (a run's grid points reduced to the point picked by validation accuracy,
    :func:`fglrepro.grid.select_grid_points`); returns ``(metrics, curves, problems)``: a damaged run
    file is a row with status ``unreadable`` and one line in ``problems``, the others are read as usual."""
    from fglrepro.grid import select_grid_points
    from fglrepro.io import DamagedFileError

    read, problems = [], []
    for path in run_paths:
        try:
            read.append(read_run(path))
        except DamagedFileError as err:
            problems.append(str(err))
            read.append(unreadable_run(path, str(err)))
    runs = select_grid_points(read)
    metrics = pd.DataFrame([metrics_row(r, meta) for r in runs])
    curves = pd.DataFrame([row for r in runs for row in curve_rows(r, meta)], columns=CURVE_COLUMNS)
    order = ID_COLUMNS + [c for c in metrics.columns if c not in ID_COLUMNS]
    return metrics[order], curves, problems
