"""FedProto: class prototypes, their sample-weighted average, the local loss, heterogeneous clients."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from helpers import all_clients, assert_refused, make_method, method_problems, one_round

from fglrepro.components.prototypes import average_prototypes, class_prototypes
from fglrepro.config import ConfigError, EvalConfig, ModelConfig
from fglrepro.fl.loop import run_federation
from fglrepro.partition.build import PartitionSpec

READOUT = ModelConfig(hidden=16, readout=True)
LOCAL = EvalConfig(model="local", average="weighted")


def test_class_prototypes_are_the_class_means():
    hidden = torch.tensor([[1.0, 0.0], [3.0, 2.0], [5.0, 5.0], [0.0, 1.0]])
    labels = torch.tensor([2, 2, 0, 2])
    classes, prototypes, counts = class_prototypes(hidden, labels, num_classes=4)
    assert classes.tolist() == [0, 2] and counts.tolist() == [1.0, 3.0]
    assert torch.allclose(prototypes, torch.tensor([[5.0, 5.0], [4 / 3, 1.0]]))


def test_server_prototypes_are_the_sample_weighted_mean():
    a = (torch.tensor([0, 1]), torch.tensor([[1.0, 1.0], [2.0, 0.0]]), torch.tensor([1.0, 3.0]))
    b = (torch.tensor([1, 2]), torch.tensor([[6.0, 4.0], [7.0, 7.0]]), torch.tensor([1.0, 5.0]))
    prototypes, present = average_prototypes([a, b], num_classes=4, dim=2)
    assert present.tolist() == [True, True, True, False]
    expected = torch.tensor([[1.0, 1.0], [(3 * 2 + 6) / 4, (0 + 4) / 4], [7.0, 7.0], [0.0, 0.0]])
    assert torch.allclose(prototypes, expected)


def test_uploads_are_the_prototypes_of_the_trained_model_and_the_server_averages_them(sbm):
    method = make_method(sbm, "fedproto", model=READOUT, evaluation=LOCAL)
    uploads = one_round(method, 1)
    parts = []
    for k, upload in uploads.items():
        assert upload.params == {}
        model, client = method.states[k].model.eval(), method.clients[k]
        with torch.no_grad():
            hidden = model(client.x, client.adj, return_hidden=True)[0][client.train_mask]
        labels = client.y[client.train_mask]
        for c, prototype, count in zip(*(upload.extras[key] for key in ("classes", "prototypes", "counts"))):
            assert int(count) == int((labels == c).sum())
            assert torch.allclose(prototype, hidden[labels == c].mean(0), atol=1e-6)
        parts.append((upload.extras["classes"], upload.extras["prototypes"], upload.extras["counts"]))
    expected, _ = average_prototypes(parts, sbm.num_classes, 16)
    assert torch.equal(method.prototypes, expected)


def test_local_loss_is_cross_entropy_plus_lambda_times_mse_to_the_global_prototypes(sbm):
    method = make_method(sbm, "fedproto", {"lam": 0.7}, model=READOUT, evaluation=LOCAL)
    one_round(method, 1)
    method.present[1] = False  # a class without a global prototype adds nothing
    model, client = method.states[0].model.eval(), method.clients[0]
    mask, labels = client.train_mask, client.y[client.train_mask]
    hidden, logits = model(client.x, client.adj, return_hidden=True)
    squared = (hidden[mask] - method.prototypes[labels]).pow(2)
    squared[labels == 1] = 0.0
    expected = F.cross_entropy(logits[mask], labels) + 0.7 * squared.mean()
    assert bool((labels == 1).any())
    assert torch.allclose(method.local_objective(0, 2)(), expected)


def test_with_lambda_zero_fedproto_trains_like_local(sbm):
    proto = run_federation(make_method(sbm, "fedproto", {"lam": 0.0}, model=READOUT, evaluation=LOCAL), 3, LOCAL)
    local = run_federation(make_method(sbm, "local", model=READOUT, evaluation=LOCAL), 3, LOCAL)
    assert [r["train_loss"] for r in proto.rounds] == [r["train_loss"] for r in local.rounds]
    assert [r["weighted"] for r in proto.rounds] == [r["weighted"] for r in local.rounds]


def test_the_prototype_term_pulls_embeddings_to_the_global_prototypes(sbm):
    def distance(lam):
        method = make_method(sbm, "fedproto", {"lam": lam}, model=READOUT, evaluation=LOCAL, local_epochs=20)
        one_round(method, 1)
        method.client_update(0, 2)
        model, client = method.states[0].model.eval(), method.clients[0]
        with torch.no_grad():
            hidden = model(client.x, client.adj, return_hidden=True)[0][client.train_mask]
        return float((hidden - method.prototypes[client.y[client.train_mask]]).pow(2).mean())

    assert distance(50.0) < distance(0.0)


def test_graph_clients_train_a_gcn_and_graphless_clients_an_mlp_and_send_only_prototypes(sbm):
    model = ModelConfig(hidden=16, readout=True, graphless={"arch": "mlp"})
    spec = PartitionSpec("metis", "stratified", 0.4, 0.3, graphless_ratio=0.5)
    method = make_method(sbm, "fedproto", model=model, evaluation=LOCAL, num_clients=4, partition=spec)
    kinds = [type(state.model).__name__ for state in method.states]
    assert kinds == ["MLP" if c.graphless else "GCN" for c in method.clients] and set(kinds) == {"GCN", "MLP"}
    history = run_federation(method, 2, LOCAL)
    classes = [int(u.extras["classes"].numel()) for u in all_clients(method, 3).values()]
    # bytes per client: class ids (int64), prototypes (16 floats) and counts of its classes, whatever its model
    assert history.rounds[-1]["upload_bytes"] == [m * (8 + 16 * 4 + 4) for m in classes]
    assert history.rounds[-1]["download_bytes"] == [int(method.present.sum()) * 16 * 4] * 4


def test_fedproto_needs_a_readout_and_one_embedding_width(sbm):
    assert method_problems("fedproto", model=READOUT, evaluation=LOCAL) == []
    assert_refused(method_problems("fedproto", model=ModelConfig(hidden=16), evaluation=LOCAL),
                   r"fedproto needs model.readout: true on every client.*\['gcn'\]")
    assert_refused(method_problems("fedproto", model=ModelConfig(hidden=16, readout=True, clients=[{}, {"hidden": 8}]),
                                   evaluation=LOCAL), r"one embedding width.*\[8, 16\]")
    assert_refused(method_problems("fedproto", model=READOUT), r"'fedproto' has no global model")
    with pytest.raises(ConfigError, match="readout"):
        make_method(sbm, "fedproto", model=ModelConfig(hidden=16, readout=True, clients=[{"arch": "appnp"}]),
                    evaluation=LOCAL)
