"""O-pFGL: secure aggregation, class-statistics pooling, HRE, node-adaptive distillation,
the surrogate graph and one pass of the shared round loop."""

from __future__ import annotations

import math

import pytest
import torch
from helpers import assert_refused, client_models, hand_client, make_method, method_problems

from fglrepro.components.class_statistics import (
    ClassStatistics,
    ClassSums,
    class_statistics,
    pool_statistics,
    pool_sums,
)
from fglrepro.components.surrogate_graph import (
    LINK_PREDICTORS,
    SurrogateSettings,
    build_link_predictor,
    edge_weights,
    generate_surrogate_graph,
)
from fglrepro.config import ConfigError, EvalConfig, ModelConfig, from_dict
from fglrepro.fl.loop import run_federation
from fglrepro.methods import resolve_method
from fglrepro.methods.opfgl import (
    OPFGL,
    class_homophily,
    distillation_weights,
    label_propagation,
    reliable_nodes,
)
from fglrepro.methods.opfgl.secure_aggregation import decode, encode, mask_vector, unmask_sum

FAST = {"surrogate_iterations": 60, "stage1_steps": 60, "finetune_steps": 60, "eval_every": 20}


def make_opfgl(data, hparams=None):
    """O-pFGL with :data:`FAST` schedules, one round, on a GCN without dropout."""
    method = make_method(data, "opfgl", {**FAST, **(hparams or {})}, rounds=1,
                         model=ModelConfig(hidden=16, dropout=0.0))
    assert isinstance(method, OPFGL)
    return method


def random_statistics(gen, sizes, dim=5, num_classes=3):
    """Per-client samples and their statistics; client k has sizes[k][c] nodes of class c."""
    samples, parts = [], []
    for k, per_class in enumerate(sizes):
        labels = torch.cat([torch.full((n,), c) for c, n in enumerate(per_class)])
        x = torch.randn(len(labels), dim, generator=gen, dtype=torch.float64) * (k + 1) + k
        samples.append((x, labels))
        parts.append(class_statistics(x, labels, num_classes, torch.tensor(per_class)))
    return samples, parts


def test_pairwise_masks_cancel_exactly_and_hide_each_vector():
    gen = torch.Generator().manual_seed(1)
    vectors = [torch.randn(50, generator=gen, dtype=torch.float64) * 100 for _ in range(4)]
    participants, seeds = [0, 1, 2, 3], [11, 12, 13, 14]
    masked = [mask_vector(v, k, participants, 7, seeds[k]) for k, v in enumerate(vectors)]
    # in the ring, the masks cancel exactly: the masked total equals the encoded total
    exact = sum(encode(v, 4) for v in vectors) % 2**62
    assert torch.equal(unmask_sum(masked, seeds), decode(exact))
    assert torch.allclose(unmask_sum(masked, seeds), sum(vectors), atol=4 * 2.0**-24)
    # no single masked vector (even with its personal mask removed) reveals its input
    for k, v in enumerate(vectors):
        assert (decode(masked[k]) - v).abs().min() > 1.0
        assert (unmask_sum([masked[k]], [seeds[k]]) - v).abs().min() > 1.0


def test_encoding_refuses_values_that_could_overflow_the_ring():
    with pytest.raises(ValueError, match="too large"):
        encode(torch.tensor([2.0**40]), 10)


def test_eq8_pooled_variance_is_the_variance_of_all_samples_with_n_minus_m():
    gen = torch.Generator().manual_seed(0)
    sizes = [[5, 3, 0], [7, 1, 4], [2, 6, 9]]  # class 1 of client 1 has one node: skipped
    samples, parts = random_statistics(gen, sizes)
    pooled = pool_statistics(parts)
    for c in range(3):
        rows = torch.cat([x[(y == c)] for (x, y), per_class in zip(samples, sizes) if per_class[c] >= 2])
        m = sum(per_class[c] >= 2 for per_class in sizes)
        assert pooled.count[c] == rows.size(0) and pooled.clients[c] == m
        assert torch.allclose(pooled.mean[c], rows.mean(dim=0))
        assert torch.allclose(pooled.var[c], rows.var(dim=0, correction=m))
    assert torch.equal(pooled.labelled, torch.tensor([14.0, 10.0, 13.0], dtype=torch.float64))


def test_pooling_from_sums_alone_equals_eq8():
    gen = torch.Generator().manual_seed(2)
    _, parts = random_statistics(gen, [[4, 2, 3], [3, 5, 0], [6, 0, 2]])
    total = sum(ClassSums.of(p).to_vector() for p in parts)
    from_sums = pool_sums(ClassSums.from_vector(total, 3))
    direct = pool_statistics(parts)
    for field in ("count", "mean", "var", "clients", "labelled"):
        assert torch.allclose(getattr(from_sums, field), getattr(direct, field))


def test_secure_mode_uploads_are_masked_and_pool_to_the_plain_result(sbm):
    plain = make_opfgl(sbm, {"secure_aggregation": False})
    secure = make_opfgl(sbm, {"secure_aggregation": True})
    parts_p, parts_s = plain.participants(1), secure.participants(1)
    up_p = plain.client_updates(parts_p, 1)
    up_s = secure.client_updates(parts_s, 1)
    assert all(u.params == {} and u.peer == {} for u in [*up_p.values(), *up_s.values()])
    assert set(up_p[0].extras) == {"count", "mean", "var", "labelled"}
    assert set(up_s[0].extras) == {"masked_sums", "self_mask_seed"}
    for k, upload in up_s.items():
        t = up_p[k].extras
        stats = ClassStatistics(t["count"].double(), t["mean"].double(), t["var"].double(),
                                (t["count"] > 0).double(), t["labelled"].double())
        clear = ClassSums.of(stats).to_vector()
        seen = decode(upload.extras["masked_sums"])
        assert seen.shape == clear.shape
        assert (seen - clear).abs().gt(1.0).float().mean() > 0.99
        assert upload.num_bytes == 8 * clear.numel() + 8
    plain.server_update(1, up_p)
    secure.server_update(1, up_s)
    for field in ("count", "mean", "var", "clients", "labelled"):
        assert torch.allclose(getattr(secure.pooled, field), getattr(plain.pooled, field), atol=1e-5)
    assert plain.pooled.count.sum() > 0


def test_hre_adds_only_confident_non_training_nodes_of_high_degree(sbm):
    method = make_opfgl(sbm)
    client = method.clients[0]
    soft = label_propagation(client, 2, 0.9)
    homophily = class_homophily(client)
    degree = torch.bincount(client.edge_index[0], minlength=client.num_nodes)
    min_degree = int(degree.float().median())
    added = reliable_nodes(client, soft, homophily, 0.5, min_degree, top_k=client.num_classes)
    assert added.any()
    assert not (added & client.train_mask).any()
    assert (degree[added] >= min_degree).all()
    top1 = reliable_nodes(client, soft, homophily, 0.5, 0, top_k=1)
    assert (soft[top1].argmax(dim=1) == homophily.argmax()).all()
    assert not reliable_nodes(client, soft, homophily, 0.5, 0, top_k=0).any()


def test_class_homophily_by_hand():
    # path 0-1-2-3, labels 0 0 1 1, training nodes 0 1 2: h(0)=1, h(1)=1/2, h(2)=0
    client = hand_client(torch.zeros(4, 1), [0, 0, 1, 1], [[0, 1, 1, 2, 2, 3], [1, 0, 2, 1, 3, 2]],
                         [True, True, True, False])
    assert torch.allclose(class_homophily(client), torch.tensor([1.5, 0.0]))


def test_gamma_is_beta_times_soft_label_weights_within_the_clamp_range(sbm):
    method = make_opfgl(sbm)
    client = method.clients[1]
    soft, homophily = label_propagation(client, 2, 0.9), class_homophily(client)
    raw = distillation_weights(soft, homophily, 0.2, 0.0, float("inf"))
    w_dist = 1 / (1 + torch.log(homophily + 1))
    assert torch.allclose(raw[3], 0.2 * (soft[3] * w_dist).sum())
    low, high = float(raw.quantile(0.25)), float(raw.quantile(0.75))
    gamma = distillation_weights(soft, homophily, 0.2, low, high)
    assert gamma.min() >= low and gamma.max() <= high
    inside = (raw >= low) & (raw <= high)
    assert torch.equal(gamma[inside], raw[inside]) and not inside.all()


@pytest.mark.parametrize("predictor", LINK_PREDICTORS)
def test_surrogate_adjacency_is_symmetric_with_zero_diagonal(predictor):
    gen = torch.Generator().manual_seed(0)
    _, parts = random_statistics(gen, [[4, 3, 5], [6, 2, 3]], dim=8)
    target = pool_statistics(parts)
    settings = SurrogateSettings(link_predictor=predictor, iterations=30, hops=0)
    graph = generate_surrogate_graph(target, [2, 2, 2], 8, settings, torch.Generator().manual_seed(0))
    w = graph.weights
    assert torch.equal(w, w.T) and torch.all(w.diagonal() == 0)
    assert torch.all((w == 0) | (w >= settings.delta))
    assert graph.y.tolist() == [0, 0, 1, 1, 2, 2]
    dense = graph.normalized_adjacency().to_dense()
    assert torch.allclose(dense, dense.T) and torch.all(dense.diagonal() > 0)


def test_surrogate_generation_reduces_the_alignment_loss():
    gen = torch.Generator().manual_seed(3)
    _, parts = random_statistics(gen, [[6, 5, 7], [4, 6, 3]], dim=6)
    target = pool_statistics(parts)

    def final_mean_error(iterations):
        settings = SurrogateSettings(iterations=iterations, hops=0, feature_steps=40)
        graph = generate_surrogate_graph(target, [1, 1, 1], 6, settings, torch.Generator().manual_seed(0))
        return float((graph.x - target.mean.float()).pow(2).mean())

    assert final_mean_error(400) < 0.5 * final_mean_error(0)


def test_threshold_delta_one_isolates_all_nodes():
    predictor = build_link_predictor("mlp", 4, 3, 8, torch.Generator().manual_seed(0))
    assert torch.all(edge_weights(predictor, torch.randn(4, 3), 1.0) == 0)


def test_one_round_uploads_and_downloads_once_per_client(sbm):
    method = make_opfgl(sbm)
    calls = {"up": [], "down": []}
    client_update, on_download = method.client_update, method.on_download
    method.client_update = lambda k, r: calls["up"].append(k) or client_update(k, r)
    method.on_download = lambda k, r: calls["down"].append(k) or on_download(k, r)
    initial = [m.convs[0].lin.weight.detach().clone() for m in client_models(method)]
    history = run_federation(method, 1, EvalConfig(model="global", average="weighted"))
    assert calls == {"up": [0, 1, 2], "down": [0, 1, 2]}
    record = history.rounds[0]
    c, d = sbm.num_classes, 2 * sbm.num_features
    assert record["upload_bytes"] == [2 * 8 * c + 2 * 4 * c * d] * 3
    n = method.surrogate.y.numel()
    assert record["download_bytes"] == [4 * n * sbm.num_features + 4 * n * n + 8 * n] * 3
    assert all(not torch.equal(w, m.convs[0].lin.weight) for w, m in zip(initial, client_models(method)))
    assert all(method.eval_model(k, "global") is m for k, m in enumerate(client_models(method)))


def test_opfgl_rejects_more_than_one_round_and_unknown_variants(sbm):
    assert_refused(method_problems("opfgl", rounds=2), "'opfgl' is one-shot: train.rounds must be 1, got 2")
    assert method_problems("opfgl", rounds=1) == []
    assert resolve_method("opfgl", {}).capabilities.one_shot
    with pytest.raises(ConfigError, match="train.rounds must be 1"):
        make_method(sbm, "opfgl", FAST, rounds=2)
    with pytest.raises(ConfigError, match="no_hre"):
        from_dict(OPFGL.Hparams, {"variant": "bogus"}, "hparams of opfgl")


@pytest.mark.parametrize("variant", ["ft", "ft_focal", "ft_fixed_gamma", "no_hre", "global"])
def test_ablation_variants_run_and_distil_only_with_a_teacher(sbm, variant):
    method = make_opfgl(sbm, {"variant": variant})
    history = run_federation(method, 1, EvalConfig(model="global", average="weighted"))
    assert len(history.rounds) == 1 and math.isfinite(history.rounds[0]["train_loss"])
    assert (method.node_gamma(0) is None) == (variant in ("ft", "ft_focal"))


def test_hre_enlarges_the_uploaded_counts_and_no_hre_keeps_training_nodes_only(sbm):
    def pooled(variant):
        method = make_opfgl(sbm, {"variant": variant, "confidence_threshold": 0.5})
        uploads = method.client_updates(method.participants(1), 1)
        method.server_update(1, uploads)
        return method.pooled

    with_hre, without = pooled("full"), pooled("no_hre")
    assert torch.all(without.count <= without.labelled)
    assert with_hre.count.sum() > without.count.sum()
    assert torch.equal(with_hre.labelled, without.labelled)
