"""Run JSONs -> one tidy metrics table (a row per run) and one curves table (a row per round).

All metric columns are in percent, like the papers.
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

ID_COLUMNS = ["study", "paper", "table", "run", "method", "label", "dataset", "partition",
              "scheme", "clients", "seed"]
METRICS = ("test_acc", "test_f1_macro", "val_acc", "val_f1_macro")


def metrics_row(run: dict, meta: dict) -> dict:
    """One CSV row for a run JSON: ids, status, best-round metrics (selected average and both
    averages), final-round test metrics, cost and provenance."""
    row = {
        "study": run["study"], "paper": meta["paper"], "table": meta["table"], "run": run["run"],
        "method": run["method"], "label": meta["labels"].get(run["run"], run["run"]),
        "dataset": run["dataset"], "partition": run["scheme"].split("_")[0].split("-")[0],
        "scheme": run["scheme"], "clients": run["clients"], "seed": run["seed"],
        "status": run["status"], "wall_s": run.get("wall_s"), "peak_memory_mb": run.get("peak_memory_mb"),
        "device": run.get("device"), "git_commit": run.get("git_commit"),
    }
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
    return row


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


def collect(run_paths: list[str | Path], meta: dict) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Read run JSONs; returns ``(metrics, curves)`` data frames."""
    runs = [json.loads(Path(p).read_text()) for p in run_paths]
    metrics = pd.DataFrame([metrics_row(r, meta) for r in runs])
    curves = pd.DataFrame([row for r in runs for row in curve_rows(r, meta)])
    order = ID_COLUMNS + [c for c in metrics.columns if c not in ID_COLUMNS]
    return metrics[order], curves
