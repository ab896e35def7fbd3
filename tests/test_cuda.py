"""Every row of the five papers' main tables, and every other method of the studies, trains on each
device there is (CPU always, CUDA where a GPU is present): the study file's own entry, two short
rounds, through the training CLI's ``execute`` on the CLI tests' small graph. On a GPU this is the
check that no method leaves a tensor on the CPU (a device mismatch raises) and that every method
stays finite there."""

from __future__ import annotations

import math

import pytest
import torch
from conftest import REPO

from fglrepro.grid import run_ids
from fglrepro.io import read_yaml
from fglrepro.validation import train_spec

MAIN_TABLES = ("fedgkd_table1", "fedgkc_table1", "fedgls_table1", "fedtad_table2", "opfgl_table1")
#: hyperparameters that must shrink with the two rounds (the rest stay the study's)
SHORT = {"fedsage_plus": {"generator_rounds": 1}, "adafgl": {"fedavg_rounds": 1}}
DEVICES = ["cpu", pytest.param("cuda", marks=[pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(),
                                                                                   reason="needs a CUDA device")])]


def study_specs() -> dict[str, dict]:
    """``study/run -> fgl-train spec`` of every training row of :data:`MAIN_TABLES` and of the first
    row (studies in name order) of every other method, a grid's first point, as the workflow builds it
    (:func:`~fglrepro.validation.train_spec`), shortened to two rounds (one-shot methods: their one)
    of one local epoch on 3 clients of the CLI tests' graph."""
    specs, methods = {}, set()
    paths = sorted((REPO / "config" / "studies").glob("*.yaml"), key=lambda p: (p.stem not in MAIN_TABLES, p.stem))
    for path in paths:
        study = read_yaml(path)
        for run, entry in study["runs"].items():
            if "method" not in entry or (path.stem not in MAIN_TABLES and entry["method"] in methods):
                continue
            methods.add(entry["method"])
            spec = train_spec(study, path.stem, run_ids(run, entry)[0], "SBM", "test", 3, 0)
            spec["hparams"] = {**spec["hparams"], **SHORT.get(spec["method"], {})}
            spec["train"] = {**spec["train"], "rounds": min(spec["train"].get("rounds", 2), 2), "local_epochs": 1}
            specs[f"{path.stem}/{run}"] = spec
    return specs


SPECS = study_specs()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("row", sorted(SPECS))
def test_main_table_row_trains_on_the_device(cli_inputs, row, device):
    from fglrepro.cli.train import execute
    from fglrepro.models import fast_dropout_enabled, fast_kernels_enabled

    switches = fast_kernels_enabled(), fast_dropout_enabled()
    record = execute(SPECS[row], str(cli_inputs / "g.pt"), str(cli_inputs / "p.pt"), device)
    assert (fast_kernels_enabled(), fast_dropout_enabled()) == switches  # scoped to the run
    assert record["status"] == "ok", record.get("error")
    assert record["device"].startswith(device)
    best = record["metrics"]["best"]["weighted"]
    assert all(math.isfinite(value) and 0 <= value <= 1 for value in best.values()), best
