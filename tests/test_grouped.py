"""The grouped path of the model-heterogeneous methods (fl/grouped.py) against their
per-client reference path.

Without dropout and with the perturbed views of FedGKC switched off no random number
changes the result, so both paths must train the same models up to float rounding. The
comparisons use SGD: Adam's first steps are ``lr * sign(g)`` for every gradient far above its
eps, so a rounding difference in a near-zero gradient moves a weight by up to ``2 lr`` and
the parameters are not comparable after it (the validation curves still are).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from helpers import make_method

from fglrepro import models
from fglrepro.components.prototypes import prototype_alignment_loss
from fglrepro.config import EvalConfig, ModelConfig
from fglrepro.fl import grouped
from fglrepro.fl.checkpoint import Checkpoint
from fglrepro.fl.grouped import GroupedTraining, PerClient
from fglrepro.fl.loop import run_federation
from fglrepro.fl.losses import kl_divergence
from fglrepro.models import fast_kernels

#: The five architectures of FedGKC Table 1 (client k gets entry k mod 5), without dropout.
ZOO = ModelConfig(hidden=16, readout=True, dropout=0.0, clients=[
    {"arch": "gcn"}, {"arch": "gat"}, {"arch": "sage"}, {"arch": "gin"}, {"arch": "sgc", "hops": 2}])
NO_VIEWS = {"weak_edge_drop": 0.0, "weak_feature_mask": 0.0, "strong_edge_drop": 0.0, "strong_feature_mask": 0.0}
METHODS = [("fml", None), ("fedkd", None), ("fedgkc", NO_VIEWS), ("fedtgp", None), ("fedproto", None), ("fedppn", None),
           ("lg_fedavg", None)]


def run(data, name, hparams, path, rounds=3, model=ZOO, **train):
    """``name`` on 7 clients of ``data`` for ``rounds`` rounds, on the ``grouped`` or the
    ``per-client`` path (both with the fast kernels)."""
    train = {"optimizer": "sgd", **train}
    with fast_kernels(True), pytest.MonkeyPatch.context() as patch:
        patch.setattr(grouped, "grouped_enabled", lambda: path == "grouped")
        method = make_method(data, name, hparams, model=model, num_clients=7, rounds=rounds, **train)
        history = run_federation(method, rounds, EvalConfig(model="local"))
    return method, history


def parameter_gap(a, b) -> float:
    """Largest difference of any parameter of any client module (model and modules)."""
    gap = 0.0
    for sa, sb in zip(a.states, b.states, strict=True):
        pairs = [(sa.model, sb.model)] + [(sa.modules[n], sb.modules[n]) for n in sa.modules]
        for ma, mb in pairs:
            for p, q in zip(ma.parameters(), mb.parameters(), strict=True):
                gap = max(gap, (p - q).abs().max().item())
    return gap


def val_curve(history) -> list[float]:
    return [r["weighted"]["val_acc"] for r in history.rounds]


@pytest.mark.parametrize("name,hparams", METHODS)
@pytest.mark.parametrize("data", ["cora", "sbm"])
def test_grouped_path_trains_the_per_client_models(request, data, name, hparams):
    """Cora exercises the sparse first layer, the SBM graph's dense features the padded one."""
    graph = request.getfixturevalue(data)
    ref, ref_history = run(graph, name, hparams, "per-client")
    out, out_history = run(graph, name, hparams, "grouped")
    assert isinstance(out._grouped, GroupedTraining) and ref._grouped is False
    assert parameter_gap(ref, out) < 1e-6
    assert val_curve(out_history) == pytest.approx(val_curve(ref_history), abs=1e-6)
    losses = [r["train_loss"] for r in ref_history.rounds]
    assert [r["train_loss"] for r in out_history.rounds] == pytest.approx(losses, rel=1e-5)


#: FedGKC Table 2's model scales: SGC-2 and GCN-2/3 (the deeper one with jumping knowledge).
SCALES = ModelConfig(hidden=16, readout=True, dropout=0.0, clients=[
    {"arch": "sgc", "hops": 2}, {"arch": "gcn", "layers": 2}, {"arch": "gcn", "layers": 3, "jk": "max"}])


@pytest.mark.parametrize("name,model", [
    ("fiarse", SCALES), ("fml", SCALES),
    ("fml", ModelConfig(hidden=16, readout=True, dropout=0.0, clients=[{"arch": "gcn", "layers": 3, "jk": "cat"}])),
])
def test_grouped_path_of_deep_and_submodel_clients(cora, name, model):
    """Jumping-knowledge GCNs and FIARSE's importance-masked submodels (each client's rows of
    one stack at its own threshold) train as on the per-client path."""
    ref, ref_history = run(cora, name, None, "per-client", model=model)
    out, out_history = run(cora, name, None, "grouped", model=model)
    assert out.on_grouped_path and not ref.on_grouped_path
    assert parameter_gap(ref, out) < 1e-6
    assert val_curve(out_history) == pytest.approx(val_curve(ref_history), abs=1e-6)


@pytest.mark.parametrize("name,hparams", [("fml", None), ("fedgkc", NO_VIEWS)])
def test_grouped_path_with_partial_participation(cora, name, hparams):
    """Only the sampled clients' rows train; the others keep their parameters."""
    ref, ref_history = run(cora, name, hparams, "per-client", participation=0.5)
    out, out_history = run(cora, name, hparams, "grouped", participation=0.5)
    assert [r["upload_bytes"] for r in out_history.rounds] == [r["upload_bytes"] for r in ref_history.rounds]
    assert parameter_gap(ref, out) < 1e-6


def test_grouped_path_keeps_each_clients_adam_state(cora):
    """With Adam (the studies' optimiser) one round still agrees: every client's modules
    step with their own moments, as their per-client optimiser does."""
    ref, ref_history = run(cora, "fml", None, "per-client", rounds=1, optimizer="adam")
    out, out_history = run(cora, "fml", None, "grouped", rounds=1, optimizer="adam")
    assert parameter_gap(ref, out) < 1e-4
    assert val_curve(out_history) == pytest.approx(val_curve(ref_history), abs=1e-6)


def test_fedgkc_views_and_dropout_run_on_the_grouped_path(cora):
    """With its random views and dropout FedGKC draws other random numbers on the grouped
    path, so only the process is the same: it trains (loss falls) and its modules stay the
    clients' own."""
    model = ModelConfig(hidden=16, readout=True, dropout=0.5, clients=ZOO.clients)
    method, history = run(cora, "fedgkc", None, "grouped", rounds=4, model=model, optimizer="adam")
    losses = [r["train_loss"] for r in history.rounds]
    assert losses[-1] < losses[0]

    def storages(k):
        return [p.untyped_storage().data_ptr() for p in method.states[k].model.parameters()]

    assert storages(0) == storages(5) and storages(1) == storages(6)   # one stack per architecture
    assert not set(storages(0)) & set(storages(1))


def test_a_killed_grouped_run_resumes_from_its_checkpoint_with_the_uninterrupted_numbers(sbm, tmp_path):
    """The stacks, the clients' views of them and the stacked optimiser state survive a
    checkpoint (FedGKC with dropout and random views: the random state too)."""
    model = ModelConfig(hidden=16, readout=True, dropout=0.5, clients=ZOO.clients)

    def build():
        return make_method(sbm, "fedgkc", model=model, num_clients=5, rounds=5)

    def killed(record):
        if record["round"] == 3:
            raise KeyboardInterrupt

    evaluation = EvalConfig(model="local")
    with fast_kernels(True), pytest.MonkeyPatch.context() as patch:
        patch.setattr(models, "_fast_dropout", True)
        expected = run_federation(build(), 5, evaluation)
        path = tmp_path / "run.json.ckpt"
        with pytest.raises(KeyboardInterrupt):
            run_federation(build(), 5, evaluation, on_round=killed, checkpoint=Checkpoint(path, "id", every_s=0))
        torch.manual_seed(123)
        checkpoint = Checkpoint(path, "id", every_s=0)
        resumed = run_federation(build(), 5, evaluation, checkpoint=checkpoint)
    assert checkpoint.resumed_round == 2
    assert resumed.rounds == expected.rounds


def test_unsupported_architecture_keeps_the_per_client_path(cora):
    """A zoo entry without a grouped forward (an MLP) sends the whole method down the
    per-client path."""
    model = ModelConfig(hidden=16, readout=True, dropout=0.0, clients=[{"arch": "gcn"}, {"arch": "mlp"}])
    method, history = run(cora, "fml", None, "grouped", rounds=2, model=model)
    assert method._grouped is None and not method.on_grouped_path
    assert all(s.optimizer is not None for s in method.states)
    assert len(history.rounds) == 2


@pytest.mark.parametrize("path", ["grouped", "per-client"])
def test_the_run_names_the_path_its_local_steps_took(cora, path):
    """``on_grouped_path`` (the run JSON's ``engine: grouped``) is true exactly when the
    steps ran grouped."""
    method, _ = run(cora, "fml", None, path, rounds=1)
    assert method.on_grouped_path == (path == "grouped")


def test_per_client_terms_equal_each_clients_own_loss():
    """:class:`PerClient` reduces each term per client exactly as the one-client terms do."""
    torch.manual_seed(0)
    client = torch.tensor([0, 0, 0, 1, 1, 2, 2, 2, 2])
    a, b = torch.randn(9, 5), torch.randn(9, 5)
    labels = torch.randint(0, 5, (9,))
    terms = PerClient(client, 3)
    for i in range(3):
        rows = client == i
        assert terms.cross_entropy(a, labels)[i] == pytest.approx(float(F.cross_entropy(a[rows], labels[rows])))
        assert terms.kl(a, b)[i] == pytest.approx(float(kl_divergence(a[rows], b[rows])))
        assert terms.mse(a, b)[i] == pytest.approx(float(F.mse_loss(a[rows], b[rows])))


def test_per_client_prototype_alignment_counts_classes_per_client():
    torch.manual_seed(0)
    client = torch.tensor([0, 0, 0, 1, 1, 1])
    hidden, labels = torch.randn(6, 4), torch.tensor([0, 0, 1, 0, 1, 1])
    prototypes, present = torch.randn(3, 4), torch.tensor([True, True, False])
    per_client = prototype_alignment_loss(hidden, labels, prototypes, present, PerClient(client, 2))
    for i in range(2):
        rows = client == i
        alone = prototype_alignment_loss(hidden[rows], labels[rows], prototypes, present)
        assert per_client[i] == pytest.approx(float(alone))


def test_fedgkc_grouped_self_distillation_detaches_the_weak_view(cora, monkeypatch):
    """SMKD's teacher on the grouped path: the weak view's outputs carry no graph (no gradient
    reaches the model through them), the strong view's do."""
    hp = {"weak_edge_drop": 0.3, "weak_feature_mask": 0.3, "strong_edge_drop": 0.8, "strong_feature_mask": 0.5}
    seen = {}
    forward = grouped.GroupedRole.forward

    def recording(self, training=True, perturb=None):
        out = forward(self, training, perturb)
        if perturb is not None:
            seen.setdefault(perturb, []).append(out[1].requires_grad)
        return out

    monkeypatch.setattr(grouped.GroupedRole, "forward", recording)
    method, _ = run(cora, "fedgkc", hp, "grouped", rounds=1)
    assert method.on_grouped_path
    assert seen[(0.3, 0.3)] and not any(seen[(0.3, 0.3)])
    assert seen[(0.8, 0.5)] and all(seen[(0.8, 0.5)])
