"""Fed-PUB: personalised similarity weights, masked GCN (and other masked architectures), what is
communicated."""

from __future__ import annotations

import copy
import math

import numpy as np
import pytest
import torch
from helpers import all_clients, assert_refused, client_models, make_method, method_problems, received_models

from fglrepro.config import ConfigError, EvalConfig, ModelConfig, from_dict
from fglrepro.fl.aggregation import parameters_of, weighted_average
from fglrepro.fl.loop import run_federation
from fglrepro.methods import get_method
from fglrepro.methods.fedpub import (
    FedPubHparams,
    MaskedLinear,
    masks_of,
    personalized_weights,
    proxy_graph,
    shared_parameters,
)
from fglrepro.models import edge_index_of


def test_identical_embeddings_reduce_to_fedavg_weights():
    embeddings = torch.tensor([[0.3, -1.0, 2.0]] * 3)
    sizes = torch.tensor([10.0, 30.0, 60.0])
    weights = personalized_weights(embeddings, sizes, tau=10.0, weight_by_size=True)
    assert torch.allclose(weights, (sizes / sizes.sum()).double().expand(3, 3), atol=1e-12)
    uniform = personalized_weights(embeddings, sizes, tau=10.0, weight_by_size=False)
    assert torch.allclose(uniform, torch.full((3, 3), 1 / 3, dtype=torch.float64), atol=1e-12)


def test_personalized_weights_hand_computed_and_row_stochastic():
    embeddings = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
    sizes = torch.tensor([1.0, 1.0, 2.0])
    weights = personalized_weights(embeddings, sizes, tau=1.0, weight_by_size=True)
    c = 1 / math.sqrt(2)
    row0 = np.array([math.e, 1.0, 2 * math.exp(c)])
    assert weights[0].numpy() == pytest.approx(row0 / row0.sum())
    row2 = np.array([math.exp(c), math.exp(c), 2 * math.e])
    assert weights[2].numpy() == pytest.approx(row2 / row2.sum())
    gen = torch.Generator().manual_seed(0)
    emb = torch.randn(6, 5, generator=gen)
    weights = personalized_weights(emb, torch.ones(6), tau=10.0, weight_by_size=True)
    assert torch.allclose(weights.sum(dim=1), torch.ones(6, dtype=torch.float64))
    sim = torch.nn.functional.normalize(emb, dim=1) @ torch.nn.functional.normalize(emb, dim=1).T
    others = ~torch.eye(6, dtype=torch.bool)
    for i in range(6):
        assert int(weights[i].argmax()) == i  # a client is most similar to itself
        j = torch.where(others[i], sim[i], -torch.inf).argmax()
        assert int(torch.where(others[i], weights[i], -1.0).argmax()) == int(j)


def test_server_sends_fedavg_when_embeddings_agree_and_personalises_otherwise(sbm):
    method = make_method(sbm, "fedpub")
    uploads = all_clients(method, 1)
    assert all(set(u.extras) == {"embedding"} for u in uploads.values())
    n = [u.weight for u in uploads.values()]
    fedavg = weighted_average([u.params for u in uploads.values()], n)
    method.server_update(1, uploads)
    differs = [not torch.allclose(p, fedavg[name], atol=1e-6)
               for m in received_models(method) for name, p in m.named_parameters()]
    assert any(differs)
    for u in uploads.values():
        u.extras["embedding"] = torch.tensor([1.0, 2.0, 3.0, 4.0])
    method.server_update(1, uploads)
    for model in received_models(method) + [method.global_model]:
        for name, p in model.named_parameters():
            assert torch.allclose(p, fedavg[name], atol=1e-6)


#: a model of each architecture Fed-PUB masks (width 16, as the tests' default GCN).
ARCHS = {arch: ModelConfig(arch=arch, hidden=16) for arch in ("gcn", "sage", "gat", "gin", "sgc")}


@pytest.mark.parametrize("arch", ARCHS)
def test_unit_masks_without_penalties_take_fedavg_first_step_bit_for_bit(sbm, arch):
    avg = make_method(sbm, "fedavg", model=ARCHS[arch], local_epochs=1)
    pub = make_method(sbm, "fedpub", {"l1": 0.0, "loc_l2": 0.0}, model=ARCHS[arch], local_epochs=1)
    for k in range(3):
        torch.manual_seed(k)  # same dropout masks
        a = avg.client_update(k, 1)
        torch.manual_seed(k)
        p = pub.client_update(k, 1)
        assert a.loss == p.loss
        assert a.params.keys() == p.params.keys()
        assert all(torch.equal(a.params[name], p.params[name]) for name in a.params)


def test_l1_penalty_shrinks_masks(sbm):
    def mean_mask(l1):
        method = make_method(sbm, "fedpub", {"l1": l1, "penalty_gradients": True}, local_epochs=20)
        method.client_update(0, 1)
        return float(torch.cat([m.detach().flatten() for m in masks_of(method.states[0].model)]).abs().mean())

    assert mean_mask(0.1) < mean_mask(0.0) - 0.05


def test_as_in_the_code_the_penalties_reach_no_gradient_by_default(sbm):
    """The authors' code adds both terms on detached ``state_dict()`` tensors: with the default
    ``penalty_gradients: false`` any ``l1`` / ``loc_l2`` trains exactly as none does."""
    def trained(hparams, round_):
        method = make_method(sbm, "fedpub", hparams, local_epochs=4)
        torch.manual_seed(0)
        upload = method.client_update(0, round_)
        return upload.loss, dict(method.states[0].model.named_parameters())

    for round_ in (1, 2):
        loss, params = trained({"l1": 0.0, "loc_l2": 0.0}, round_)
        loss_penalised, params_penalised = trained({"l1": 0.1, "loc_l2": 1.0}, round_)
        assert loss == loss_penalised
        assert all(torch.equal(params[name], params_penalised[name]) for name in params)


def test_proximal_term_pulls_towards_received_model_from_round_two(sbm):
    def drift(loc_l2, round_):
        method = make_method(sbm, "fedpub", {"loc_l2": loc_l2, "penalty_gradients": True}, local_epochs=8)
        start = parameters_of(method.global_model)
        method.client_update(0, round_)
        return sum(float((p - start[n]).norm()) for n, p in parameters_of(method.states[0].model).items()
                   if n in start)

    assert drift(1.0, 2) < drift(0.0, 2)
    assert drift(1.0, 1) == drift(0.0, 1)


@pytest.mark.parametrize("arch", ["gcn", "sage", "sgc"])
def test_masks_stay_local(sbm, arch):
    method = make_method(sbm, "fedpub", model=ARCHS[arch])
    models = client_models(method)
    for round_ in (1, 2):
        uploads = all_clients(method, round_)
        assert not any("mask" in name for u in uploads.values() for name in [*u.params, *u.extras])
        trained = [[m.detach().clone() for m in masks_of(model)] for model in models]
        method.server_update(round_, uploads)
        for k in uploads:
            method.on_download(k, round_)
        for k in range(3):
            assert all(torch.equal(a, b) for a, b in zip(trained[k], masks_of(models[k])))
            received = parameters_of(method.states[k].received)
            model = method.eval_model(k, "global")
            assert model is models[k]  # the masked model is tested
            shared = shared_parameters(model)
            assert shared.keys() == received.keys()
            assert all(torch.equal(p, received[n]) for n, p in shared.items())
    assert not torch.equal(masks_of(models[0])[0], masks_of(models[1])[0])
    assert len(method.server_models()) == 3


@pytest.mark.parametrize(("readout", "upload", "download"), [(False, 848 + 16, 848), (True, 1936 + 64, 1936)])
def test_upload_bytes_are_weights_biases_and_embedding(sbm, readout, upload, download):
    # F = 8, hidden 16, C = 4. Plain: (8*16+16) + (16*4+4) = 212 floats, embedding C = 4.
    # Readout: (8*16+16) + (16*16+16) + (16*4+4) = 484 floats, embedding hidden = 16.
    method = make_method(sbm, "fedpub", model=ModelConfig(hidden=16, readout=readout))
    history = run_federation(method, 2, EvalConfig(model="global", average="weighted"))
    assert all(r["upload_bytes"] == [upload] * 3 for r in history.rounds)
    assert all(r["download_bytes"] == [download] * 3 for r in history.rounds)


def test_teacher_is_the_uploaded_model(sbm):
    method = make_method(sbm, "fedpub", model=ModelConfig(hidden=16, readout=True))
    upload = method.client_update(1, 1)
    teacher = method.teacher_model(1, upload)
    assert parameters_of(teacher).keys() == upload.params.keys()
    assert all(torch.equal(p, upload.params[n]) for n, p in parameters_of(teacher).items())
    student = method.states[1].model
    with torch.no_grad():
        for mask in masks_of(student):
            mask.fill_(1.0)
    teacher.eval(), student.eval()
    client = method.clients[1]
    assert torch.allclose(teacher(client.x, client.adj), student(client.x, client.adj), atol=1e-6)


def test_non_participants_keep_their_state(sbm):
    method = make_method(sbm, "fedpub", participation=0.34)
    sampled = method.participants(1)
    assert len(sampled) == 1
    before = [parameters_of(m) for m in client_models(method)]
    uploads = method.client_updates(sampled, 1)
    method.server_update(1, uploads)
    for k in range(3):
        if k in sampled:
            assert method.states[k].received is not None
        else:
            assert method.states[k].received is None
            assert all(torch.equal(p, before[k][n]) for n, p in parameters_of(method.states[k].model).items())
    assert len(method.server_models()) == 2  # the personalised model and the global one


def test_evaluation_prunes_small_mask_entries():
    layer = MaskedLinear(3, 2, prune_below=1e-3)
    with torch.no_grad():
        layer.weight.copy_(torch.arange(6.0).view(2, 3))
        layer.mask[0, 1] = 5e-4
    x = torch.ones(1, 3)
    layer.train()
    assert torch.allclose(layer(x), torch.tensor([[0.0 + 1.0 * 5e-4 + 2.0, 12.0]]))
    layer.eval()
    assert torch.allclose(layer(x), torch.tensor([[2.0, 12.0]]))


def test_proxy_graph_is_seeded_block_diagonal_and_leaves_global_rng_alone():
    hparams = FedPubHparams(n_proxy=3, proxy_block_size=20, proxy_p_in=0.5)
    torch.manual_seed(0)
    state = torch.get_rng_state()
    x, adj = proxy_graph(4, hparams, torch.Generator().manual_seed(1), torch.device("cpu"))
    assert torch.equal(torch.get_rng_state(), state)
    x2, adj2 = proxy_graph(4, hparams, torch.Generator().manual_seed(1), torch.device("cpu"))
    assert torch.equal(x, x2) and torch.equal(adj.to_dense(), adj2.to_dense())
    assert x.shape == (60, 4)
    dense = adj.to_dense()
    block = torch.arange(60) // 20
    assert dense[block.view(-1, 1) != block.view(1, -1)].abs().sum() == 0
    assert (dense > 0).sum() > 60  # edges beyond the self loops


def test_fedpub_needs_an_architecture_with_graph_layers():
    assert_refused(method_problems("fedpub", model=ModelConfig(arch="appnp")), r"fedpub.*'sgc'.*arch 'appnp'")
    assert_refused(method_problems("fedpub", model=ModelConfig(arch="gcn", readout=True, jk="max")),
                   r"fedpub.*without model.jk.*jk 'max'")
    assert_refused(method_problems("fedpub", model=ModelConfig(arch="sgc", readout=True)), r"fedpub.*readout True")
    for arch in ARCHS:
        assert method_problems("fedpub", model=ModelConfig(arch=arch, readout=arch != "sgc")) == []


@pytest.mark.parametrize("arch", ["sage", "gat", "gin", "sgc"])
def test_masked_copy_masks_every_weight_matrix_and_keeps_the_plain_names(sbm, arch):
    """A masked copy has one mask per weight matrix (none on biases or GAT's attention vectors),
    its shared parameters are the plain model's (names and values), it computes the plain
    model's outputs while its masks are ones, and evaluation prunes small mask entries."""
    method = make_method(sbm, "fedpub", {"l1": 1e-3}, model=ARCHS[arch])
    plain, masked = method.global_model, method.states[0].model
    weights = [name for name, p in plain.named_parameters() if name.endswith("weight") and p.dim() >= 2]
    assert len(masks_of(masked)) == len(weights) > 0
    shared = shared_parameters(masked)
    assert shared.keys() == parameters_of(plain).keys()
    assert all(torch.equal(p, parameters_of(plain)[n]) for n, p in shared.items())
    client = method.clients[0]
    plain.eval(), masked.eval()
    with torch.no_grad():
        assert torch.equal(plain(client.x, client.adj), masked(client.x, client.adj))
        masks_of(masked)[0].fill_(5e-4)  # below l1: pruned (zero) at evaluation, kept in training
        assert torch.equal(masked(client.x, client.adj), _zero_first_weight(plain)(client.x, client.adj))
        masked.train()
        assert not torch.equal(masked(client.x, client.adj), _zero_first_weight(plain)(client.x, client.adj))


def _zero_first_weight(model):
    """A copy of ``model`` in evaluation mode with its first weight matrix set to zero."""
    zeroed = copy.deepcopy(model).eval()
    first = next(p for name, p in zeroed.named_parameters() if name.endswith("weight") and p.dim() >= 2)
    first.data.zero_()
    return zeroed


@pytest.mark.parametrize("readout", [False, True])
def test_functional_embedding_is_the_last_graph_layer_on_the_proxy_graph(sbm, readout):
    """Of a SAGE model: without readout the mean of its logits over the proxy nodes, with readout
    the mean of the last convolution's output before its activation (FED-PUB's ``is_proxy``)."""
    method = make_method(sbm, "fedpub", model=ModelConfig(arch="sage", hidden=16, readout=readout))
    plain = method.global_model.eval()
    with torch.no_grad():
        if readout:
            hidden = torch.relu(plain.convs[0](method.proxy_x, edge_index_of(method.proxy_adj)))
            expected = plain.convs[1](hidden, edge_index_of(method.proxy_adj)).mean(dim=0)
        else:
            expected = plain(method.proxy_x, method.proxy_adj).mean(dim=0)
    embedding = method.functional_embedding(method.states[0].model)
    assert embedding.shape == (16 if readout else 4,)
    assert torch.allclose(embedding, expected, atol=1e-6)


def test_invalid_hyperparameters_are_errors():
    cls = get_method("fedpub")
    with pytest.raises(ConfigError, match="proxy_p_in"):
        from_dict(cls.Hparams, {"proxy_p_in": 1.5}, "hparams of fedpub")
    with pytest.raises(ConfigError, match="n_proxy"):
        from_dict(cls.Hparams, {"n_proxy": 0}, "hparams of fedpub")
    with pytest.raises(ConfigError, match="l1"):
        from_dict(cls.Hparams, {"l1": -1.0}, "hparams of fedpub")
