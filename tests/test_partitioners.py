"""Every registered partitioner, graphless clients and the per-client random split."""

from __future__ import annotations

import inspect
import json
import random
import subprocess
import sys

import numpy as np
import pytest
import torch
from conftest import make_sbm

from fglrepro.config import ConfigError
from fglrepro.fl.clients import build_clients
from fglrepro.partition.build import PartitionSpec, build_partition
from fglrepro.partition.partitioners import (
    PARTITIONERS,
    balanced_community_assignment,
    community_chunks,
    dirichlet_assignment,
    get_partitioner,
    louvain_membership,
    louvain_parts,
    metis_membership,
)
from fglrepro.partition.splits import random_split

CLIENTS = 5
OPTIONS = {
    "louvain": {"delta": 5},
    "metis": {},
    "metis_overlap": {},
    "louvain_communities": {},
    "louvain_plus": {"num_communities": 16, "delta": 5},
    "metis_plus": {"num_communities": 16},
    "dirichlet": {"min_size": 5},
}
DISJOINT = sorted(set(PARTITIONERS) - {"metis_overlap", "louvain_communities"})


@pytest.fixture(scope="module")
def graph():
    """320 nodes in 8 planted blocks of 40, labels = blocks."""
    return make_sbm(num_blocks=8, block_size=40)


@pytest.fixture(scope="module", autouse=True)
def external_file(tmp_path_factory, graph):
    """``OPTIONS["external"]``: a file of CLIENTS clients of consecutive nodes of ``graph``."""
    path = tmp_path_factory.mktemp("external") / "partition.json"
    parts = torch.arange(graph.num_nodes).chunk(CLIENTS)
    path.write_text(json.dumps({"clients": [{"nodes": part.tolist()} for part in parts]}))
    OPTIONS["external"] = {"path": str(path)}


def run(name, data, seed=0, clients=CLIENTS, **options):
    return get_partitioner(name)(data, clients, seed, **{**OPTIONS[name], **options})


def test_every_partitioner_has_test_options_and_the_common_signature():
    assert set(OPTIONS) == set(PARTITIONERS)
    for fn in PARTITIONERS.values():
        assert list(inspect.signature(fn).parameters)[:3] == ["data", "num_clients", "seed"]


@pytest.mark.parametrize("name", sorted(PARTITIONERS))
def test_partitioner_is_deterministic_per_seed(graph, name):
    random.seed(1)
    a = run(name, graph, seed=3)
    random.seed(2)
    b = run(name, graph, seed=3)
    assert len(a) == len(b) == CLIENTS
    assert all(torch.equal(x, y) for x, y in zip(a, b))


@pytest.mark.parametrize("name", ["metis_overlap", "dirichlet"])
def test_seed_changes_random_partitioners(graph, name):
    a, b = run(name, graph, seed=0), run(name, graph, seed=1)
    assert not all(torch.equal(x, y) for x, y in zip(a, b))


@pytest.mark.parametrize("name", DISJOINT)
def test_disjoint_partitioners_cover_every_node_once(graph, name):
    clients = run(name, graph)
    assert len(clients) == CLIENTS
    assert all(torch.equal(c, torch.sort(c).values) and c.numel() > 0 for c in clients)
    assert torch.equal(torch.sort(torch.cat(clients)).values, torch.arange(graph.num_nodes))


def test_metis_overlap_clients_take_half_of_their_part(graph):
    clients = run("metis_overlap", graph, clients=10)
    parts = metis_membership(graph.edge_index, graph.num_nodes, 2, seed=0)
    assert len(clients) == 10
    for k, nodes in enumerate(clients):
        part = k // 5
        assert (parts[nodes.numpy()] == part).all()
        assert nodes.numel() == int(0.5 * (parts == part).sum())
        assert nodes.unique().numel() == nodes.numel()
    covered = torch.unique(torch.cat(clients)).numel()
    assert covered > 0.8 * graph.num_nodes  # a node misses all 5 draws of its part w.p. 1/32
    assert not torch.equal(clients[0], clients[1])


def test_metis_overlap_needs_a_multiple_of_five_clients(graph):
    with pytest.raises(ConfigError, match="multiple of clients_per_part=5, got 7"):
        run("metis_overlap", graph, clients=7)


def test_louvain_communities_are_the_largest_whole_communities(graph):
    clients = run("louvain_communities", graph, clients=4)
    membership = louvain_membership(graph.edge_index, graph.num_nodes, seed=0)
    sizes = np.bincount(membership)
    kept = []
    for nodes in clients:
        community = np.unique(membership[nodes.numpy()])
        assert community.size == 1 and sizes[community[0]] == nodes.numel()
        kept.append(community[0])
    dropped = np.delete(sizes, kept)
    assert dropped.size == 0 or dropped.max() <= min(c.numel() for c in clients)


def test_louvain_communities_rejects_too_many_clients(graph):
    with pytest.raises(ConfigError, match="communities, fewer than 300 clients"):
        run("louvain_communities", graph, clients=300)


def _communities_within_one_client(clients, communities):
    owner = np.full(communities.size, -1)
    for k, nodes in enumerate(clients):
        owner[nodes.numpy()] = k
    pairs = np.unique(np.stack([communities, owner]), axis=1)
    return np.unique(pairs[0]).size == pairs.shape[1]


def test_label_imbalance_clients_are_unions_of_communities(graph):
    louvain_communities = louvain_parts(graph, 16, seed=0, delta=5, resolution=1.0)
    metis_communities = metis_membership(graph.edge_index, graph.num_nodes, 16, seed=0)
    assert _communities_within_one_client(run("louvain_plus", graph), louvain_communities)
    assert _communities_within_one_client(run("metis_plus", graph), metis_communities)


def test_label_imbalance_needs_enough_communities(graph):
    with pytest.raises(ConfigError, match="raise num_communities"):
        run("metis_plus", graph, num_communities=3)


@pytest.mark.filterwarnings("ignore::sklearn.exceptions.ConvergenceWarning")
def test_label_imbalance_reports_empty_clusters():
    data = make_sbm(num_blocks=1, block_size=80)  # one label: every histogram is identical
    with pytest.raises(ConfigError, match="KMeans left clients"):
        get_partitioner("metis_plus")(data, 3, 0, num_communities=8)


def test_dirichlet_assignment_follows_the_shares():
    labels = torch.tensor([0] * 100 + [1] * 7 + [2] * 0 + [3] * 1)
    shares = np.random.default_rng(0).dirichlet(np.full(3, 0.5), size=4)
    np.testing.assert_allclose(shares.sum(1), 1.0)
    client = dirichlet_assignment(labels, 4, shares, np.random.default_rng(1))
    counts = np.zeros((4, 3), dtype=int)
    np.add.at(counts, (labels.numpy(), client), 1)
    class_sizes = np.array([100, 7, 0, 1])
    bounds = np.floor(np.cumsum(shares, 1) * class_sizes[:, None]).astype(int)
    bounds[:, -1] = class_sizes
    np.testing.assert_array_equal(counts, np.diff(bounds, prepend=0))


def test_dirichlet_respects_min_size(graph):
    clients = run("dirichlet", graph, min_size=20)
    assert min(c.numel() for c in clients) >= 20


@pytest.mark.parametrize(("options", "match"), [
    ({"min_size": 100}, "exceeds 320 nodes"),
    ({"min_size": 60, "max_attempts": 1, "alpha": 0.01}, "no draw in 1 attempts"),
    ({"alpha": 0.0}, "alpha=0.0 must be > 0"),
])
def test_dirichlet_errors_are_actionable(graph, options, match):
    with pytest.raises(ConfigError, match=match):
        run("dirichlet", graph, **options)


@pytest.mark.parametrize("ratio", [0.5, 0.25])
def test_graphless_clients_have_no_edges(graph, ratio):
    spec = PartitionSpec("metis", "random", 0.6, 0.2, graphless_ratio=ratio)
    part = build_partition(graph, spec, 4, seed=0)
    assert int(part.graphless.sum()) == round(ratio * 4)
    clients = build_clients(graph, part, torch.device("cpu"))
    for k, client in enumerate(clients):
        edges = part.client_edges(k, graph.edge_index)
        if part.graphless[k]:
            assert edges.size(1) == 0 and client.edge_index.size(1) == 0
            assert torch.equal(client.adj.to_dense(), torch.eye(client.num_nodes))
        else:
            assert edges.size(1) > 0 and client.edge_index.size(1) == edges.size(1)


def test_graphless_choice_is_seeded_and_nested(graph):
    half, quarter = (
        build_partition(graph, PartitionSpec("metis", "global", 0.6, 0.2, graphless_ratio=r), 8, seed=5).graphless
        for r in (0.5, 0.25)
    )
    assert int(half.sum()) == 4 and int(quarter.sum()) == 2
    assert bool((half | ~quarter).all())
    assert not build_partition(graph, PartitionSpec("metis", "global", 0.6, 0.2), 8, seed=5).graphless.any()


def test_spec_from_dict_reads_graphless_ratio_and_rejects_unknown_keys():
    values = {"partitioner": "louvain_communities", "split": {"mode": "random", "train": 0.6, "val": 0.2},
              "graphless_ratio": 0.5}
    assert PartitionSpec.from_dict(values).graphless_ratio == 0.5
    assert PartitionSpec.from_dict({**values, "graphless_ratio": 0}).graphless_ratio == 0.0
    with pytest.raises(ConfigError, match=r"unknown key\(s\) \['graphless'\]"):
        PartitionSpec.from_dict({**values, "graphless": 0.5})
    with pytest.raises(ConfigError, match="graphless_ratio = 1.5"):
        PartitionSpec.from_dict({**values, "graphless_ratio": 1.5})


def test_spec_rejects_unknown_partitioner_options():
    with pytest.raises(ConfigError, match=r"unknown option\(s\) \['delta'\] of partitioner 'metis'"):
        PartitionSpec("metis", "global", 0.3, 0.3, {"delta": 20})
    with pytest.raises(ConfigError, match=r"valid options: \['alpha', 'min_size', 'max_attempts'\]"):
        PartitionSpec("dirichlet", "global", 0.3, 0.3, {"beta": 1})


def test_random_split_per_client(graph):
    spec = PartitionSpec("dirichlet", "random", 0.6, 0.2, {"min_size": 5})
    part = build_partition(graph, spec, CLIENTS, seed=0)
    for nodes, train, val, test in zip(part.client_nodes, part.train_mask, part.val_mask, part.test_mask):
        n = nodes.numel()
        assert (int(train.sum()), int(val.sum())) == (int(0.6 * n), int(0.2 * n))
        assert torch.equal(train.long() + val.long() + test.long(), torch.ones(n, dtype=torch.long))


@pytest.mark.parametrize("n", [0, 1, 2, 3])
def test_random_split_of_tiny_clients(n):
    train, val, test = random_split(n, 0.6, 0.2, torch.Generator().manual_seed(0))
    assert int(train.sum()) == int(0.6 * n) and int(val.sum()) == int(0.2 * n)
    assert int(test.sum()) == n - int(0.6 * n) - int(0.2 * n)


@pytest.mark.parametrize("library", ["igraph", "python-louvain"])
def test_louvain_libraries_find_the_planted_blocks_deterministically(graph, library):
    first = louvain_membership(graph.edge_index, graph.num_nodes, seed=3, library=library)
    again = louvain_membership(graph.edge_index, graph.num_nodes, seed=3, library=library)
    np.testing.assert_array_equal(first, again)
    blocks = graph.y.numpy()
    pairs = np.unique(np.stack([first, blocks]), axis=1)
    assert np.unique(pairs[0]).size == pairs.shape[1]


def test_unknown_louvain_library_names_the_choices(graph):
    with pytest.raises(ConfigError, match=r"partition.options.library.*'igraph'.*'python-louvain'"):
        run("louvain", graph, library="networkx")


def _chunk_ids(chunks):
    return [(int(c[0]), len(c)) for c in chunks]


@pytest.mark.parametrize("order, expected", [
    # A = 0..16 (17 nodes), B = 17..21 (5), C = 22..37 (16); chunks of <= 7 nodes, then a stable largest-first sort
    ("authors", [(0, 7), (22, 7), (7, 7), (29, 7), (17, 5), (14, 3), (36, 2)]),  # A0 C0 A1 C1 B A2 C2
    ("community", [(0, 7), (7, 7), (22, 7), (29, 7), (17, 5), (14, 3), (36, 2)]),  # A0 A1 C0 C1 B A2 C2
])
def test_chunk_order_matches_the_hand_derived_sequence(order, expected):
    communities = [np.arange(0, 17), np.arange(17, 22), np.arange(22, 38)]
    chunks = community_chunks(communities, max_chunk=7, order=order)
    assert _chunk_ids(chunks) == expected
    assert all(np.array_equal(c, np.arange(c[0], c[0] + len(c))) for c in chunks)


@pytest.mark.parametrize("order", ["authors", "community"])
def test_balanced_assignment_covers_every_node_once_in_both_orders(order):
    communities = [np.arange(0, 17), np.arange(17, 22), np.arange(22, 38), np.arange(38, 40)]
    membership = balanced_community_assignment(communities, 40, num_clients=4, delta=3, chunk_order=order)
    assert membership.shape == (40,) and (membership >= 0).all()
    assert np.bincount(membership, minlength=4).sum() == 40 and np.bincount(membership).min() > 0


@pytest.mark.parametrize("order", ["authors", "community"])
def test_louvain_plus_chunk_orders_are_deterministic_and_cover_every_node_once(graph, order):
    a, b = (run("louvain_plus", graph, seed=2, chunk_order=order) for _ in range(2))
    assert all(torch.equal(x, y) for x, y in zip(a, b))
    assert torch.equal(torch.sort(torch.cat(a)).values, torch.arange(graph.num_nodes))


def test_louvain_plus_defaults_to_the_authors_chunk_order(graph):
    default, authors = run("louvain_plus", graph), run("louvain_plus", graph, chunk_order="authors")
    assert all(torch.equal(x, y) for x, y in zip(default, authors))


def test_spec_rejects_an_unknown_chunk_order_naming_the_choices():
    with pytest.raises(ConfigError, match=r"partition.options.chunk_order = 'random'.*\['authors', 'community'\]"):
        PartitionSpec("louvain_plus", "stratified", 0.2, 0.4, {"chunk_order": "random"})


def test_igraph_loads_without_matplotlib_which_stays_importable():
    """Louvain's igraph import skips igraph's plotting back-end (a third of a partition job's
    CPU); matplotlib itself is importable afterwards."""
    code = ("import sys; from fglrepro.partition.partitioners import import_igraph; "
            "graph = import_igraph().Graph(n=3); print('matplotlib' in sys.modules); "
            "import matplotlib.pyplot; print('matplotlib.pyplot' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "True"]
