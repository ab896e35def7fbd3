"""The one-shot setting: one round, then local fine-tuning of the received model (+ft)."""

from __future__ import annotations

import pytest
import torch

from fglrepro.config import ConfigError, EvalConfig
from fglrepro.fl.loop import run_federation
from fglrepro.fl.training import evaluate
from test_federated import make_method


@pytest.mark.parametrize("base", ["fedavg", "fedtad", "local"])
def test_one_shot_uploads_and_downloads_once_per_client(sbm, base):
    method = make_method(sbm, "finetune", {"base": base, "epochs": 3}, rounds=1)
    history = run_federation(method, 1, EvalConfig())
    assert len(history.rounds) == 1
    record = history.rounds[0]
    assert len(record["upload_bytes"]) == len(record["download_bytes"]) == len(method.clients)
    if base != "local":
        assert all(b > 0 for b in record["upload_bytes"] + record["download_bytes"])


def test_finetuning_starts_from_the_received_model_and_never_loses_validation_accuracy(sbm):
    plain = make_method(sbm, "fedavg", rounds=1)
    run_federation(plain, 1, EvalConfig())
    tuned = make_method(sbm, "finetune", {"base": "fedavg", "epochs": 30, "patience": 30}, rounds=1)
    run_federation(tuned, 1, EvalConfig())
    for k, client in enumerate(tuned.clients):
        received = evaluate(plain.global_model, client)["val_acc"]
        assert evaluate(tuned.eval_model(k, "global"), client)["val_acc"] >= received
    assert any(
        not torch.equal(a, b)
        for a, b in zip(tuned.eval_model(0, "global").parameters(), plain.global_model.parameters())
    )


def test_finetuning_happens_only_after_the_last_round(sbm):
    method = make_method(sbm, "finetune", {"base": "fedavg", "epochs": 5}, rounds=3)
    run_federation(method, 2, EvalConfig())
    assert method.tuned == {}
    assert method.eval_model(0, "global") is method.base.global_model


def test_a_method_cannot_wrap_itself(sbm):
    with pytest.raises(ConfigError, match="cannot wrap itself"):
        make_method(sbm, "finetune", {"base": "finetune"})
