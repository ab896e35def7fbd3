"""DENSE and Co-Boost: server-side ensemble distillation with generated node features."""

from __future__ import annotations

import copy

import pytest
import torch
from helpers import all_clients, make_method, received_models

from fglrepro.components.generator import Teachers, distill_students, knn_pseudo_graph
from fglrepro.config import ConfigError, EvalConfig, from_dict
from fglrepro.fl.clients import normalized_adjacency
from fglrepro.fl.kernel_optimizer import KernelOptimizer
from fglrepro.fl.loop import run_federation
from fglrepro.fl.losses import kl_divergence
from fglrepro.fl.training import Diverged
from fglrepro.methods.coboost import project_to_simplex
from fglrepro.methods.dense import DENSEHparams, boundary_adversarial_loss


class LinearStudent(torch.nn.Linear):
    """A student of the distillation loop that ignores the graph: ``(x [B, F], adj) -> x W^T + b``."""

    def forward(self, x, adj):
        return super().forward(x)


def trained_teachers(method):
    uploads = all_clients(method, 1)
    return uploads, [method.teacher_model(k, u).eval().requires_grad_(False) for k, u in uploads.items()]


def test_distillation_kl_is_zero_for_equal_logits_and_positive_otherwise():
    logits = torch.randn(6, 4)
    assert kl_divergence(logits, logits, 20.0).abs() < 1e-5
    assert kl_divergence(logits, logits.flip(0), 20.0) > 0


def test_kl_divergence_by_hand_and_with_probability_targets():
    gen = torch.Generator().manual_seed(0)
    target, student = torch.randn(6, 4, generator=gen), torch.randn(6, 4, generator=gen)
    for temperature in (1.0, 20.0):
        p = torch.softmax(target / temperature, dim=-1)
        log_q = torch.log_softmax(student / temperature, dim=-1)
        per_node = (p * (p.log() - log_q)).sum(dim=-1)
        got = kl_divergence(target, student, temperature)
        assert torch.allclose(got, per_node.mean(), atol=1e-6)  # batchmean: sum over nodes / B
        terms = kl_divergence(target, student, temperature, reduction="none")
        assert terms.shape == (6, 4) and torch.allclose(terms.sum(dim=-1), per_node, atol=1e-6)
        as_probs = kl_divergence(target, student, temperature, reduction="none", log_target=False)
        assert torch.allclose(as_probs, terms, atol=1e-6)


def test_boundary_term_counts_only_nodes_where_ensemble_and_student_agree():
    ensemble = torch.tensor([[2.0, 0.0], [0.0, 2.0]])
    student = torch.tensor([[1.0, 0.0], [1.0, 0.0]])  # agrees on node 0 only
    kl0 = torch.nn.functional.kl_div(student[:1].log_softmax(-1), ensemble[:1].log_softmax(-1),
                                     reduction="sum", log_target=True)
    assert torch.allclose(boundary_adversarial_loss(student, ensemble), -kl0 / 2)
    assert boundary_adversarial_loss(student[1:], ensemble[1:]) == 0


def test_dense_ensemble_is_the_mean_of_the_teachers_logits(sbm):
    method = make_method(sbm, "dense", {"distill_epochs": 1}, rounds=1)
    _, teachers = trained_teachers(method)
    x = torch.randn(20, sbm.num_features)
    adj = knn_pseudo_graph(x, 3)
    expected = torch.stack([t(x, adj) for t in teachers]).mean(0)
    assert torch.allclose(method.ensemble(Teachers(teachers), x, adj), expected, atol=1e-6)


@pytest.mark.parametrize("name", ["dense", "coboost"])
def test_distillation_moves_the_student_towards_the_ensemble(sbm, name):
    """Distilled on generated nodes only, the student comes closer to the ensemble on the real graph."""
    method = make_method(sbm, name, {"distill_epochs": 30, "num_pseudo_nodes": 40}, rounds=1)
    uploads, teachers = trained_teachers(method)
    adj = normalized_adjacency(sbm.edge_index, sbm.num_nodes)
    target = method.ensemble(Teachers(teachers), sbm.x, adj).detach()
    fresh = copy.deepcopy(method.federation.model).eval()  # the student before distillation
    before = kl_divergence(target, fresh(sbm.x, adj))
    method.server_update(1, uploads)
    student = method.states[0].received
    assert all(model is student for model in received_models(method))  # one global student
    assert method.server_models() == [student]
    after = kl_divergence(target, student.eval()(sbm.x, adj))
    assert after < 0.7 * before


def test_personal_students_start_from_each_clients_own_upload(sbm):
    method = make_method(sbm, "dense", {"student": "personal", "distill_epochs": 0}, rounds=1)
    uploads, _ = trained_teachers(method)
    method.server_update(1, uploads)
    for k, upload in uploads.items():
        assert method.eval_model(k, "global") is method.states[k].received
        for name, p in method.eval_model(k, "global").named_parameters():
            assert torch.equal(p, upload.params[name])


@pytest.mark.parametrize("name", ["dense", "coboost"])
def test_one_shot_ft_uploads_and_downloads_the_model_once(sbm, name):
    method = make_method(sbm, "finetune", {"base": name, "base_hparams": {"distill_epochs": 2}, "epochs": 3}, rounds=1)
    history = run_federation(method, 1, EvalConfig())
    record = history.rounds[0]
    params = sum(p.numel() * 4 for p in method.federation.model.parameters())
    assert record["upload_bytes"] == [params] * 3 and record["download_bytes"] == [params] * 3


def test_projection_onto_the_simplex():
    w = project_to_simplex(torch.tensor([0.5, -0.2, 1.5]))
    assert torch.allclose(w, torch.tensor([0.25, 0.0, 0.75]))
    assert torch.allclose(project_to_simplex(torch.tensor([-1.0, -2.0])), torch.tensor([0.5, 0.5]))


def test_coboost_raises_the_weight_of_the_teacher_that_predicts_the_requested_labels(sbm):
    method = make_method(sbm, "coboost", {"weight_lr": 0.1, "num_pseudo_nodes": 8}, rounds=1)
    labels = method.pseudo_labels

    class Fixed(torch.nn.Module):
        def __init__(self, logits):
            super().__init__()
            self.logits = logits

        def forward(self, x, adj):
            return self.logits

    right = Fixed(torch.nn.functional.one_hot(labels, method.num_classes).float() * 5)
    wrong = Fixed(torch.nn.functional.one_hot((labels + 1) % method.num_classes, method.num_classes).float() * 5)
    x = torch.randn(labels.numel(), sbm.num_features)
    method.update_weights(Teachers([right, wrong]), x, knn_pseudo_graph(x, 3))
    assert torch.allclose(method.weights, torch.tensor([0.6, 0.4]))


def test_coboost_hard_samples_increase_the_disagreement(sbm):
    method = make_method(sbm, "coboost", {"hard_eps": 0.05}, rounds=1)
    _, models = trained_teachers(method)
    teachers = Teachers(models)
    student = method.federation.model
    x = torch.randn(30, sbm.num_features, generator=torch.Generator().manual_seed(2))
    adj = knn_pseudo_graph(x, 3)

    def disagreement(nodes):
        return kl_divergence(method.ensemble(teachers, nodes, adj), student(nodes, adj))

    hard = method.hard_samples([student], teachers, x, adj)
    assert hard.shape == x.shape and not torch.equal(hard, x)
    assert disagreement(hard) > disagreement(x)
    method = make_method(sbm, "coboost", {"hard_eps": 0.0}, rounds=1)
    assert torch.equal(method.hard_samples([student], teachers, x, adj), x)


def test_bad_hparams_name_the_key():
    with pytest.raises(ConfigError, match="hparams.student"):
        from_dict(DENSEHparams, {"student": "shared"}, "hparams of dense")


def test_a_student_whose_distillation_loss_is_not_finite_stops_the_run_there():
    """Data-free distillation that blows up (a student's logits reach inf) raises Diverged in the
    server step, naming the student and the epoch, instead of handing NaN weights to the clients."""
    students = [LinearStudent(4, 3), LinearStudent(4, 3)]
    optimizers = [KernelOptimizer(s.parameters(), lr=0.1) for s in students]
    calls = []

    def loss(logits, target):
        calls.append(len(calls))
        scale = float("inf") if len(calls) > 5 else 1.0  # the second student's first epoch
        return (logits * scale - target).square().mean()

    batches = {"draw_batch": lambda: (torch.randn(8, 4), None), "targets": lambda x, adj: torch.zeros(8, 3)}
    with pytest.raises(Diverged, match=r"student 1's loss became (nan|inf) in distillation epoch 1 of 3"):
        distill_students(students, optimizers, epochs=3, steps=3, student_loss=loss, **batches)
    before = [p.detach().clone() for p in students[0].parameters()]
    distill_students(students, optimizers, epochs=2, steps=0, student_loss=loss, **batches)  # no step: no check
    assert all(torch.equal(a, b) for a, b in zip(before, students[0].parameters()))


def test_clipped_student_steps_move_at_most_lr_times_the_clip_norm():
    """``clip_norm``: each SGD step of a student moves its parameters by lr times its gradient
    rescaled to that L2 norm; a norm above every gradient's leaves the steps as unclipped."""
    x = torch.randn(8, 4, generator=torch.Generator().manual_seed(0)) * 100  # large inputs: large gradients
    batches = {"draw_batch": lambda: (x, None), "targets": lambda x, adj: torch.zeros(8, 3)}

    def trained(clip_norm):
        torch.manual_seed(0)
        student = LinearStudent(4, 3)
        start = torch.cat([p.detach().flatten() for p in student.parameters()])
        optimizer = KernelOptimizer(student.parameters(), lr=0.1, momentum=0.0)
        distill_students([student], [optimizer], epochs=1, steps=1, clip_norm=clip_norm,
                         student_loss=lambda logits, target: (logits - target).square().mean(), **batches)
        return torch.cat([p.detach().flatten() for p in student.parameters()]) - start

    unclipped, clipped = trained(0.0), trained(5.0)
    assert unclipped.norm() > 0.1 * 5.0  # the clip below binds
    assert torch.allclose(clipped.norm(), torch.tensor(0.1 * 5.0), rtol=1e-5)
    assert torch.allclose(clipped, unclipped * (0.5 / unclipped.norm()), rtol=1e-4, atol=1e-6)
    assert torch.equal(trained(1e9), unclipped)


def test_negative_student_clip_is_refused_with_its_key():
    with pytest.raises(ConfigError, match="hparams.student_clip"):
        from_dict(DENSEHparams, {"student_clip": -1.0}, "hparams of dense")


@pytest.mark.parametrize("name", ["dense", "coboost"])
def test_a_clip_above_every_gradient_distils_as_no_clip(sbm, name):
    def distilled(clip):
        method = make_method(sbm, name, {"distill_epochs": 3, "num_pseudo_nodes": 40, "student_clip": clip}, rounds=1)
        method.server_update(1, all_clients(method, 1))
        return [p.detach() for p in method.server_models()[0].parameters()]

    unclipped = distilled(0.0)
    assert all(torch.equal(a, b) for a, b in zip(unclipped, distilled(1e9)))
    assert not all(torch.equal(a, b) for a, b in zip(unclipped, distilled(1e-3)))  # a clip that binds
