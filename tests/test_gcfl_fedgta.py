"""Properties of client clustering (GCFL / GCFL+) and of FedGTA's topology-aware averaging."""

from __future__ import annotations

import copy
import math

import numpy as np
import pytest
import torch
from helpers import all_clients, client_models, hand_client, make_method, received_models, same_parameters

from fglrepro.config import ConfigError, EvalConfig, from_dict
from fglrepro.fl.aggregation import parameters_of, weighted_average
from fglrepro.fl.loop import run_federation
from fglrepro.methods import get_method
from fglrepro.methods.fedgta import FedGTAHparams, acceptance_weights, topology_statistics
from fglrepro.methods.gcfl_plus.clustering import (
    bipartition_by_sequences,
    bipartition_by_updates,
    dtw_distance,
    dtw_distance_matrix,
)

NEVER_SPLIT = {"eps1": 0.0, "eps2": 0.0, "warmup_rounds": 0, "seq_length": 1}
ALWAYS_SPLIT = {"eps1": 1e9, "eps2": 0.0, "warmup_rounds": 1, "seq_length": 2}


# --- clustering ---------------------------------------------------------------------


def test_dtw_of_a_sequence_with_itself_is_zero():
    seq = np.array([0.3, 1.7, -2.0, 0.5, 4.0])
    assert dtw_distance(seq, seq) == 0.0
    assert dtw_distance(seq, seq + 0.1) > 0.0


def test_dtw_matches_hand_computation():
    # [0, 1, 2] vs [0, 2]: best path (0,0) (1,0|1) (2,1) costs 0 + 1 + 0 -> sqrt(1)
    assert dtw_distance([0.0, 1.0, 2.0], [0.0, 2.0]) == pytest.approx(1.0)
    # [0, 0] vs [1, 3]: paths cost 1+9, 1+1+9 or 1+9+9 -> sqrt(10)
    assert dtw_distance([0.0, 0.0], [1.0, 3.0]) == pytest.approx(math.sqrt(10.0))
    # a time shift costs nothing but the ends: [0,0,1,2] vs [0,1,2,2] -> 0
    assert dtw_distance([0.0, 0.0, 1.0, 2.0], [0.0, 1.0, 2.0, 2.0]) == 0.0


def test_dtw_matrix_is_the_symmetric_pairwise_distance():
    seqs = np.random.default_rng(0).normal(size=(4, 5))
    dist = dtw_distance_matrix(seqs)
    assert np.allclose(dist, dist.T) and np.all(np.diag(dist) == 0.0)
    assert dist[1, 3] == pytest.approx(dtw_distance(seqs[1], seqs[3]))


def test_bipartition_separates_clients_with_opposite_updates():
    gen = torch.Generator().manual_seed(0)
    direction = torch.randn(200, generator=gen)
    signs = torch.tensor([1.0, -1.0, 1.0, -1.0, -1.0, 1.0])
    updates = signs.view(-1, 1) * direction + 0.3 * torch.randn(6, 200, generator=gen)
    assert bipartition_by_updates(updates) == ([0, 2, 5], [1, 3, 4])


def test_sequence_bipartition_groups_similar_gradient_norm_trends():
    rising = np.array([1.0, 2.0, 3.0, 4.0, 5.0])
    seqs = np.stack([rising, rising[::-1], rising + 0.1, rising[::-1] - 0.1, rising - 0.2])
    assert bipartition_by_sequences(seqs) == ([0, 2, 4], [1, 3])


# --- GCFL+ --------------------------------------------------------------------------


def test_gcfl_plus_with_one_cluster_equals_fedavg_bit_for_bit(sbm):
    evaluation = EvalConfig(model="global", average="weighted")
    avg_method = make_method(sbm, "fedavg")  # make_method reseeds torch: build each just before its run
    avg = run_federation(avg_method, 3, evaluation)
    gcfl_method = make_method(sbm, "gcfl_plus", NEVER_SPLIT)
    gcfl = run_federation(gcfl_method, 3, evaluation)
    assert gcfl_method.clusters == [[0, 1, 2]]
    assert [r["weighted"] for r in avg.rounds] == [r["weighted"] for r in gcfl.rounds]
    assert [r["train_loss"] for r in avg.rounds] == [r["train_loss"] for r in gcfl.rounds]
    assert same_parameters(avg_method.global_model, gcfl_method.cluster_models[0])


@pytest.mark.parametrize("clustering", ["dtw", "cosine"])
def test_gcfl_plus_splits_when_the_rule_triggers(sbm, clustering):
    method = make_method(sbm, "gcfl_plus", {**ALWAYS_SPLIT, "clustering": clustering})
    run_federation(method, 2, EvalConfig(model="global"))
    assert len(method.clusters) == 2
    assert sorted(k for members in method.clusters for k in members) == [0, 1, 2]
    assert len(method.server_models()) == 2
    first, second = method.clusters[0][0], method.clusters[1][0]
    assert method.eval_model(first, "global") is not method.eval_model(second, "global")
    if clustering == "dtw":  # sequences restart after a split
        assert all(seq == [] for seq in method.norm_sequences)


def test_gcfl_plus_warmup_blocks_splitting(sbm):
    method = make_method(sbm, "gcfl_plus", {**ALWAYS_SPLIT, "warmup_rounds": 5})
    run_federation(method, 3, EvalConfig(model="global"))
    assert method.clusters == [[0, 1, 2]]
    assert [len(seq) for seq in method.norm_sequences] == [3, 3, 3]


def test_gcfl_plus_non_participants_keep_their_state(sbm):
    method = make_method(sbm, "gcfl_plus", NEVER_SPLIT)
    method.clusters = [[0], [1, 2]]
    method.cluster_models = [method.global_model, copy.deepcopy(method.global_model)]
    for k in (1, 2):
        method.states[k].received = method.cluster_models[1]
    lone_before = copy.deepcopy(method.cluster_models[0])
    local_before = copy.deepcopy(method.states[2].model)
    upload = method.client_update(1, 1)
    assert set(upload.extras) == {"grad_norm"}
    method.server_update(1, {1: upload})
    assert same_parameters(method.cluster_models[0], lone_before)
    assert same_parameters(method.states[2].model, local_before)
    assert same_parameters(method.cluster_models[1], method.states[1].model)
    assert [len(seq) for seq in method.norm_sequences] == [0, 1, 0]
    assert received_models(method) == [method.cluster_models[0]] + [method.cluster_models[1]] * 2


def test_gcfl_plus_rejects_unknown_clustering():
    with pytest.raises(ConfigError, match=r"'kmeans'.*\['dtw', 'cosine'\]"):
        from_dict(get_method("gcfl_plus").Hparams, {"clustering": "kmeans"}, "hparams of gcfl_plus")


# --- FedGTA -------------------------------------------------------------------------


def test_fedgta_statistics_match_hand_computation():
    # path 0 - 1 - 2, node 0 labelled (class 0); model soft labels on nodes 1 and 2
    client = hand_client(torch.zeros(3, 1), [0, 1, 1], [[0, 1, 1, 2], [1, 0, 2, 1]], [True, False, False],
                         val=[False, True, False], test=[False, False, True])
    soft = torch.tensor([[0.3, 0.7], [0.6, 0.4], [0.2, 0.8]])
    hp = FedGTAHparams(prop_steps=1, lp_alpha=0.5, temperature=1.0, num_moments=2, moment_type="hybrid")
    moments, confidence = topology_statistics(soft, client, hp)

    s = 1 / math.sqrt(2)  # D^-1/2 A D^-1/2 entries of the path (degrees 1, 2, 1)
    seeds = np.array([[1.0, 0.0], [0.6, 0.4], [0.2, 0.8]])
    spread = np.array([seeds[1] * s, (seeds[0] + seeds[2]) * s, seeds[1] * s])
    prop = 0.5 * spread + 0.5 * seeds
    probs = np.exp(prop) / np.exp(prop).sum(axis=1, keepdims=True)
    probs[0] = [1.0, 0.0]
    mean = probs.mean(axis=0)
    expected = np.concatenate([
        mean, (probs ** 2).mean(axis=0), (probs - mean).mean(axis=0), ((probs - mean) ** 2).mean(axis=0),
    ])
    assert np.allclose(moments.numpy(), expected, atol=1e-6)
    degrees = np.array([1.0, 2.0, 1.0])
    expected_conf = (degrees * (2 / math.e + (probs * np.log(probs + 1e-8)).sum(axis=1))).sum()
    assert float(confidence) == pytest.approx(expected_conf, abs=1e-5)


def test_acceptance_weights_keep_only_similar_clients():
    moments = torch.tensor([[1.0, 0.0], [0.9, 0.1], [0.0, 1.0]])
    weights = acceptance_weights(moments, torch.tensor([1.0, 2.0, 3.0]), threshold=0.5)
    assert weights.tolist() == [[1.0, 2.0, 0.0], [1.0, 2.0, 0.0], [0.0, 0.0, 3.0]]
    zero_conf = acceptance_weights(moments, torch.zeros(3), threshold=0.5)
    assert zero_conf.tolist() == [[1.0, 1.0, 0.0], [1.0, 1.0, 0.0], [0.0, 0.0, 1.0]]


def test_fedgta_accepting_all_with_size_confidences_is_fedavg_for_every_client(sbm):
    avg = make_method(sbm, "fedavg")
    avg.server_update(1, all_clients(avg, 1))
    gta = make_method(sbm, "fedgta", {"accept_threshold": -1.0})
    uploads = all_clients(gta, 1)
    for k, upload in uploads.items():
        assert set(upload.extras) == {"moments", "confidence"}
        upload.extras["confidence"] = torch.tensor(upload.weight)
    gta.server_update(1, uploads)
    for model in received_models(gta):
        for p, q in zip(model.parameters(), avg.global_model.parameters()):
            assert torch.allclose(p, q, atol=1e-6)


def test_fedgta_equal_confidences_give_the_plain_mean(sbm):
    gta = make_method(sbm, "fedgta", {"accept_threshold": -1.0})
    uploads = all_clients(gta, 1)
    for upload in uploads.values():
        upload.extras["confidence"] = torch.tensor(1.0)
    gta.server_update(1, uploads)
    names = [n for n, _ in gta.global_model.named_parameters()]
    assert all(sorted(u.params) == sorted(names) for u in uploads.values())
    mean = weighted_average([u.params for u in uploads.values()], [1.0, 1.0, 1.0])
    for model in received_models(gta):
        assert all(torch.allclose(p, mean[n], atol=1e-6) for n, p in model.named_parameters())


def test_fedgta_non_participants_keep_their_models(sbm):
    gta = make_method(sbm, "fedgta", participation=0.34)
    run_federation(gta, 1, EvalConfig(model="global"))
    before = [parameters_of(m) for m in received_models(gta)]
    local_before = [parameters_of(m) for m in client_models(gta)]
    sampled = gta.participants(2)
    assert len(sampled) == 1
    gta.server_update(2, gta.client_updates(sampled, 2))
    for k in range(3):
        same = all(torch.equal(p, before[k][n]) for n, p in gta.states[k].received.named_parameters())
        same_local = all(torch.equal(p, local_before[k][n]) for n, p in gta.states[k].model.named_parameters())
        assert same == same_local == (k not in sampled)
