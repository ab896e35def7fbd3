"""FedLoG: the server's global synthetic data (class-share weights, slot permutation, a function of the
uploads only), the degree-weighted branch mixture, the 2-node prompt graph, the generator's
pretraining, and the limit without the global-data term."""

from __future__ import annotations

import copy
import dataclasses

import pytest
import torch
import torch.nn.functional as F
from helpers import assert_refused, make_method, method_problems, one_round
from test_renode import NO_DROPOUT

from fglrepro.config import EvalConfig, ModelConfig
from fglrepro.fl.loop import run_federation
from fglrepro.methods.fedlog import (
    FedLoGHparams,
    NeighbourGenerator,
    RealGraph,
    batched_gcn,
    class_generator_forward,
    global_synthetic,
    matching_loss,
    node_degrees,
    pair_adjacency,
    pretrain_generator,
    random_gcn_weights,
)
from fglrepro.models import GCN
from fglrepro.sparse import SparseRows

FAST = {"num_proto": 3, "embed_dim": 8, "generator_epochs": 3, "matching_draws": 2, "pretrain_epochs": 5}


def test_global_synthetic_data_weights_clients_by_their_class_shares():
    # client a: class 0 rows 1, class 1 rows 10; client b: 3 and 20; class 2 held by nobody: 1/K each
    heads = torch.tensor([[[1.0], [10.0], [4.0]], [[3.0], [20.0], [8.0]]]).unsqueeze(3).expand(2, 3, 4, 1)
    shares = torch.tensor([[0.75, 0.0, 0.0], [0.25, 1.0, 0.0]])
    out = global_synthetic(heads, shares, torch.Generator().manual_seed(0))
    assert out.shape == (3, 4, 1)
    assert out[:, :, 0].tolist() == [[1.5] * 4, [20.0] * 4, [6.0] * 4]


def test_global_synthetic_data_of_one_client_permutes_its_slots_within_each_class():
    heads = torch.arange(2 * 5 * 3, dtype=torch.float32).view(1, 2, 5, 3)
    out = global_synthetic(heads, torch.tensor([[0.4, 0.6]]), torch.Generator().manual_seed(1))
    for c in range(2):
        assert sorted(map(tuple, out[c].tolist())) == sorted(map(tuple, heads[0, c].tolist()))
    assert not torch.equal(out, heads[0])  # some slot moved


def test_uploads_hold_no_raw_features_and_the_global_data_is_a_function_of_them(sbm):
    method = make_method(sbm, "fedlog", FAST, rounds=1, model=NO_DROPOUT)
    uploads = method.client_updates(list(range(len(method.clients))), 1)
    seed_state = method.federation.generator.get_state()
    method.server_update(1, uploads)
    num_classes, p = method.clients[0].num_classes, FAST["num_proto"]
    for k, upload in uploads.items():
        names = {n for n in upload.extras if not n.startswith("generator.")}
        assert names == {"syn_head", "syn_tail", "class_share"}
        assert upload.extras["syn_head"].shape == (num_classes * p, sbm.num_features)
        real = method.clients[k].x
        assert torch.cdist(upload.extras["syn_head"], real).min() > 0  # no real row is uploaded
    heads = torch.stack([u.extras["syn_head"].view(num_classes, p, -1) for u in uploads.values()])
    shares = torch.stack([u.extras["class_share"] for u in uploads.values()])
    again = global_synthetic(heads, shares, torch.Generator().set_state(seed_state)).reshape(-1, heads.size(-1))
    assert torch.equal(method.global_data.x, again)
    assert method.global_data.y.tolist() == [c for c in range(num_classes) for _ in range(p)]


def test_prediction_is_the_degree_weighted_mixture_of_the_branch_probabilities(sbm):
    method = make_method(sbm, "fedlog", FAST, rounds=1, model=NO_DROPOUT)
    one_round(method, 1)
    client, model = method.clients[0], method.states[0].model
    edges = client.edge_index[:, client.edge_index[0] != client.edge_index[1]]
    degree = torch.bincount(edges[0], minlength=client.num_nodes).float()
    assert torch.equal(node_degrees(client.adj), degree)
    with torch.no_grad():
        h = model.embedder(client.x, client.adj)
        syn = torch.cat([model.syn_head, model.syn_tail])
        emb = model.embedder(syn, torch.eye(syn.size(0)).to_sparse_csr())
        head_proto, tail_proto = (e.view(client.num_classes, FAST["num_proto"], -1).mean(1) for e in emb.chunk(2))
        p_head = F.softmax(-((model.norm_head(h)[:, None] - head_proto[None]) ** 2).sum(-1), dim=1)
        p_tail = F.softmax(-((model.norm_tail(h)[:, None] - tail_proto[None]) ** 2).sum(-1), dim=1)
        alpha = torch.sigmoid(degree - (FedLoGHparams().head_degree + 1)).unsqueeze(1)
        out = model(client.x, client.adj).exp()
        assert torch.allclose(out, alpha * p_head + (1 - alpha) * p_tail, atol=1e-5)
        model.head_degree = 10_000  # every node is a tail node: the tail branch alone
        assert torch.allclose(model(client.x, client.adj).exp(), p_tail, atol=1e-5)


def test_centre_of_a_two_node_graph_is_the_gcn_on_the_mean_row():
    torch.manual_seed(0)
    m, f = 5, 6
    x, g = torch.randn(m, f), torch.randn(m, f)
    weights = random_gcn_weights([f, 4, 3], 2, torch.Generator().manual_seed(0), "cpu")
    closed = batched_gcn(weights, (x + g) / 2, None)
    for d in range(2):
        gcn = GCN(f, 4, 3, layers=2, dropout=0.0)
        with torch.no_grad():
            for i, conv in enumerate(gcn.convs):
                conv.lin.weight.copy_(weights[2 * i][d].t())
                conv.bias.copy_(weights[2 * i + 1][d])
        explicit = gcn(torch.cat([x, g]), pair_adjacency(m, x.device))[:m]
        assert torch.allclose(closed[:, d], explicit, atol=1e-5)


def test_generator_pretraining_lowers_its_loss(sbm):
    method = make_method(sbm, "fedlog", FAST, rounds=1, model=NO_DROPOUT)
    client = method.clients[0]
    losses = []
    for epochs in (1, 60):
        torch.manual_seed(0)
        gen = NeighbourGenerator(sbm.num_features)
        hp = FedLoGHparams(**{**FAST, "generator_epochs": epochs, "matching_draws": 8})
        losses.append(pretrain_generator(gen, client, method.widths, hp, torch.Generator().manual_seed(0)))
    assert losses[1] < 0.5 * losses[0], losses


def trained_after_download(sbm, global_weight: float, scramble: bool) -> list[torch.Tensor]:
    """Client 0's parameters after the post-download training; ``scramble`` replaces the global data."""
    method = make_method(sbm, "fedlog", {**FAST, "global_weight": global_weight}, rounds=1, model=NO_DROPOUT)
    one_round(method, 1)
    if scramble:
        method.global_data.x = torch.randn_like(method.global_data.x)
    before = copy.deepcopy(method.states[0].model)
    assert method.on_run_end(1)
    assert all(((s >= 0) & (s <= 1)).all() for s in method.scalers)
    after = method.states[0].model
    assert not all(torch.equal(p, q) for p, q in zip(before.parameters(), after.parameters()))
    return [p.detach().clone() for p in after.parameters()]


@pytest.mark.parametrize("weight, same", [(0.0, True), (1.0, False)])
def test_without_the_global_term_local_training_ignores_the_global_data(sbm, weight, same):
    plain, scrambled = (trained_after_download(sbm, weight, s) for s in (False, True))
    assert all(torch.equal(p, q) for p, q in zip(plain, scrambled)) is same


def test_refuses_a_backbone_without_graph_convolutions_or_with_readout():
    assert_refused(method_problems("fedlog", model=ModelConfig(arch="sgc")), r"fedlog.*'gat'.*arch 'sgc'")
    assert_refused(method_problems("fedlog", model=ModelConfig(arch="gcn", readout=True)), "fedlog.*readout True")
    for arch in ("gcn", "sage", "gat", "gin"):
        assert method_problems("fedlog", FAST, model=ModelConfig(arch=arch, hidden=16),
                               evaluation=EvalConfig(model="local")) == []
    assert method_problems("fedlog", FAST, evaluation=EvalConfig(model="local")) == []
    assert_refused(method_problems("fedlog", FAST, evaluation=EvalConfig(model="global")), "evaluation.model")


def sparse_features(client, width: int = 60, density: float = 0.03):
    """``client`` with bag-of-words-like features ``[n, width]`` (a share ``density`` non-zero)."""
    gen = torch.Generator().manual_seed(5)
    x = torch.rand(client.num_nodes, width, generator=gen) * (torch.rand(client.num_nodes, width, generator=gen)
                                                             < density)
    return dataclasses.replace(client, x=x)


@pytest.mark.parametrize("sparse", [False, True])
def test_matching_loss_is_the_mean_squared_distance_of_the_parameter_gradients(sbm, sparse):
    method = make_method(sbm, "fedlog", FAST, rounds=1, model=NO_DROPOUT)
    client = sparse_features(method.clients[0]) if sparse else method.clients[0]
    train = client.train_mask.nonzero().flatten()
    labels = client.y[train]
    gen = torch.Generator().manual_seed(3)
    num_features = client.x.size(1)
    weights = random_gcn_weights([num_features, 5, 4], 3, gen, "cpu")
    head = torch.randn(3, 4, client.num_classes, generator=gen)
    centre = torch.randn(train.numel(), num_features, generator=gen)
    real = RealGraph.of(client)
    assert isinstance(real.features, SparseRows) is sparse and (real.gram is None) is sparse
    fast = matching_loss(weights, head, real, train, labels, centre)
    params = [w.detach().clone().requires_grad_(True) for w in weights]

    def grads(x, adj, nodes):  # the gradient of each draw's mean cross-entropy, written out
        logits = torch.einsum("ndk,dkc->ndc", batched_gcn(params, x, adj)[nodes], head)
        loss = sum(F.cross_entropy(logits[:, d], labels) for d in range(3))
        return torch.autograd.grad(loss, params)

    direct = sum(((s - r) ** 2).mean() for s, r in zip(grads(centre, None, slice(None)),
                                                         grads(client.x, client.adj, train)))
    assert fast.item() == pytest.approx(direct.item(), rel=1e-4)


def test_the_real_graphs_own_term_sets_the_matching_value_and_no_gradient(sbm):
    """The sparse route of ||(A x)^T Delta_r||^2 leaves the generator's gradient bit for bit as the
    dense route (P P^T) has it, so the pretraining follows the same trajectory either way."""
    client = sparse_features(make_method(sbm, "fedlog", FAST, rounds=1, model=NO_DROPOUT).clients[0])
    train = client.train_mask.nonzero().flatten()
    gen = torch.Generator().manual_seed(3)
    weights = random_gcn_weights([client.x.size(1), 5, 4], 3, gen, "cpu")
    head = torch.randn(3, 4, client.num_classes, generator=gen)
    sparse = RealGraph.of(client)
    dense = dataclasses.replace(sparse, gram=sparse.propagated @ sparse.propagated.t())
    values, gradients = [], []
    for real in (sparse, dense):
        centre = torch.randn(train.numel(), client.x.size(1), generator=torch.Generator().manual_seed(4),
                             requires_grad=True)
        loss = matching_loss(weights, head, real, train, client.y[train], centre)
        values.append(loss.item())
        gradients.append(torch.autograd.grad(loss, centre)[0])
    assert values[0] == pytest.approx(values[1], rel=1e-5)
    assert torch.equal(*gradients)


def test_cached_prompts_equal_freshly_generated_ones_after_the_scalers_move(sbm):
    method = make_method(sbm, "fedlog", FAST, rounds=1, model=NO_DROPOUT)
    one_round(method, 1)
    data, num_classes = method.global_data, method.clients[0].num_classes
    for moved in ([], [1], [0, 2]):
        method.scalers[0][moved] += 0.25
        x = data.x + method.scalers[0][data.y].unsqueeze(1) * (data.x.mean(dim=0, keepdim=True) - data.x)
        fresh = class_generator_forward(data.generators, x.view(num_classes, FAST["num_proto"], -1))
        assert torch.allclose(method.prompts(0, x), fresh, atol=1e-6)


def test_later_rounds_start_from_the_average_and_train_on_the_global_data(sbm):
    method = make_method(sbm, "fedlog", FAST, rounds=3, model=NO_DROPOUT)
    first = one_round(method, 1)
    assert all(any(n.startswith("generator.") for n in u.extras) for u in first.values())
    shared = dict(method.shared)
    method.receive(1, 2)
    assert all(torch.equal(p, shared[n]) for n, p in method.states[1].model.named_parameters() if n in shared)
    second = one_round(method, 2)
    assert not any(n.startswith("generator.") for u in second.values() for n in u.extras)
    assert any(bool((s > 0).any()) for s in method.scalers)  # the global term ran and moved some scaler
    history = run_federation(make_method(sbm, "fedlog", FAST, rounds=2, model=NO_DROPOUT), 2,
                             EvalConfig(model="local"))
    assert len(history.rounds) == 2 and 0 < history.rounds[-1]["weighted"]["test_acc"] <= 1


@pytest.mark.parametrize("arch", ["sage", "gat"])
def test_the_embedder_is_the_studys_backbone_and_reads_the_prompt_graphs_edges(sbm, arch):
    """With a GraphSAGE / GAT study the embedder is that architecture (the study's width and depth, output
    ``embed_dim``), a round runs, and the m 2-node prompt graphs embed as m separate graphs would."""
    method = make_method(sbm, "fedlog", FAST, rounds=1, model=ModelConfig(arch=arch, hidden=16, dropout=0.0))
    embedder = method.states[0].model.embedder
    assert embedder.arch == arch and embedder.layers == 2
    one_round(method, 1)
    client = method.clients[0]
    out = method.eval_model(0, "local")(client.x, client.adj)
    assert out.shape == (client.num_nodes, client.num_classes) and torch.isfinite(out).all()
    m, x = 4, client.x[:8]
    embedder.eval()
    with torch.no_grad():
        together = embedder(x, pair_adjacency(m, x.device))[:m]
        edge = torch.tensor([[0, 1], [1, 0]])
        alone = torch.stack([embedder.convs[1](torch.relu(embedder.convs[0](x[[i, m + i]], edge)), edge)[0]
                             for i in range(m)])
    assert torch.allclose(together, alone, atol=1e-5)
