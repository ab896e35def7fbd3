"""scripts/variant_run.py: a stored run's spec with settings applied, and errors naming the fix."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "variant_run.py"
_spec = importlib.util.spec_from_file_location("variant_run", SCRIPT)
variant_run = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(variant_run)


def test_settings_are_json_values_in_their_section():
    spec = {"hparams": {"beta": 0.2}, "model": {}, "train": {"rounds": 100}, "evaluation": {}}
    variant_run.apply_setting(spec, 'hparams.neighbour_space="logits"')
    variant_run.apply_setting(spec, "hparams.beta=0")
    variant_run.apply_setting(spec, "train.rounds=20")
    assert spec["hparams"] == {"beta": 0, "neighbour_space": "logits"} and spec["train"] == {"rounds": 20}


@pytest.mark.parametrize("setting, message", [
    ("hparams.neighbour_space=logits", "is not JSON"),
    ("optim.lr=0.1", r"SECTION one of \['hparams', 'model', 'train', 'evaluation'\]"),
    ("hparams=1", "expected SECTION.KEY=JSON"),
])
def test_bad_settings_exit_naming_the_problem(setting, message):
    with pytest.raises(SystemExit, match=message):
        variant_run.apply_setting({"hparams": {}}, setting)


def test_a_run_without_its_partition_exits_naming_the_missing_file(tmp_path):
    stored = {"study": "s", "run": "r", "method": "fedavg", "hparams": {}, "model": {}, "train": {},
              "evaluation": {}, "dataset": "Cora", "scheme": "metis_global-30-35_lcc-norm", "clients": 5, "seed": 0}
    run = tmp_path / "seed0.json"
    run.write_text(json.dumps(stored))
    with pytest.raises(SystemExit, match=r"prepared/Cora/lcc-norm\.pt does not exist"):
        variant_run.main([str(run), str(tmp_path / "out.json"), "--data-dir", str(tmp_path / "data"),
                          "--results", str(tmp_path / "results")])
