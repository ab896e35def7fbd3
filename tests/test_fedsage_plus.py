"""Properties of the missing-neighbour generation pieces and of the FedSage+ method."""

from __future__ import annotations

import weakref

import pytest
import torch
from helpers import all_clients, assert_refused, make_method, method_problems

from fglrepro.config import ConfigError, EvalConfig
from fglrepro.fl.communication import tensor_bytes
from fglrepro.fl.loop import run_federation
from fglrepro.methods import fedsage_plus, resolve_method
from fglrepro.methods.fedsage_plus import PEER_PAYLOAD, sparse_slots, summed_gradients
from fglrepro.methods.fedsage_plus.neighbor_generation import (
    greedy_feature_loss,
    impair_graph,
    mend_graph,
    mended_client,
)

EVAL = EvalConfig(model="global", average="weighted")


def edge_set(edge_index):
    return set(map(tuple, edge_index.t().tolist()))


def test_impaired_graph_hides_the_requested_fraction_and_every_touching_edge(sbm):
    client = make_method(sbm, "fedavg").clients[0]
    impaired = impair_graph(client, 0.5, 3, torch.Generator().manual_seed(1))
    candidates = (~client.train_mask & ~client.test_mask).nonzero().flatten()
    assert impaired.hidden.numel() == int(0.5 * candidates.numel()) > 0
    assert set(impaired.hidden.tolist()) <= set(candidates.tolist())
    assert sorted(impaired.kept.tolist() + impaired.hidden.tolist()) == list(range(client.num_nodes))
    # the impaired edges are exactly the original edges between kept nodes, re-indexed
    kept = impaired.kept
    expected = {(a, b) for a, b in edge_set(client.edge_index)
                if a not in set(impaired.hidden.tolist()) and b not in set(impaired.hidden.tolist())}
    assert {(int(kept[a]), int(kept[b])) for a, b in edge_set(impaired.edge_index)} == expected
    # every kept node knows how many neighbours it lost, every kept training node their features
    hidden = set(impaired.hidden.tolist())
    train_rows = iter(range(int(impaired.train_mask.sum())))
    assert impaired.train_missing_feat.shape == (int(impaired.train_mask.sum()), 3, client.x.size(1))
    for i, node in enumerate(kept.tolist()):
        lost = sorted(b for a, b in edge_set(client.edge_index) if a == node and b in hidden)
        assert int(impaired.missing_count[i]) == len(lost)
        if not impaired.train_mask[i]:
            continue
        row = next(train_rows)
        for slot in range(3):
            want = client.x[lost[slot]] if slot < len(lost) else torch.zeros(client.x.size(1))
            assert torch.equal(impaired.train_missing_feat[row, slot], want)


def test_mended_graph_keeps_the_original_and_adds_the_predicted_neighbours(sbm):
    client = make_method(sbm, "fedavg").clients[0]
    n, num_pred = client.num_nodes, 3
    count = torch.arange(n) % 5  # 0..4, so counts above num_pred are capped
    feat = torch.randn(n, num_pred, client.x.size(1), generator=torch.Generator().manual_seed(0))
    mended = mended_client(client, count, feat)
    capped = count.clamp(max=num_pred)
    assert mended.num_nodes == n + int(capped.sum())
    assert torch.equal(mended.x[:n], client.x)
    assert edge_set(client.edge_index) <= edge_set(mended.edge_index)
    new_edges = edge_set(mended.edge_index) - edge_set(client.edge_index)
    owners = {}
    for a, b in new_edges:
        assert (b, a) in new_edges and (a >= n) != (b >= n)
        if a >= n:
            assert a not in owners  # each generated node has exactly one edge
            owners[a] = b
    assert sorted(owners) == list(range(n, mended.num_nodes))
    assert torch.equal(torch.bincount(torch.tensor(list(owners.values())), minlength=n), capped)
    for new, owner in owners.items():
        assert any(torch.equal(mended.x[new], feat[owner, slot]) for slot in range(int(capped[owner])))


def test_evaluation_masks_only_select_original_nodes(sbm):
    method = make_method(sbm, "fedsage_plus", {"generator_rounds": 1, "num_pred": 2}, rounds=2)
    for g in method.neighgens:  # dGen predicts about 3 missing neighbours everywhere
        torch.nn.init.constant_(g.dgen.bias, 3.0)
    sizes = [c.num_nodes for c in method.clients]
    history = run_federation(method, 2, EVAL)
    assert any(c.num_nodes > n for c, n in zip(method.clients, sizes))  # something was generated
    for c, n in zip(method.clients, sizes):
        for mask in (c.train_mask, c.val_mask, c.test_mask):
            assert not mask[n:].any()
        assert (c.y[n:] == -1).all()
    assert len(history.rounds) == 2


def test_greedy_loss_matches_a_hand_computed_value():
    pred = torch.tensor([[[1.0, 0.0], [0.0, 0.0]], [[2.0, 2.0], [5.0, 5.0]]])
    true = torch.tensor([[[1.0, 2.0], [3.0, 0.0]], [[0.0, 0.0], [9.0, 9.0]]])
    # node 0: one predicted slot, two true neighbours -> min(mse(1,0 vs 1,2)=2, mse(vs 3,0)=2) = 2
    # node 1: two predicted slots, one true neighbour (0,0) -> 4 + 25 ; the (9,9) row is ignored
    loss = greedy_feature_loss(pred, true, torch.tensor([1.7, 2.0]), torch.tensor([2, 1]))
    assert loss.item() == pytest.approx((2 + 4 + 25) / 4)


@pytest.mark.parametrize("zeroing", ["num_pred", "dgen"])
def test_phase_two_without_generated_neighbours_equals_fedavg_bit_for_bit(sbm, zeroing):
    rounds, gen_rounds = 3, 2
    hparams = {"generator_rounds": gen_rounds, "num_pred": 0 if zeroing == "num_pred" else 3}
    sage = make_method(sbm, "fedsage_plus", hparams, rounds=rounds + gen_rounds)
    if zeroing == "dgen":
        for g in sage.neighgens:  # dGen = ReLU(w.z + b) = 0 for every node
            torch.nn.init.zeros_(g.dgen.weight)
            torch.nn.init.constant_(g.dgen.bias, -1.0)
    sizes = [c.num_nodes for c in sage.clients]
    ours = run_federation(sage, rounds + gen_rounds, EVAL).rounds[gen_rounds:]
    assert [c.num_nodes for c in sage.clients] == sizes
    avg = run_federation(make_method(sbm, "fedavg", rounds=rounds), rounds, EVAL).rounds
    for key in ("weighted", "train_loss", "upload_bytes", "download_bytes", "clients"):
        assert [r[key] for r in ours] == [r[key] for r in avg]


def test_generator_rounds_communicate_features_and_gradients(sbm):
    method = make_method(sbm, "fedsage_plus", {"generator_rounds": 3, "num_pred": 2}, rounds=4)
    generators = list(method.neighgens)  # the method drops them after mending
    before = [{n: p.detach().clone() for n, p in g.fgen.named_parameters()} for g in generators]
    history = run_federation(method, 4, EVAL)
    up = [r["upload_bytes"] for r in history.rounds]
    # round 1: own features only; from round 2: plus gradients for the two peers
    assert all(b > 0 for b in up[0]) and all(b2 > b1 for b1, b2 in zip(up[0], up[1]))
    assert all(b > 0 for r in history.rounds[:3] for b in r["download_bytes"])
    # from round 2 each client receives its peers' uploaded payload and one summed gradient
    grad_bytes = [int(g.train_mask.sum()) * 2 * sbm.num_features * 4 for g in method.impaired]
    assert history.rounds[1]["download_bytes"] == [sum(up[0]) - o + g for o, g in zip(up[0], grad_bytes)]
    model_bytes = sum(p.numel() * 4 for p in method.global_model.parameters())
    assert history.rounds[3]["upload_bytes"] == [model_bytes] * 3
    assert method.peer_grads[0] is not None
    assert all(not torch.equal(before[k]["5.weight"], g.fgen[5].weight) for k, g in enumerate(generators))
    # phase 2 keeps no NeighGen state
    assert method.neighgens == method.gen_optimizers == method.aux_classifiers == []
    assert all(box == {} for box in method.peer_features)


def test_mending_frees_each_clients_neighgen_and_adam_state_before_the_next(sbm, monkeypatch):
    method = make_method(sbm, "fedsage_plus", {"generator_rounds": 1, "num_pred": 2}, rounds=2)
    weights = [weakref.ref(g.fgen[5].weight) for g in method.neighgens]  # the output layer, held by Adam too
    alive = []

    def spy(client, count, feat):
        alive.append([w() is not None for w in weights])
        return mended_client(client, count, feat)

    monkeypatch.setattr(fedsage_plus, "mended_client", spy)
    method.mend_all()
    assert alive == [[j >= k for j in range(3)] for k in range(3)]
    assert all(w() is None for w in weights)


def test_generator_uploads_carry_features_as_side_data_and_gradients_for_peers(sbm):
    method = make_method(sbm, "fedsage_plus", {"generator_rounds": 2, "num_pred": 2, "client_major": False},
                         rounds=3)  # the messages, round by round
    first = all_clients(method, 1)
    method.server_update(1, first)
    for k, upload in first.items():
        assert upload.params == {} and upload.peer == {}
        assert tuple(upload.extras) == PEER_PAYLOAD
        n_train = int(method.impaired[k].train_mask.sum())
        assert upload.extras["features"].shape == (n_train, 2, sbm.num_features)
    second = all_clients(method, 2)
    for k, upload in second.items():
        assert sorted(upload.peer) == [j for j in range(3) if j != k]
        for j, message in upload.peer.items():
            assert set(message) == {"grad"} and message["grad"].shape == first[j].extras["features"].shape
            grad = message["grad"]  # sparse: only the (node, slot) pairs with a non-zero entry
            assert grad.is_sparse and torch.equal(grad.to_dense().ne(0).any(-1).nonzero().t(), grad.indices())
    assert all(u.num_bytes == tensor_bytes([*u.extras.values(), *(m["grad"].to_dense() for m in u.peer.values())])
               for u in second.values())  # counted as sent dense
    method.server_update(2, second)
    for k in range(3):
        expected = sum(second[j].peer[k]["grad"].to_dense() for j in range(3) if j != k)
        assert torch.allclose(method.peer_grads[k], expected)


@pytest.mark.parametrize("engine", ["auto", "sequential"])
def test_client_major_phase_one_gives_the_round_major_run_bit_for_bit(sbm, engine):
    """Every generator round of one client, then the next's, with the round-major order's draws:
    the same rounds (metrics, losses, bytes), mended graphs and trained classifier to the last bit."""
    runs = []
    for client_major in (True, False):
        hparams = {"generator_rounds": 4, "num_pred": 2, "client_major": client_major}
        method = make_method(sbm, "fedsage_plus", hparams, rounds=6, engine=engine, unbalanced=True)
        for g in method.neighgens:  # dGen starts near 2 missing neighbours everywhere: graphs get mended
            torch.nn.init.constant_(g.dgen.bias, 2.0)
        sizes = [c.num_nodes for c in method.clients]
        seeds = []  # (client, seed of its local round or mending), in the order they ran
        local_round, mend = method.local_round, method.mend
        method.local_round = lambda k, f=local_round, s=seeds: s.append((k, torch.initial_seed())) or f(k)
        method.mend = lambda k, seed, f=mend, s=seeds: s.append((k, seed)) or f(k, seed)
        history = run_federation(method, 6, EVAL).rounds
        runs.append((method, history, method.federation.generator.get_state(), seeds))
    (major, ours, gen_ours, seeds_ours), (minor, theirs, gen_theirs, seeds_theirs) = runs
    assert ours == theirs and torch.equal(gen_ours, gen_theirs)
    assert seeds_ours != seeds_theirs and sorted(seeds_ours) == sorted(seeds_theirs)  # other order, same draws
    assert [k for k, _ in seeds_ours] == [k for k in range(3) for _ in range(5)]
    assert major.client_major and not minor.client_major
    assert all(r["download_bytes"][0] > r["upload_bytes"][0] > 0 for r in ours[1:4])  # peers' payloads relayed
    assert all(torch.equal(a.x, b.x) and torch.equal(a.edge_index, b.edge_index)
               for a, b in zip(major.clients, minor.clients))
    assert any(c.num_nodes > n for c, n in zip(major.clients, sizes))
    assert all(torch.equal(p, q) for p, q in zip(major.global_model.parameters(), minor.global_model.parameters()))
    assert all(torch.equal(a, b) for a, b in zip(major.peer_grads, minor.peer_grads))


def test_fedtad_over_fedsage_plus_is_the_same_run_in_either_order(sbm):
    """FedTAD adds its reliability to each client's first upload: counted on top of the recorded bytes."""
    histories = []
    for client_major in (True, False):
        base = {"generator_rounds": 2, "num_pred": 2, "client_major": client_major}
        method = make_method(sbm, "fedtad", {"base": "fedsage_plus", "base_hparams": base, "distill_epochs": 1},
                             rounds=3, unbalanced=True)
        histories.append(run_federation(method, 3, EVAL).rounds)
    assert histories[0] == histories[1]


def test_client_major_phase_one_keeps_one_client_s_adam_state_at_a_time(sbm, monkeypatch):
    method = make_method(sbm, "fedsage_plus", {"generator_rounds": 3, "num_pred": 2}, rounds=4)
    weights = [weakref.ref(g.fgen[5].weight) for g in method.neighgens]
    local_round, seen = method.local_round, []

    def spy(k):
        moments = [j for j, opt in enumerate(method.gen_optimizers) if opt is not None and opt.state]
        seen.append((k, moments, [w() is not None for w in weights]))
        return local_round(k)

    monkeypatch.setattr(method, "local_round", spy)
    run_federation(method, 4, EVAL)
    assert [k for k, _, _ in seen] == [k for k in range(3) for _ in range(3)]  # client by client
    assert all(moments in ([], [k]) for k, moments, _ in seen)
    assert all(alive == [j >= k for j in range(3)] for k, _, alive in seen)
    assert all(w() is None for w in weights)


def test_partial_participation_runs_phase_one_round_by_round(sbm):
    method = make_method(sbm, "fedsage_plus", {"generator_rounds": 2, "num_pred": 2}, rounds=3, participation=0.5)
    assert not method.client_major and method.hparams.client_major
    history = run_federation(method, 3, EVAL)
    assert method.phase_one is None and sum(b > 0 for b in history.rounds[0]["upload_bytes"]) == 2


@pytest.mark.parametrize("peers", [1, 2, 7, 19])
def test_sparse_peer_gradients_sum_as_the_dense_ones_bit_for_bit(peers):
    """The server sums the sparse peer gradients in the float order of stacking the dense
    ones (a running sum differs in the last bits from 7 peers on)."""
    gen = torch.Generator().manual_seed(peers)
    read = torch.rand(peers, 37, 5, generator=gen) < 0.2
    dense = [torch.randn(37, 5, 64, generator=gen) * r.unsqueeze(-1) for r in read]
    sparse = [sparse_slots(g) for g in dense]
    assert all(torch.equal(s.to_dense(), g) and s._nnz() == int(r.sum()) for s, g, r in zip(sparse, dense, read))
    assert torch.equal(summed_gradients(sparse), torch.stack(dense).sum(0))


def test_cross_client_gradient_pulls_features_towards_peer_neighbours(sbm):
    method = make_method(sbm, "fedsage_plus", {"generator_rounds": 1, "num_pred": 2}, rounds=2)
    feat = torch.zeros(4, 2, sbm.num_features, requires_grad=False)
    ids = method.samplers[1].draw(4, 2, torch.Generator().manual_seed(0))
    assert ids.shape == (4, 2) and torch.equal(method.samplers[1].features(ids), method.clients[1].x[ids])
    grad = method.cross_client_gradient(1, ids, feat, torch.full((4,), 2), torch.full((4,), 2))
    # features of the peer's nodes are mostly positive (+2 on the block coordinate): the
    # gradient at zero points away from them, so a descent step moves towards them
    assert grad.shape == feat.shape and grad.sum() < 0


def test_mend_graph_is_differentiable_in_the_generated_features():
    x = torch.zeros(2, 3)
    feat = torch.ones(2, 2, 3, requires_grad=True)
    new_x, edges = mend_graph(x, torch.tensor([[0, 1], [1, 0]]), torch.tensor([1, 0]), feat)
    new_x.sum().backward()
    assert edges.size(1) == 4 and torch.equal(feat.grad[:, :, 0], torch.tensor([[1.0, 0.0], [0.0, 0.0]]))


def test_invalid_schedule_is_a_config_error(sbm):
    assert_refused(method_problems("fedsage_plus", {"generator_rounds": 3}, rounds=3),
                   "generator_rounds=3.*train.rounds=3")
    assert method_problems("fedsage_plus", {"generator_rounds": 2}, rounds=3) == []
    with pytest.raises(ConfigError, match="generator_rounds=3.*train.rounds=3"):
        make_method(sbm, "fedsage_plus", {"generator_rounds": 3}, rounds=3)
    with pytest.raises(ConfigError, match="hidden_portion"):
        resolve_method("fedsage_plus", {"hidden_portion": 1.0})
