"""Partitioners, splits and partition statistics."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fglrepro.config import ConfigError
from fglrepro.data.graph import induced_subgraph
from fglrepro.partition.build import PartitionSpec, build_partition
from fglrepro.partition.data import Partition
from fglrepro.partition.partitioners import (
    balanced_community_assignment,
    get_partitioner,
)
from fglrepro.partition.splits import random_split, stratified_split
from fglrepro.partition.stats import label_js_divergence, partition_stats

SPECS = {
    "louvain": PartitionSpec("louvain", "stratified", 0.2, 0.4, {"delta": 20}),
    "metis": PartitionSpec("metis", "global", 0.3, 0.35),
}


@pytest.mark.parametrize("name", sorted(SPECS))
@pytest.mark.parametrize("clients", [5, 10])
def test_partition_covers_every_node_exactly_once(cora, name, clients):
    part = build_partition(cora, SPECS[name], clients, seed=0)
    assert part.num_clients == clients
    nodes = torch.cat(part.client_nodes)
    assert nodes.numel() == cora.num_nodes
    assert torch.equal(torch.sort(nodes).values, torch.arange(cora.num_nodes))
    for k in range(clients):
        masks = torch.stack([part.train_mask[k], part.val_mask[k], part.test_mask[k]])
        assert torch.equal(masks.sum(0), torch.ones(part.client_nodes[k].numel(), dtype=torch.long))


@pytest.mark.parametrize("name", sorted(SPECS))
def test_partition_is_deterministic_per_seed(cora, name):
    a, b = (build_partition(cora, SPECS[name], 10, seed=3) for _ in range(2))
    for field in ("client_nodes", "train_mask", "val_mask", "test_mask"):
        assert all(torch.equal(x, y) for x, y in zip(getattr(a, field), getattr(b, field)))
    c = build_partition(cora, SPECS[name], 10, seed=4)
    assert not all(torch.equal(x, y) for x, y in zip(a.train_mask, c.train_mask))


def test_louvain_clients_are_balanced_around_n_over_k(cora):
    part = build_partition(cora, SPECS["louvain"], 10, seed=0)
    sizes = np.array([n.numel() for n in part.client_nodes])
    capacity = cora.num_nodes // 10
    assert sizes.max() < capacity + 20 + capacity  # one chunk may overflow the last open client
    assert sizes.min() > 0


def test_balanced_assignment_cuts_large_communities():
    communities = [np.arange(0, 90), np.arange(90, 100)]
    membership = balanced_community_assignment(communities, num_nodes=100, num_clients=2, delta=20)
    sizes = np.bincount(membership, minlength=2)
    # chunks of at most 100 // 2 - 20 = 30 nodes; each client takes chunks while below 50 + 20
    assert sizes.sum() == 100 and sizes.max() <= 70
    for start in range(0, 90, 30):
        assert len(set(membership[start : start + 30])) == 1


def test_balanced_assignment_rejects_impossible_delta():
    with pytest.raises(ConfigError, match="delta"):
        balanced_community_assignment([np.arange(10)], num_nodes=10, num_clients=5, delta=5)


def test_stratified_split_ratios_per_class():
    labels = torch.tensor([0] * 50 + [1] * 20 + [2] * 3 + [3] * 1)
    train, val, test = stratified_split(labels, 0.2, 0.4, torch.Generator().manual_seed(0))
    for c, n in ((0, 50), (1, 20), (2, 3), (3, 1)):
        in_c = labels == c
        assert int(train[in_c].sum()) == int(np.floor(0.2 * n))
        assert int(val[in_c].sum()) == int(np.floor(0.4 * n))
        assert int((train | val | test)[in_c].sum()) == n
    assert not (train & val).any() and not (train & test).any() and not (val & test).any()


def test_random_split_sizes():
    train, val, test = random_split(1000, 0.3, 0.35, torch.Generator().manual_seed(1))
    assert (int(train.sum()), int(val.sum()), int(test.sum())) == (300, 350, 350)


def test_global_split_is_made_before_partitioning(cora):
    a = build_partition(cora, SPECS["metis"], 5, seed=0)
    b = build_partition(cora, SPECS["metis"], 10, seed=0)

    def global_train(part):
        mask = torch.zeros(cora.num_nodes, dtype=torch.bool)
        for nodes, m in zip(part.client_nodes, part.train_mask):
            mask[nodes[m]] = True
        return mask

    assert torch.equal(global_train(a), global_train(b))


def test_unknown_partitioner_lists_valid_names():
    with pytest.raises(ConfigError, match=r"unknown partitioner 'kmeans'.*'louvain'.*'metis'"):
        get_partitioner("kmeans")


def test_stats_of_a_partition(cora):
    part = build_partition(cora, SPECS["metis"], 5, seed=0)
    stats = partition_stats(cora, part)
    assert stats["covered_nodes"] == cora.num_nodes
    assert stats["average"]["nodes"] == pytest.approx(cora.num_nodes / 5)
    assert sum(c["edges"] for c in stats["clients"]) <= cora.edge_index.size(1) // 2
    assert 0 < stats["heterogeneity"] < 1


def test_stats_clustering_of_each_clients_induced_subgraph_by_hand():
    """Client {0, 1, 2, 3}: triangle 0-1-2 and pendant 3 on node 2 -> (1 + 1 + 1/3 + 0) / 4;
    client {4, 5, 6}: a path, 0. The cut edge 3-4 and the chord 4-6's absence decide both."""
    from torch_geometric.data import Data

    undirected = [(0, 1), (1, 2), (0, 2), (2, 3), (3, 4), (4, 5), (5, 6)]
    edges = torch.tensor(undirected + [(v, u) for u, v in undirected]).t()
    data = Data(edge_index=edges, y=torch.zeros(7, dtype=torch.long))
    data.num_classes = 1
    nodes = [torch.tensor([0, 1, 2, 3]), torch.tensor([4, 5, 6])]
    masks = [torch.ones(4, dtype=torch.bool), torch.ones(3, dtype=torch.bool)]
    part = Partition(7, nodes, masks, masks, masks, torch.zeros(2, dtype=torch.bool))
    stats = partition_stats(data, part)
    assert [c["clustering"] for c in stats["clients"]] == pytest.approx([7 / 12, 0.0])
    assert [c["edges"] for c in stats["clients"]] == [4, 2]
    assert stats["average"]["clustering"] == pytest.approx(7 / 24)


def test_stats_count_classes_and_kept_edges_by_hand():
    # path 0-1-2-3, clients {0, 1} and {2, 3}: the middle edge is cut; labels 0,0,1 | 2,3
    from torch_geometric.data import Data

    data = Data(edge_index=torch.tensor([[0, 1, 1, 2, 2, 3], [1, 0, 2, 1, 3, 2]]), y=torch.tensor([0, 0, 1, 2]))
    data.num_classes = 4
    nodes = [torch.tensor([0, 1]), torch.tensor([2, 3])]
    masks = [torch.ones(2, dtype=torch.bool)] * 2
    part = Partition(4, nodes, masks, masks, masks, torch.zeros(2, dtype=torch.bool))
    stats = partition_stats(data, part)
    assert [c["classes"] for c in stats["clients"]] == [1, 2]
    assert stats["average"]["classes"] == 1.5
    assert stats["edges_kept"] == pytest.approx(2 / 3)


def test_js_divergence_bounds():
    p, q = np.array([1.0, 0.0]), np.array([0.0, 1.0])
    assert label_js_divergence(p, q) == pytest.approx(1.0)
    assert label_js_divergence(p, p) == pytest.approx(0.0)


@pytest.mark.parametrize("seed", range(3))
def test_induced_subgraph_equals_pyg_subgraph(seed):
    from torch_geometric.utils import erdos_renyi_graph, subgraph

    torch.manual_seed(seed)
    edge_index = erdos_renyi_graph(60, 0.1)
    gen = torch.Generator().manual_seed(seed)
    nodes = torch.sort(torch.randperm(60, generator=gen)[:25]).values
    expected, _ = subgraph(nodes, edge_index, relabel_nodes=True, num_nodes=60)
    got = induced_subgraph(nodes, edge_index, 60)
    assert got.size(1) > 0
    assert got.dtype == expected.dtype and torch.equal(got, expected)


def test_partition_edges_and_graphless_clients(cora, tmp_path):
    spec = PartitionSpec("metis", "stratified", 0.4, 0.3, graphless_ratio=0.5)
    part = build_partition(cora, spec, 4, seed=0)
    assert isinstance(part, Partition) and int(part.graphless.sum()) == 2
    for k in range(part.num_clients):
        true = part.true_edges(k, cora.edge_index)
        assert torch.equal(true, induced_subgraph(part.client_nodes[k], cora.edge_index, cora.num_nodes))
        assert true.size(1) > 0
        seen = part.client_edges(k, cora.edge_index)
        assert torch.equal(seen, true[:, :0] if bool(part.graphless[k]) else true)
    part.save(tmp_path / "p.pt")
    back = Partition.load(tmp_path / "p.pt")
    assert back.num_nodes == part.num_nodes and torch.equal(back.graphless, part.graphless)
    assert all(torch.equal(a, b) for a, b in zip(back.client_nodes, part.client_nodes))
