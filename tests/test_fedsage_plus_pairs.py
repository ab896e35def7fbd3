"""FedSage+ computes only what it reads: the greedy loss only at its (node, slot, true
neighbour) triples, a local step's mended graph only from the fGen rows it ran on; both give
the dense computations' numbers."""

from __future__ import annotations

import pytest
import torch

from fglrepro.methods.fedsage_plus.neighbor_generation import greedy_feature_loss, mend_graph


def dense_greedy_loss(pred_feat, true_feat, pred_count, true_count):
    """The greedy loss over all ``n * P * P`` distances (the formula of OpenFGL's ``greedy_loss``)."""
    n, num_pred = pred_feat.shape[:2]
    slots = torch.arange(num_pred)
    true_count = true_count.clamp(max=num_pred)
    pred_count = pred_count.detach().long().clamp(0, num_pred)
    dist = (pred_feat.unsqueeze(2) - true_feat.unsqueeze(1)).pow(2).mean(-1)
    dist = dist.masked_fill(~(slots < true_count[:, None])[:, None, :], float("inf"))
    best = dist.min(-1).values
    active = (slots < pred_count[:, None]) & (true_count[:, None] > 0)
    return torch.where(active, best, torch.zeros_like(best)).sum() / (n * num_pred)


@pytest.mark.parametrize("features", [3, 1433])
def test_greedy_loss_on_its_triples_equals_the_dense_loss_and_gradient(features):
    gen = torch.Generator().manual_seed(0)
    n, num_pred = 40, 4
    pred = torch.rand(n, num_pred, features, generator=gen, requires_grad=True)
    true = torch.rand(n, num_pred, features, generator=gen)
    pred_count = torch.rand(n, generator=gen) * 6  # 0..5.99: below, at and above P
    true_count = torch.randint(0, 7, (n,), generator=gen)  # some nodes lost no neighbour
    assert (true_count == 0).any() and (pred_count >= num_pred).any() and (true_count > num_pred).any()
    expected = dense_greedy_loss(pred, true, pred_count, true_count)
    (expected_grad,) = torch.autograd.grad(expected, pred)
    loss = greedy_feature_loss(pred, true, pred_count, true_count)
    (grad,) = torch.autograd.grad(loss, pred)
    torch.testing.assert_close(loss, expected, rtol=1e-6, atol=0)
    torch.testing.assert_close(grad, expected_grad, rtol=1e-6, atol=1e-12)
    assert expected.item() > 0 and grad.ne(0).any()


def test_greedy_loss_without_an_active_slot_is_zero_with_a_zero_gradient():
    pred = torch.rand(3, 2, 5, requires_grad=True)
    loss = greedy_feature_loss(pred, torch.rand(3, 2, 5), torch.tensor([0.0, 0.5, 2.0]), torch.tensor([4, 2, 0]))
    (grad,) = torch.autograd.grad(loss, pred)
    assert loss.item() == 0 and (grad == 0).all()


def test_mending_from_the_features_of_some_rows_equals_mending_with_zero_features_elsewhere():
    gen = torch.Generator().manual_seed(2)
    n, num_pred, features = 9, 3, 4
    x = torch.rand(n, features, generator=gen)
    edge_index = torch.tensor([[0, 1, 2, 3], [1, 0, 3, 2]])
    count = torch.tensor([0, 1, 3, 5, 2, 0, 1, 2, 3])
    rows = torch.tensor([1, 3, 4, 8])  # generated rows of nodes 1, 3, 4 and 8 only
    feat = torch.rand(rows.numel(), num_pred, features, generator=gen, requires_grad=True)
    full = torch.zeros(n, num_pred, features).index_copy(0, rows, feat)
    expected_x, expected_edges = mend_graph(x, edge_index, count, full)
    (expected_grad,) = torch.autograd.grad((expected_x ** 2).sum(), feat)
    got_x, got_edges = mend_graph(x, edge_index, count, feat, rows)
    (grad,) = torch.autograd.grad((got_x ** 2).sum(), feat)
    assert torch.equal(got_edges, expected_edges) and torch.equal(got_x, expected_x)
    assert torch.equal(grad, expected_grad)
    # nodes 2, 6 and 7 use slots without features: zero rows; node 1 uses its first slot
    assert got_x.size(0) == n + 1 + 3 + 3 + 2 + 1 + 2 + 3
    assert torch.equal(got_x[n], feat[0, 0].detach()) and (got_x[n + 1:n + 4] == 0).all()
