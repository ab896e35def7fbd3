"""FedStar's fast first feature convolution (weight split by input columns, sparse product on
the bag-of-words part) against the concatenation of the sequential path."""

from __future__ import annotations

import torch

from fglrepro.components.generator import knn_pseudo_graph
from fglrepro.methods.fedstar import DecoupledGCN
from fglrepro.models import fast_kernels, sparse_rows


def test_split_first_convolution_equals_the_concatenated_one_with_gradients():
    gen = torch.Generator().manual_seed(0)
    torch.manual_seed(0)
    model = DecoupledGCN(200, 4, 16, 3, layers=2, dropout=0.0)
    features = (torch.rand(40, 200, generator=gen) < 0.02).float()
    x = torch.cat([features, torch.rand(40, 4, generator=gen)], dim=1)
    adj = knn_pseudo_graph(x, 3)
    outputs = []
    for fast in (False, True):
        with fast_kernels(fast):
            assert (sparse_rows(x) is not None) == fast  # the fast path really reads sparse rows
            logits = model(x, adj)
            grads = torch.autograd.grad((logits * torch.arange(3.0)).sum(), list(model.parameters()))
            outputs.append((logits.detach(), grads))
    (slow, slow_grads), (quick, quick_grads) = outputs
    torch.testing.assert_close(quick, slow, rtol=1e-5, atol=1e-6)
    for a, b in zip(quick_grads, slow_grads):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
