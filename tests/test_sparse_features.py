"""The fast kernels of the model zoo (:func:`fglrepro.models.set_fast_kernels`): sparse
first-layer products on bag-of-words features and cached propagation give the dense
operations' outputs and gradients, and are not used when switched off."""

from __future__ import annotations

import gc

import pytest
import torch
import torch.nn.functional as F
from conftest import make_sbm
from helpers import make_method

from fglrepro import models, sparse
from fglrepro.config import EvalConfig, ModelConfig, from_dict
from fglrepro.fl.clients import normalized_adjacency
from fglrepro.fl.loop import run_federation
from fglrepro.models import (
    build_model,
    fast_kernels,
    feature_linear,
    propagated,
    share_sparsity,
    sparse_rows,
)

#: Every architecture of the zoo, with and without readout where it has one.
ZOO = [
    {"arch": "gcn"}, {"arch": "gcn", "readout": True}, {"arch": "gcn", "layers": 3, "readout": True, "jk": "cat"},
    {"arch": "mlp"}, {"arch": "mlp", "readout": True, "layers": 1},
    {"arch": "sgc", "hops": 2}, {"arch": "sgc", "hops": 2, "readout": True}, {"arch": "sgc", "hops": 0},
    {"arch": "ssgc", "hops": 3}, {"arch": "appnp", "hops": 3},
    {"arch": "gat"}, {"arch": "gat", "readout": True}, {"arch": "sage"}, {"arch": "sage", "layers": 1},
    {"arch": "gin"}, {"arch": "gin", "readout": True},
]
#: FedGKC's divergent zoo (client k gets architecture k mod 5).
DIVERGENT = [{"arch": "gcn"}, {"arch": "gat"}, {"arch": "sage"}, {"arch": "gin"}, {"arch": "sgc", "hops": 2}]


def bag_of_words(num_nodes: int = 40, num_words: int = 60, density: float = 0.05, seed: int = 0) -> torch.Tensor:
    """Dense ``[n, F]`` 0/1 features with about ``density`` of the entries set (some rows empty)."""
    gen = torch.Generator().manual_seed(seed)
    x = (torch.rand(num_nodes, num_words, generator=gen) < density).float()
    x[:3] = 0.0
    return x


def random_operator(num_nodes: int = 40, seed: int = 0) -> torch.Tensor:
    """Normalised adjacency of a random undirected graph (the last node isolated)."""
    gen = torch.Generator().manual_seed(seed)
    edges = torch.randint(0, num_nodes - 1, (2, 3 * num_nodes), generator=gen)
    edges = torch.cat([edges, edges.flip(0)], dim=1)
    return normalized_adjacency(edges[:, edges[0] != edges[1]].unique(dim=1), num_nodes)


@pytest.fixture
def sparse_products(monkeypatch) -> list[int]:
    """Counts the sparse products (one entry per call)."""
    calls, apply = [], sparse._SparseMatmul.apply

    def counted(*args):
        calls.append(1)
        return apply(*args)

    monkeypatch.setattr(sparse._SparseMatmul, "apply", counted)
    return calls


def forward_and_gradients(model: torch.nn.Module, x: torch.Tensor, adj: torch.Tensor, seed: int = 3):
    """``(hidden, logits, parameter gradients)`` of one training-mode forward and backward
    (dropout drawn from ``seed``)."""
    model.zero_grad()
    torch.manual_seed(seed)
    hidden, logits = model(x, adj, return_hidden=True)
    upstream = torch.randn(logits.shape, generator=torch.Generator().manual_seed(1))
    (logits * upstream).sum().backward()
    return hidden, logits, [p.grad.clone() for p in model.parameters()]


@pytest.mark.parametrize("spec", ZOO, ids=lambda s: "-".join(f"{v}" for v in s.values()))
def test_every_architecture_gives_the_dense_outputs_and_gradients_with_sparse_products(spec, sparse_products):
    x, adj = bag_of_words(), random_operator()
    torch.manual_seed(0)
    model = build_model(from_dict(ModelConfig, {"hidden": 16, **spec}, "model"), 60, 4).train()
    hidden, logits, grads = forward_and_gradients(model, x, adj)
    assert not sparse_products
    with fast_kernels():
        fast_hidden, fast_logits, fast_grads = forward_and_gradients(model, x, adj)
        model.eval()
        with torch.no_grad():
            eval_logits = model(x, adj)
        smoothed_again = model(x, adj, return_hidden=True)[0]
    if spec["arch"] == "ssgc":  # dense smoothed features: computed once, multiplied densely
        assert smoothed_again is fast_hidden and not sparse_products
    else:
        assert sparse_products  # the fast path ran
    assert torch.allclose(fast_logits, logits, atol=1e-5) and torch.allclose(fast_hidden, hidden, atol=1e-5)
    assert all(torch.allclose(a, b, atol=1e-5) for a, b in zip(fast_grads, grads))
    assert torch.allclose(eval_logits, model(x, adj), atol=1e-5)


@pytest.mark.parametrize("arch", ["sage", "gin"])
@pytest.mark.parametrize("hidden", [16, 80])
def test_sage_and_gin_aggregate_dense_features_after_a_narrowing_first_map(arch, hidden, monkeypatch):
    """Dense features (30 % non-zero, a gradient-requiring copy too): with the fast kernels the first
    layer's messages are ``hidden`` wide where that is narrower than the 60 features, else PyG's ``F``
    wide; outputs and gradients as without them."""
    x, adj = bag_of_words(density=0.3), random_operator()
    assert sparse_rows(x) is None
    torch.manual_seed(0)
    model = build_model(from_dict(ModelConfig, {"arch": arch, "hidden": hidden}, "model"), 60, 4).train()
    widths = []
    propagate = type(model.convs[0]).propagate

    def recorded(conv, edge_index, **kwargs):
        widths.append(kwargs["x"][0].size(-1))
        return propagate(conv, edge_index, **kwargs)

    monkeypatch.setattr(type(model.convs[0]), "propagate", recorded)
    hidden_out, logits, grads = forward_and_gradients(model, x, adj)
    assert widths[0] == 60
    widths.clear()
    with fast_kernels():
        fast_hidden, fast_logits, fast_grads = forward_and_gradients(model, x, adj)
        model.eval()
        leaf = x.clone().requires_grad_()
        model(leaf, adj).square().sum().backward()
    assert widths[0] == min(hidden, 60)
    assert torch.allclose(fast_logits, logits, atol=1e-5) and torch.allclose(fast_hidden, hidden_out, atol=1e-5)
    assert all(torch.allclose(a, b, atol=1e-5) for a, b in zip(fast_grads, grads))
    dense_leaf = x.clone().requires_grad_()
    model(dense_leaf, adj).square().sum().backward()
    assert torch.allclose(leaf.grad, dense_leaf.grad, atol=1e-5)


def test_sgc_returning_its_propagated_features_computes_them(sparse_products):
    x, adj = bag_of_words(), random_operator()
    model = build_model(ModelConfig(arch="sgc", hops=2), 60, 4)
    with fast_kernels():
        hidden, logits = model(x, adj, return_hidden=True)
    dense = adj.to_dense()
    assert torch.allclose(hidden, dense @ dense @ x, atol=1e-6)
    assert torch.allclose(logits, model.linear(hidden), atol=1e-5)


def test_sparse_rows_are_built_once_per_unchanged_tensor_and_only_for_sparse_inputs_without_gradient():
    x = bag_of_words()
    assert sparse_rows(x) is None  # kernels off
    with fast_kernels():
        rows = sparse_rows(x)
        assert rows is sparse_rows(x)
        assert torch.equal(rows.transposed().matmul(torch.eye(x.size(0))), x.t())
        assert sparse_rows(x.clone().requires_grad_()) is None
        assert sparse_rows(torch.ones(4, 10)) is None
        assert sparse_rows(torch.eye(20)) is not None  # 5 % non-zero
        x[5, 7] = 2.0  # in place: a new version
        changed = sparse_rows(x)
        assert changed is not rows and torch.equal(changed.transposed().matmul(torch.eye(x.size(0))), x.t())
        gc.collect()  # entries of earlier tests' unreachable tensors leave first
        entries = len(models._MEMO._entries)
        del x, rows, changed
        gc.collect()
        assert len(models._MEMO._entries) == entries - 1


def test_an_input_requiring_gradient_takes_the_dense_product_and_gets_its_gradient(sparse_products):
    x = bag_of_words().requires_grad_()
    weight = torch.randn(8, 60, requires_grad=True)
    with fast_kernels():
        feature_linear(x, weight).square().sum().backward()
    assert not sparse_products
    assert torch.allclose(x.grad, 2 * (x @ weight.t()) @ weight)


def test_a_masked_copy_reads_its_sparse_form_off_its_source(sparse_products):
    x = bag_of_words()
    keep = (torch.rand(60, generator=torch.Generator().manual_seed(2)) >= 0.5).float()
    weight = torch.randn(8, 60, requires_grad=True)
    with fast_kernels():
        masked = share_sparsity(x * keep, x)
        rows = sparse_rows(masked)
        assert rows.columns is sparse_rows(x).columns  # the source's pattern, not a new scan
        out = feature_linear(masked, weight)
        out.square().sum().backward()
    assert sparse_products
    expected = F.linear(x * keep, weight.detach())
    assert torch.allclose(out, expected, atol=1e-6)
    assert torch.allclose(weight.grad, 2 * expected.t() @ (x * keep), atol=1e-5)


def test_propagation_is_cached_per_unchanged_input_pair_only_with_the_kernels_on():
    x, adj = bag_of_words(), random_operator()
    calls = []

    def compute():
        calls.append(1)
        return adj @ x

    propagated(("test",), x, adj, compute)
    propagated(("test",), x, adj, compute)
    assert len(calls) == 2
    with fast_kernels():
        first = propagated(("test",), x, adj, compute)
        assert propagated(("test",), x, adj, compute) is first and len(calls) == 3
        x.mul_(2.0)
        assert torch.allclose(propagated(("test",), x, adj, compute), 2 * first) and len(calls) == 4
        propagated(("test",), x.requires_grad_(), adj, compute)
        assert len(calls) == 5


def test_fast_kernels_is_scoped():
    with fast_kernels():
        with fast_kernels(False):
            assert not models._fast_kernels
        assert models._fast_kernels
    assert not models._fast_kernels


def test_a_round_of_fedgkc_on_the_divergent_zoo_trains_the_same_with_sparse_products(sparse_products):
    data = make_sbm(num_features=80)
    data.x = (torch.rand(data.x.shape, generator=torch.Generator().manual_seed(0)) < 0.04).float()
    data.x[torch.arange(data.num_nodes), data.y * 7] = 1.0  # a word of each node's class
    zoo = ModelConfig(hidden=16, readout=True, clients=DIVERGENT)

    def one_round(fast: bool) -> list[torch.Tensor]:
        method = make_method(data, "fedgkc", num_clients=5, model=zoo, rounds=1)
        with fast_kernels(fast):
            run_federation(method, 1, EvalConfig(model="local"))
        return [p.detach().clone() for state in method.states for p in state.model.parameters()]

    dense = one_round(False)
    assert not sparse_products
    fast = one_round(True)
    assert sparse_products
    assert all(torch.allclose(a, b, rtol=0, atol=1e-5) for a, b in zip(fast, dense))  # parameters ~0.1


@pytest.mark.parametrize("symmetric", [True, False])
def test_propagation_over_a_symmetric_operator_skips_the_transposition_with_the_same_gradient(symmetric, monkeypatch):
    """With the fast kernels a symmetric CSR operator passes ``A G`` as the gradient (checked once per
    operator), bit for bit autograd's ``A^T G``; a directed one keeps autograd's product."""
    adj = random_operator()
    if not symmetric:
        adj = (adj.to_dense() * torch.linspace(0.5, 1.5, 40)).to_sparse_csr()  # rows rescaled: A != A^T
    applied, checks, apply, check = [], [], sparse._SymmetricPropagation.apply, models.is_symmetric
    monkeypatch.setattr(sparse._SymmetricPropagation, "apply", lambda *a: applied.append(1) or apply(*a))
    monkeypatch.setattr(models, "is_symmetric", lambda a: checks.append(1) or check(a))
    h = torch.randn(40, 8, requires_grad=True)
    upstream = torch.randn(40, 8)
    (expected,) = torch.autograd.grad(models.propagate_once(adj, h), h, upstream)
    assert not applied and not checks
    with fast_kernels():
        for _ in range(2):
            (fast,) = torch.autograd.grad(models.propagate_once(adj, h), h, upstream)
            assert torch.equal(fast, expected)
    assert len(applied) == (2 if symmetric else 0) and len(checks) == 1
    torch.testing.assert_close(expected, adj.to_dense().t() @ upstream)


@pytest.mark.parametrize("width", [40, 4000])
def test_the_weight_gradient_of_binary_features_is_the_csr_product_bit_for_bit(width):
    """0/1 features take the embedding-bag path for ``X^T G``: the CSR product's exact values, with
    every row of ``X^T`` kept (width 40) or only the non-empty ones (4000); other values keep the CSR path."""
    generator = torch.Generator().manual_seed(0)
    x = (torch.rand(50, width, generator=generator) < 8 / width).float()
    grad = torch.randn(50, 16, generator=generator)
    transpose = sparse.SparseRows.of(x).transposed()
    assert transpose.binary and (transpose.rows is None) == (width == 40)
    product = transpose.matmul(grad)
    csr = torch.mm(transpose.csr, grad)
    expected = csr if transpose.rows is None else torch.zeros(width, 16).index_copy_(0, transpose.rows, csr)
    assert torch.equal(product, expected)
    torch.testing.assert_close(product, x.t() @ grad)
    weighted = sparse.SparseRows.of(x * 0.5).transposed()
    assert not weighted.binary
    torch.testing.assert_close(weighted.matmul(grad), 0.5 * x.t() @ grad)


def test_sparse_rows_of_stacked_blocks_are_those_of_their_concatenation():
    """``SparseRows.concatenated`` (ClientBatch.of's sparse features without the dense union) gives the
    entries ``SparseRows.of`` gives on the concatenated blocks, row empty or not."""
    generator = torch.Generator().manual_seed(0)
    blocks = [torch.rand(n, 7, generator=generator) * (torch.rand(n, 7, generator=generator) < 0.2) for n in (5, 1, 9)]
    blocks[2][3] = 0
    expected, got = sparse.SparseRows.of(torch.cat(blocks)), sparse.SparseRows.concatenated(blocks)
    assert got.shape == expected.shape == (15, 7)
    for name in ("rows", "columns", "values", "offsets"):
        assert torch.equal(getattr(got, name), getattr(expected, name)), name


@pytest.mark.parametrize("density", [0.05, 0.5])
def test_a_client_union_concatenates_its_features_only_when_read(density):
    """The engines read a union's sparse or padded features; the dense ``x [N, F]`` is made on first
    read (equal to the clients' concatenation) and not held before."""
    from fglrepro.fl.engine import ClientBatch

    clients = make_method(make_sbm(), "fedavg").federation.clients
    for c in clients:
        c.x = c.x * (torch.rand(c.x.shape) < density)
    batch = ClientBatch.of(clients, [0, 1, 2])
    assert batch._x is None and (batch.shared is None) == (density > 0.1)
    if batch.x_pad is not None:
        assert torch.equal(batch.unpad(batch.x_pad), torch.cat([c.x for c in clients]))
    assert torch.equal(batch.x, torch.cat([c.x for c in clients])) and batch._x is batch.x
