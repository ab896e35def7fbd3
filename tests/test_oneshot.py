"""The one-shot setting: one round, then local fine-tuning of the received model (+ft)."""

from __future__ import annotations

import pytest
import torch
from helpers import make_method

from fglrepro.config import ConfigError, EvalConfig
from fglrepro.fl.loop import run_federation
from fglrepro.fl.training import evaluate
from fglrepro.methods import resolve_method


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
        # the tuned model is the client's model at both stages
        state = tuned.states[k]
        assert tuned.eval_model(k, "global") is state.received is state.model
        assert tuned.eval_model(k, "local") is state.model
    assert any(
        not torch.equal(a, b)
        for a, b in zip(tuned.eval_model(0, "global").parameters(), plain.global_model.parameters())
    )


def test_finetuning_happens_only_after_the_last_round(sbm):
    method = make_method(sbm, "finetune", {"base": "fedavg", "epochs": 5}, rounds=3)
    tested = []  # during the rounds, clients are tested on the server model they receive
    run_federation(method, 3, EvalConfig(),
                   on_round=lambda record: tested.append(method.eval_model(0, "global") is method.base.global_model))
    assert tested == [True, True, True]
    assert method.eval_model(0, "global") is not method.base.global_model  # tuned when the run ended
    assert method.eval_model(0, "global") is method.states[0].model


def test_finetuning_also_runs_when_early_stopping_ends_the_run(sbm):
    # lr 0: the federated rounds change nothing, so validation accuracy never improves after
    # round 1 and patience 1 stops the run after round 2; fine-tuning has its own lr
    method = make_method(sbm, "finetune", {"base": "fedavg", "epochs": 30, "patience": 30, "lr": 0.05},
                         rounds=10, lr=0.0)
    history = run_federation(method, 10, EvalConfig(patience=1))
    assert history.stopped_early and len(history.rounds) == 2
    received = method.base.global_model
    tuned = [method.eval_model(k, "global") for k in range(len(method.clients))]
    assert all(model is not received and model is state.model for model, state in zip(tuned, method.states))
    assert any(not torch.equal(a, b) for a, b in zip(tuned[0].parameters(), received.parameters()))
    # the last round's record holds the tuned models' metrics
    assert history.final["clients"] == [evaluate(m, c) for m, c in zip(tuned, method.clients)]
    for model, client in zip(tuned, method.clients):
        assert evaluate(model, client)["val_acc"] >= evaluate(received, client)["val_acc"]


def test_a_method_cannot_wrap_itself():
    with pytest.raises(ConfigError, match="cannot wrap itself"):
        resolve_method("finetune", {"base": "finetune"})
