"""Fed-PUB's batched fast path (vectorised engine) against the per-client computation, and
its proxy graph against PyG's generator."""

from __future__ import annotations

import pytest
import torch
from test_engine import federation
from torch_geometric.utils import stochastic_blockmodel_graph

from fglrepro.config import ModelConfig
from fglrepro.fl.aggregation import load_parameters
from fglrepro.fl.engine import BatchedEvaluator
from fglrepro.fl.loop import evaluate_each
from fglrepro.methods import build_method, resolve_method
from fglrepro.methods.fedpub import block_model_edges
from fglrepro.models import GCN, build_model


@pytest.mark.parametrize("num_blocks,block_size,p_in", [(5, 100, 0.1), (3, 7, 0.5)])
def test_block_model_edges_are_pyg_stochastic_blockmodel_graph(num_blocks, block_size, p_in):
    torch.manual_seed(3)
    expected = stochastic_blockmodel_graph([block_size] * num_blocks, torch.eye(num_blocks) * p_in)
    torch.manual_seed(3)
    assert torch.equal(block_model_edges(num_blocks, block_size, p_in), expected)


def fedpub(graph, engine, participation=1.0, dropout=0.0, hparams=None):
    fed = federation(graph, clients=4, dropout=dropout, readout=True, engine=engine, participation=participation)
    hparams = {"tau": 3.0, "l1": 0.05, "penalty_gradients": True, **(hparams or {})}
    return build_method(resolve_method("fedpub", hparams), fed)


def masked_parameters(method, k):
    return dict(method.states[k].model.named_parameters())


def prune_some_masks(method):
    """Set a block of every client's first mask below ``l1`` (pruned at evaluation)."""
    with torch.no_grad():
        for state in method.states:
            state.model.convs[0].lin.mask[:, :3] = 0.043


@pytest.mark.parametrize("penalty_gradients", [True, False])
@pytest.mark.parametrize("participation", [1.0, 0.5])
def test_fast_rounds_equal_the_sequential_rounds(sbm, participation, penalty_gradients):
    """Without dropout both paths are deterministic: three rounds (the proximal term from
    round two, partly pruned masks in the embeddings) give the same losses, masked models,
    embeddings and personalised models up to float rounding, and the batched tests of the
    pruned GCNs the metrics of the masked models."""
    hparams = {"penalty_gradients": penalty_gradients}
    ref = fedpub(sbm, None, participation, hparams=hparams)
    fast = fedpub(sbm, "batched", participation, hparams=hparams)
    assert fast.batched and not ref.batched
    prune_some_masks(ref)
    prune_some_masks(fast)
    for round_ in (1, 2, 3):
        ks = ref.participants(round_)
        assert fast.participants(round_) == ks
        ref_uploads, fast_uploads = ref.client_updates(ks, round_), fast.client_updates(ks, round_)
        for k in ks:
            assert fast_uploads[k].loss == pytest.approx(ref_uploads[k].loss, rel=1e-5)
            assert torch.allclose(fast_uploads[k].extras["embedding"], ref_uploads[k].extras["embedding"],
                                  atol=1e-6)
            ref_params, fast_params = masked_parameters(ref, k), masked_parameters(fast, k)
            for name, p in ref_params.items():
                assert torch.allclose(fast_params[name], p, atol=1e-6), name
        for method, uploads in ((ref, ref_uploads), (fast, fast_uploads)):
            method.server_update(round_, uploads)
            for k in ks:
                method.on_download(k, round_)
        for a, b in zip(fast.server_models(), ref.server_models()):
            assert all(torch.allclose(p, q, atol=1e-6) for p, q in zip(a.parameters(), b.parameters()))
    clients = ref.clients
    ref_metrics = evaluate_each([ref.eval_model(k, "global") for k in range(len(clients))], clients)
    fast_metrics = BatchedEvaluator(fast.federation.engine)([fast.eval_model(k, "global")
                                                            for k in range(len(clients))], clients)
    for a, b in zip(fast_metrics, ref_metrics):
        assert a == pytest.approx(b, abs=1e-9)
    assert all(isinstance(fast.eval_model(k, "local"), GCN) for k in range(len(clients)))


def test_pruned_gcn_computes_the_masked_model_in_evaluation_mode(sbm):
    method = fedpub(sbm, None)
    prune_some_masks(method)
    model, client = method.states[1].model.eval(), method.clients[1]
    gcn = build_model(ModelConfig(hidden=16, dropout=0.0, readout=True), client.x.size(1), client.num_classes)
    load_parameters(gcn, model.pruned_gcn_parameters())
    assert torch.allclose(gcn.eval()(client.x, client.adj), model(client.x, client.adj), atol=1e-6)
    unpruned = model.state_dict()["convs.0.lin.weight"] * model.state_dict()["convs.0.lin.mask"]
    assert not torch.allclose(gcn.convs[0].lin.weight, unpruned)
