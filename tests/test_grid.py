"""Hyperparameter grids of study runs: expansion into grid-point runs, their checks, and the
choice of one point per (dataset, clients, seed) by validation accuracy only."""

from __future__ import annotations

import json

import pytest
from test_validation import check, make_study, only

from fglrepro.grid import grid_points, point_entry, run_ids, select_grid_points, split_run_id
from fglrepro.report.collect import collect

GRID = {"local_epochs": [1, 3], "tau_s": [3.0, 9.0]}
ENTRY = {"method": "fedgkd", "label": "FedGKD", "hparams": {"gamma": 0.75}, "train": {"lr": 0.01}, "grid": GRID}


def test_every_combination_is_a_run_with_its_values_in_train_or_hparams():
    assert grid_points(GRID) == [{"local_epochs": 1, "tau_s": 3.0}, {"local_epochs": 1, "tau_s": 9.0},
                                 {"local_epochs": 3, "tau_s": 3.0}, {"local_epochs": 3, "tau_s": 9.0}]
    ids = run_ids("fedgkd", ENTRY)
    assert ids[1] == "fedgkd@local_epochs=1,tau_s=9.0" and len(ids) == 4
    assert run_ids("fedavg", {"method": "fedavg"}) == ["fedavg"]
    assert split_run_id(ids[1]) == ("fedgkd", "local_epochs=1,tau_s=9.0")
    entry = point_entry(ENTRY, ids[1])
    assert entry["train"] == {"lr": 0.01, "local_epochs": 1}
    assert entry["hparams"] == {"gamma": 0.75, "tau_s": 9.0} and "grid" not in entry
    with pytest.raises(KeyError, match="not a point of its grid"):
        point_entry(ENTRY, "fedgkd@local_epochs=2,tau_s=9.0")


class BlindToTest(dict):
    """A metrics block whose test entries cannot be read."""

    def __getitem__(self, key):
        if str(key).startswith("test"):
            raise AssertionError(f"the selection read {key!r}")
        return super().__getitem__(key)

    def get(self, key, default=None):
        return self[key] if key in self else default


def record(point: str, val: float, test: float, seed: int = 0, status: str = "ok") -> dict:
    best = BlindToTest(val_acc=val, test_acc=test, round=3)
    return {"run": f"fedgkd@{point}", "dataset": "Cora", "scheme": "s", "clients": 5, "seed": seed,
            "status": status, "metrics": {"best": best, "final": best}}


def test_a_jobs_spec_takes_the_point_then_the_datasets_override_over_the_studys_blocks():
    from fglrepro.validation import train_spec

    study = {"model": {"arch": "gcn", "hidden": 64}, "train": {"rounds": 100, "lr": 0.1},
             "evaluation": {"model": "global", "average": "weighted"},
             "runs": {"fedgkd": {**ENTRY, "model": {"hidden": 32},
                                 "per_dataset": {"Cora": {"train": {"lr": 0.5}, "hparams": {"gamma": 0.5}}}}}}
    run = "fedgkd@local_epochs=3,tau_s=9.0"
    spec = train_spec(study, "s", run, "Cora", "metis", "10", "2")
    assert spec == {"study": "s", "run": run, "method": "fedgkd", "hparams": {"gamma": 0.5, "tau_s": 9.0},
                    "model": {"arch": "gcn", "hidden": 32}, "train": {"rounds": 100, "lr": 0.5, "local_epochs": 3},
                    "evaluation": {"model": "global", "average": "weighted"},
                    "dataset": "Cora", "scheme": "metis", "clients": 10, "seed": 2}
    other = train_spec(study, "s", run, "CiteSeer", "metis", 10, 2)
    assert other["train"]["lr"] == 0.01 and other["hparams"] == {"gamma": 0.75, "tau_s": 9.0}


def test_the_point_with_the_best_validation_accuracy_is_kept_and_test_is_never_read():
    records = [record("a=1", 0.70, 0.90), record("a=2", 0.80, 0.60), record("a=3", 0.80, 0.99),
               record("a=1", 0.75, 0.10, seed=1), record("a=2", 0.95, 0.20, seed=1, status="diverged"),
               {"run": "fedavg", "seed": 0}]
    chosen = select_grid_points(records)
    assert [(r["run"], r.get("grid_point"), r.get("grid_size")) for r in chosen] == [
        ("fedgkd", "a=2", 3), ("fedgkd", "a=1", 2), ("fedavg", None, None)]  # a tie keeps the first point
    failed = select_grid_points([record("a=1", 0.7, 0.9, status="oom"), record("a=2", 0.7, 0.9, status="oom")])
    assert failed[0]["status"] == "oom" and failed[0]["grid_point"] == "a=1"


def test_metrics_csv_has_one_row_per_run_and_seed_naming_the_picked_point(tmp_path):
    paths = []
    for i, (point, val, test) in enumerate([("tau_s=3", 0.6, 0.9), ("tau_s=9", 0.7, 0.5)]):
        best = {"round": 2, "val_acc": val, "test_acc": test, "val_f1_macro": 0.1, "test_f1_macro": 0.1,
                "weighted": {}, "unweighted": {}}
        for key in ("val_acc", "test_acc", "val_f1_macro", "test_f1_macro"):
            best["weighted"][key] = best["unweighted"][key] = best[key]
        run = {"study": "s", "run": f"fedgkd@{point}", "method": "fedgkd", "dataset": "Cora", "scheme": "metis_x",
               "clients": 5, "seed": 0, "status": "ok", "metrics": {"best": best, "final": best},
               "evaluation": {"average": "unweighted"},
               "curves": {"round": [1, 2], "train_loss": [1.0, 0.5], "unweighted_val_acc": [val, val],
                          "unweighted_test_acc": [test, test], "unweighted_test_f1_macro": [0.1, 0.1]}}
        paths.append(tmp_path / f"{i}.json")
        paths[-1].write_text(json.dumps(run))
    meta = {"paper": "P", "table": "T", "labels": {"fedgkd": "FedGKD"}, "schemes": {"metis_x": "metis"}}
    metrics, curves, _ = collect(paths, meta)
    assert metrics[["run", "label", "grid_point", "grid_size", "test_acc"]].values.tolist() == [
        ["fedgkd", "FedGKD", "tau_s=9", 2, 50.0]]
    assert set(curves["test_acc"]) == {50.0}


def test_grid_keys_and_every_point_are_checked():
    study = make_study(gkd={"method": "fedprox", "label": "P", "grid": {"muu": [1.0], "lr": [0.1]}})
    assert "runs.gkd.grid: unknown key(s) ['muu']; a grid varies hparams of fedprox ['mu'] or train keys" in only(
        check(study), "muu")
    study = make_study(gkd={"method": "fedprox", "label": "P", "grid": {"mu": [0.1, "big"]}})
    assert "runs.gkd@mu=big.hparams.mu of fedprox must be a number" in only(check(study), "big")
    study = make_study(gkd={"method": "fedprox", "label": "P", "grid": {"local_epochs": [1, -2]}})
    assert only(check(study), "local_epochs").startswith("config/studies/x.yaml: runs.gkd@local_epochs=-2")
    assert check(make_study(gkd={"method": "fedprox", "label": "P", "grid": {"mu": [0.1, 1.0], "lr": [0.1]}})) == []
    study = make_study(gkd={"method": "fedprox", "label": "P", "grid": {"mu": []}})
    assert only(check(study), "grid")
