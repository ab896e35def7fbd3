"""The training CLI: run JSON contract, statuses, and actionable errors."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch


def train(cli_inputs, spec, *extra):
    out = cli_inputs / "run.json"
    out.unlink(missing_ok=True)
    proc = subprocess.run(
        [sys.executable, "-m", "fglrepro.cli.train", "--spec", json.dumps(spec), "--data", str(cli_inputs / "g.pt"),
         "--partition", str(cli_inputs / "p.pt"), "--out", str(out), *extra],
        capture_output=True, text=True,
    )
    return proc, (json.loads(out.read_text()) if out.exists() else None)


BASE = {"method": "fedavg", "seed": 0, "study": "s", "run": "fedavg", "dataset": "SBM",
        "train": {"rounds": 4, "local_epochs": 1}, "model": {"hidden": 8}}


def test_run_json_contract(cli_inputs):
    proc, run = train(cli_inputs, BASE, "--device", "cpu")
    assert proc.returncode == 0, proc.stderr
    assert run["status"] == "ok" and run["device"] == "cpu"
    for key in ("metrics", "curves", "wall_s", "peak_memory_mb", "git_commit", "package_version",
                "torch_version", "hparams", "model", "train", "evaluation"):
        assert key in run
    best = run["metrics"]["best"]
    assert set(best["weighted"]) == {"val_acc", "val_f1_macro", "test_acc", "test_f1_macro"}
    assert len(best["clients"]) == 3 and len(run["curves"]["round"]) == 4
    assert run["train"]["rounds"] == 4 and run["train"]["lr"] == 0.01  # resolved defaults


def test_same_seed_same_metrics_on_cpu(cli_inputs):
    _, a = train(cli_inputs, BASE)
    _, b = train(cli_inputs, BASE)
    assert a["curves"] == b["curves"]


def test_allocator_setting_is_recorded_and_leaves_the_numbers(cli_inputs):
    from fglrepro.allocator import on_glibc

    _, reuse = train(cli_inputs, BASE)
    _, default = train(cli_inputs, BASE, "--malloc", "default")
    assert reuse["curves"] == default["curves"] and reuse["metrics"] == default["metrics"]
    assert default["malloc"] == "default"
    assert reuse["malloc"] == ("reuse" if on_glibc() else "default")  # restarted with the glibc settings


def test_diverging_run_is_recorded_not_fatal(cli_inputs):
    spec = {**BASE, "train": {"rounds": 3, "local_epochs": 5, "optimizer": "sgd", "lr": 1e30}}
    proc, run = train(cli_inputs, spec)
    assert proc.returncode == 0
    assert run["status"] == "diverged" and "metrics" not in run


@pytest.mark.parametrize(
    "spec, message",
    [
        ({**BASE, "method": "fedsgd"}, "valid methods"),
        ({**BASE, "hparams": {"mu": 1}}, "unknown key(s) ['mu'] in hparams of fedavg"),
        ({**BASE, "train": {"optimiser": "adam"}}, "unknown key(s) ['optimiser'] in train"),
        ({**BASE, "evaluation": {"model": "server"}}, "evaluation.model = 'server' is not valid"),
        ({**BASE, "method": "local", "evaluation": {"model": "global"}}, "set evaluation.model to 'local'"),
        ({"seed": 0}, "lacks required key(s) ['method']"),
    ],
)
def test_bad_spec_exits_2_with_actionable_message(cli_inputs, spec, message):
    proc, run = train(cli_inputs, spec)
    assert proc.returncode == 2 and run is None
    assert message in proc.stderr


def test_cuda_request_without_gpu_is_an_error(cli_inputs):
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present")
    proc, _ = train(cli_inputs, BASE, "--device", "cuda")
    assert proc.returncode == 2 and "no CUDA device" in proc.stderr
