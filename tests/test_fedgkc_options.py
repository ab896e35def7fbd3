"""FedGKC's open choices (issue 24): the self-distillation teacher's mode, the nodes of the mutual KL
and the reduction of each node's neighbourhood in L_neigh (issue 28)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from helpers import hand_client, make_method
from test_fedgkc import DIVERGENT, random_graph
from test_grouped import NO_VIEWS, parameter_gap, run, val_curve

from fglrepro.config import ConfigError, ModelConfig
from fglrepro.fl import grouped
from fglrepro.fl.augment import perturbed_view
from fglrepro.fl.clients import normalized_adjacency
from fglrepro.fl.losses import kl_divergence, neighbourhood_kl
from fglrepro.methods.fedgkc import FedGKCHparams, mutual_losses, self_distillation_loss, self_distillation_terms


def test_mutual_kl_over_all_nodes_or_training_nodes():
    """``mutual_nodes: all`` takes the KL of eq. 2-3 over every node, the CE stays on the
    training nodes; with every node labelled both choices are the same loss."""
    gen = torch.Generator().manual_seed(4)
    edges = random_graph().tolist()
    x = torch.randn(9, 3, generator=gen)
    outputs = [(torch.randn(9, 5, generator=gen), torch.randn(9, 3, generator=gen)) for _ in range(2)]
    (_, logits_l), (_, logits_c) = outputs
    client = hand_client(x, [0, 1, 2] * 3, edges, [True, False] * 4 + [True], num_classes=3)
    mask, labels = client.train_mask, client.y[client.train_mask]
    loss_l, loss_c = mutual_losses(outputs[0], outputs[1], client, FedGKCHparams(beta=0.0, mutual_nodes="all"))
    ce_l, ce_c = F.cross_entropy(logits_l[mask], labels), F.cross_entropy(logits_c[mask], labels)
    assert torch.allclose(loss_l, 0.6 * ce_l + 0.4 * kl_divergence(logits_c, logits_l))
    assert torch.allclose(loss_c, 0.6 * ce_c + 0.4 * kl_divergence(logits_l, logits_c))
    trained = mutual_losses(outputs[0], outputs[1], client, FedGKCHparams(beta=0.0))
    assert not torch.allclose(trained[0], loss_l)
    labelled = hand_client(x, [0, 1, 2] * 3, edges, [True] * 9, num_classes=3)
    for a, b in zip(mutual_losses(outputs[0], outputs[1], labelled, FedGKCHparams(mutual_nodes="all")),
                    mutual_losses(outputs[0], outputs[1], labelled, FedGKCHparams())):
        assert torch.allclose(a, b)


def test_neighbourhood_mean_divides_each_node_by_its_neighbourhood_size():
    """``neighbour_reduction: mean``: ``1/n sum_i 1/(|N(i)|+1) sum_{j in N(i)+i} KL(z_j || h_i)``
    (an isolated node keeps its own term); the default sums, and ``mutual_losses`` passes the choice on."""
    gen = torch.Generator().manual_seed(5)
    teacher, student = torch.randn(9, 4, generator=gen), torch.randn(9, 4, generator=gen)
    edges = random_graph()
    adj = normalized_adjacency(edges, 9)
    expected = 0.0
    for i in range(9):
        neighbourhood = [i] + edges[0, edges[1] == i].tolist()
        expected += sum(float(kl_divergence(teacher[j], student[i], reduction="sum")) for j in neighbourhood) / len(
            neighbourhood)
    assert float(neighbourhood_kl(teacher, student, adj, reduction="mean")) == pytest.approx(expected / 9, rel=1e-5)
    assert float(neighbourhood_kl(teacher, student, adj)) > float(neighbourhood_kl(teacher, student, adj, "mean"))
    client = hand_client(torch.randn(9, 3, generator=gen), [0, 1, 2] * 3, edges.tolist(), [True] * 9, num_classes=3)
    outputs = [(torch.randn(9, 5, generator=gen), torch.randn(9, 3, generator=gen)) for _ in range(2)]
    (_, logits_l), (_, logits_c) = outputs
    for reduction in ("mean", "sum"):
        loss_l, _ = mutual_losses(outputs[0], outputs[1], client, FedGKCHparams(neighbour_reduction=reduction))
        without, _ = mutual_losses(outputs[0], outputs[1], client, FedGKCHparams(beta=0.0))
        neigh = neighbourhood_kl(logits_c, logits_l, client.adj, reduction)
        assert torch.allclose(loss_l - without, 0.2 * neigh - 0.2 * kl_divergence(logits_c, logits_l))


def test_eval_teacher_has_no_dropout_and_keeps_the_models_mode(sbm):
    """``teacher_mode: eval``: the weak view's teacher is the model in evaluation mode (here,
    without perturbation, its clean prediction), the student keeps its dropout, and the model
    is back in training mode afterwards; the default teacher runs in the model's mode."""
    model_config = ModelConfig(hidden=16, readout=True, dropout=0.5, clients=DIVERGENT.clients)
    method = make_method(sbm, "fedgkc", model=model_config, num_clients=5)
    client, model = method.clients[0], method.states[0].model.train()
    hp = FedGKCHparams(teacher_mode="eval", **NO_VIEWS)
    torch.manual_seed(0)
    loss = self_distillation_loss(model, client, hp)
    assert model.training
    torch.manual_seed(0)
    perturbed_view(client, 0.0, 0.0)
    x, adj = perturbed_view(client, 0.0, 0.0)
    with torch.no_grad():
        teacher = model.eval()(client.x, client.adj, return_hidden=True)
    expected = self_distillation_terms(teacher, model.train()(x, adj, return_hidden=True))
    assert torch.allclose(loss, expected)
    torch.manual_seed(0)
    assert not torch.allclose(self_distillation_loss(model, client, FedGKCHparams(**NO_VIEWS)), expected)
    model.eval()
    same = FedGKCHparams(**NO_VIEWS)
    assert float(self_distillation_loss(model, client, same).detach()) == pytest.approx(0.0, abs=1e-7)


def test_options_agree_on_the_grouped_path(cora, monkeypatch):
    """The grouped path computes the KL over all nodes and L_neigh's neighbourhood means as the
    per-client path does, and runs
    the weak view (only it) in evaluation mode with ``teacher_mode: eval``."""
    hparams = {"mutual_nodes": "all", "teacher_mode": "eval", "neighbour_reduction": "mean", **NO_VIEWS}
    ref, ref_history = run(cora, "fedgkc", hparams, "per-client")
    out, out_history = run(cora, "fedgkc", hparams, "grouped")
    assert parameter_gap(ref, out) < 1e-6
    assert val_curve(out_history) == pytest.approx(val_curve(ref_history), abs=1e-6)
    modes = {}
    forward = grouped.GroupedRole.forward

    def recording(self, training=True, perturb=None):
        if perturb is not None:
            modes.setdefault(perturb, set()).add(training)
        return forward(self, training, perturb)

    monkeypatch.setattr(grouped.GroupedRole, "forward", recording)
    views = {"weak_edge_drop": 0.3, "weak_feature_mask": 0.2, "strong_edge_drop": 0.8, "strong_feature_mask": 0.5}
    run(cora, "fedgkc", {"teacher_mode": "eval", **views}, "grouped", rounds=1)
    assert modes == {(0.3, 0.2): {False}, (0.8, 0.5): {True}}


@pytest.mark.parametrize("key", ["teacher_mode", "mutual_nodes", "neighbour_reduction"])
def test_unknown_choices_name_the_key(key):
    with pytest.raises(ConfigError, match=key):
        FedGKCHparams(**{key: "labelled"})
