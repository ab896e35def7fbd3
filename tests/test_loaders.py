"""Every registered dataset goes through its official PyG / OGB loader, offline.

Each test writes a tiny graph in the loader's native on-disk raw format, so the
loader's own parsing code runs on it, and the network and stdin are closed: a
loader that looks for a missing file (and would download) or prompts fails the test.
"""

from __future__ import annotations

import gzip
import json
import pickle
import socket
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import scipy.io
import scipy.sparse as sp
import torch
from torch_geometric.utils import to_undirected

from fglrepro.config import ConfigError
from fglrepro.data.checksums import ChecksumError, sha256
from fglrepro.data.download import fetch_raw
from fglrepro.data.prepare import prepare_graph
from fglrepro.data.registry import DATASETS, DatasetSpec, get_dataset

PAPER_DATASETS = {
    "Cora", "CiteSeer", "PubMed", "Photo", "Computers", "CS", "Physics", "ogbn-arxiv",
    "ogbn-products", "Flickr", "Reddit", "Reddit2", "Actor", "genius",
}


@dataclass(frozen=True)
class TinyGraph:
    """x: [N, F] float32 0/1 (no empty row or column), y: [N] int64 using every class,
    edges: [2, M] int64 undirected edges listed once (u < v), no duplicates."""

    x: np.ndarray
    y: np.ndarray
    edges: np.ndarray


def tiny_graph(num_nodes: int = 40, num_features: int = 6, num_classes: int = 3) -> TinyGraph:
    rng = np.random.default_rng(0)
    nodes = np.arange(num_nodes)
    x = (rng.random((num_nodes, num_features)) < 0.3).astype(np.float32)
    x[nodes, nodes % num_features] = 1.0
    y = rng.permutation(nodes % num_classes).astype(np.int64)
    pairs = rng.integers(0, num_nodes, size=(2 * num_nodes, 2))
    pairs = np.unique(np.sort(pairs[pairs[:, 0] != pairs[:, 1]], axis=1), axis=0)
    return TinyGraph(x, y, pairs.T.astype(np.int64))


def adjacency(graph: TinyGraph, both_directions: bool) -> sp.csr_matrix:
    """[N, N] 0/1 adjacency holding each edge once (u -> v) or in both directions."""
    row, col = graph.edges
    if both_directions:
        row, col = np.concatenate([row, col]), np.concatenate([col, row])
    n = len(graph.y)
    return sp.csr_matrix((np.ones(len(row), dtype=np.float32), (row, col)), shape=(n, n))


def write_planetoid(raw_dir: Path, spec: DatasetSpec, graph: TinyGraph) -> None:
    """``ind.<name>.*`` pickles: labelled x/y, all-but-test allx/ally, tx/ty in test.index order."""
    n, num_labelled, num_test = len(graph.y), 6, 20
    test_index = np.random.default_rng(1).permutation(np.arange(n - num_test, n))
    one_hot = np.eye(graph.y.max() + 1)[graph.y]
    neighbours = {i: [] for i in range(n)}
    for u, v in graph.edges.T:
        neighbours[int(u)].append(int(v))
        neighbours[int(v)].append(int(u))
    objects = {
        "x": sp.csr_matrix(graph.x[:num_labelled]), "y": one_hot[:num_labelled],
        "allx": sp.csr_matrix(graph.x[: n - num_test]), "ally": one_hot[: n - num_test],
        "tx": sp.csr_matrix(graph.x[test_index]), "ty": one_hot[test_index],
        "graph": neighbours,
    }
    prefix = raw_dir / f"ind.{spec.loader_name.lower()}"
    for suffix, obj in objects.items():
        Path(f"{prefix}.{suffix}").write_bytes(pickle.dumps(obj, protocol=2))
    Path(f"{prefix}.test.index").write_text("".join(f"{i}\n" for i in test_index))


def write_gnn_benchmark(raw_dir: Path, spec: DatasetSpec, graph: TinyGraph) -> None:
    """Amazon / Coauthor npz: CSR adjacency and attributes as flat arrays, plus labels."""
    adj, attr = adjacency(graph, both_directions=False), sp.csr_matrix(graph.x)
    np.savez(
        raw_dir / spec.raw_files[0],
        adj_data=adj.data, adj_indices=adj.indices, adj_indptr=adj.indptr, adj_shape=adj.shape,
        attr_data=attr.data, attr_indices=attr.indices, attr_indptr=attr.indptr,
        attr_shape=attr.shape, labels=graph.y,
    )


def node_roles(num_nodes: int) -> np.ndarray:
    """[N] split role per node: 1 train, 2 validation, 3 test."""
    return np.arange(num_nodes) % 3 + 1


def write_graphsaint(raw_dir: Path, spec: DatasetSpec, graph: TinyGraph) -> None:
    """GraphSAINT (Flickr, Reddit2): symmetric CSR adjacency, features, label and role maps."""
    sp.save_npz(raw_dir / "adj_full.npz", adjacency(graph, both_directions=True))
    np.save(raw_dir / "feats.npy", graph.x)
    (raw_dir / "class_map.json").write_text(
        json.dumps({str(i): int(label) for i, label in enumerate(graph.y)})
    )
    roles = node_roles(len(graph.y))
    (raw_dir / "role.json").write_text(json.dumps(
        {key: np.flatnonzero(roles == r).tolist() for key, r in (("tr", 1), ("va", 2), ("te", 3))}
    ))


def write_reddit(raw_dir: Path, spec: DatasetSpec, graph: TinyGraph) -> None:
    """DGL Reddit: features, labels, split roles in one npz; symmetric COO adjacency."""
    np.savez(raw_dir / "reddit_data.npz", feature=graph.x, label=graph.y,
             node_types=node_roles(len(graph.y)))
    sp.save_npz(raw_dir / "reddit_graph.npz", adjacency(graph, both_directions=True).tocoo())


def write_actor(raw_dir: Path, spec: DatasetSpec, graph: TinyGraph) -> None:
    """Geom-GCN film: tab-separated feature indices and labels, edge list, ten split masks."""
    lines = ["node_id\tfeature\tlabel"] + [
        f"{i}\t{','.join(map(str, np.flatnonzero(row)))}\t{label}"
        for i, (row, label) in enumerate(zip(graph.x, graph.y))
    ]
    (raw_dir / "out1_node_feature_label.txt").write_text("\n".join(lines) + "\n")
    edges = ["node_id\tnode_id"] + [f"{u}\t{v}" for u, v in graph.edges.T]
    (raw_dir / "out1_graph_edges.txt").write_text("\n".join(edges) + "\n")
    roles = node_roles(len(graph.y))
    for name in spec.raw_files[2:]:
        np.savez(raw_dir / name, train_mask=roles == 1, val_mask=roles == 2, test_mask=roles == 3)


def write_genius(raw_dir: Path, spec: DatasetSpec, graph: TinyGraph) -> None:
    """LINKX genius.mat (stored as data.mat): edge_index [2, E], node_feat [N, F], label [1, N]."""
    scipy.io.savemat(raw_dir / "data.mat", {
        "edge_index": graph.edges, "node_feat": graph.x, "label": graph.y[None, :],
    })


def write_ogbn(raw_dir: Path, spec: DatasetSpec, graph: TinyGraph) -> None:
    """OGB raw CSVs without header, gzipped; ogbn-arxiv also has node_year."""
    n, m = len(graph.y), graph.edges.shape[1]
    tables = {
        "edge": (graph.edges.T, "%d"), "node-feat": (graph.x, "%.6f"),
        "node-label": (graph.y[:, None], "%d"),
        "num-node-list": ([[n]], "%d"), "num-edge-list": ([[m]], "%d"),
        "node_year": (np.full((n, 1), 2019), "%d"),
    }
    for name in spec.raw_files:
        rows, fmt = tables[name.removesuffix(".csv.gz")]
        with gzip.open(raw_dir / name, "wt") as handle:
            np.savetxt(handle, np.asarray(rows), fmt=fmt, delimiter=",")


WRITERS = {
    "planetoid": write_planetoid, "amazon": write_gnn_benchmark, "coauthor": write_gnn_benchmark,
    "flickr": write_graphsaint, "reddit2": write_graphsaint, "reddit": write_reddit,
    "actor": write_actor, "linkx": write_genius, "ogbn": write_ogbn,
}


def write_raw(raw_dir: Path, spec: DatasetSpec) -> TinyGraph:
    """Write a tiny graph as ``spec``'s raw files; Planetoid needs 500 validation nodes."""
    graph = tiny_graph(num_nodes=540 if spec.loader == "planetoid" else 40)
    raw_dir.mkdir(parents=True, exist_ok=True)
    WRITERS[spec.loader](raw_dir, spec, graph)
    assert sorted(p.name for p in raw_dir.iterdir()) == sorted(spec.raw_files)
    return graph


def assert_same_graph(data, graph: TinyGraph) -> None:
    num_nodes, num_features = graph.x.shape
    assert (data.num_nodes, data.num_features, data.num_classes) == (num_nodes, num_features, 3)
    assert torch.equal(data.x, torch.from_numpy(graph.x))
    assert torch.equal(data.y, torch.from_numpy(graph.y))
    assert data.edge_index.size(1) == 2 * graph.edges.shape[1]
    assert torch.equal(data.edge_index, to_undirected(torch.from_numpy(graph.edges)))


@pytest.fixture(autouse=True)
def offline(monkeypatch):
    """Fail on any network connection (a download) or stdin prompt."""
    def refuse_network(*args, **kwargs):
        raise AssertionError(f"a loader tried the network: {args}")

    def refuse_prompt(prompt=""):
        raise AssertionError(f"a loader prompted on stdin: {prompt!r}")

    monkeypatch.setattr(socket, "getaddrinfo", refuse_network)
    monkeypatch.setattr(socket.socket, "connect", refuse_network)
    monkeypatch.setattr("builtins.input", refuse_prompt)


def test_registry_holds_the_papers_datasets():
    assert set(DATASETS) == PAPER_DATASETS
    assert {spec.size for spec in DATASETS.values()} == {"small", "medium", "large"}
    assert {get_dataset(n).size for n in ("Reddit", "Reddit2", "ogbn-products")} == {"large"}


def test_invalid_size_names_value_and_choices():
    with pytest.raises(ConfigError, match=r"size of dataset 'X' = 'huge'.*'small', 'medium'"):
        DatasetSpec("X", "planetoid", "X", "X/raw", (), "huge")


@pytest.mark.parametrize("name", sorted(PAPER_DATASETS))
def test_official_loader_parses_native_raw_files(tmp_path, name):
    spec = get_dataset(name)
    graph = write_raw(tmp_path / spec.raw_subdir, spec)
    data = prepare_graph(spec, tmp_path, largest_component=False, normalize_features=False)
    assert_same_graph(data, graph)


@pytest.mark.parametrize("name", ["ogbn-arxiv", "genius"])
def test_fetch_raw_from_mirror(tmp_path, name):
    spec = get_dataset(name)
    mirror = tmp_path / "mirror"
    graph = write_raw(mirror, spec)
    sums = {file: sha256(mirror / file) for file in spec.raw_files}
    (mirror / "SHA256SUMS").write_text("".join(f"{d}  {f}\n" for f, d in sums.items()))
    record = fetch_raw(spec, tmp_path / "raw", mirror)
    assert record["source"] == f"mirror:{mirror}" and record["files"] == sums
    assert not record["pinned"]
    data = prepare_graph(spec, tmp_path / "raw", largest_component=False, normalize_features=False)
    assert_same_graph(data, graph)


@pytest.mark.parametrize("name", ["Actor", "Photo", "CS"])
def test_pinned_digest_wins_over_a_mirrors_own_sums(tmp_path, name):
    """A mirror's SHA256SUMS cannot vouch for other bytes than the official files the package pins."""
    spec = get_dataset(name)
    mirror = tmp_path / "mirror" / spec.mirror_subdir
    write_raw(mirror, spec)
    (mirror / "SHA256SUMS").write_text("".join(f"{sha256(mirror / f)}  {f}\n" for f in spec.raw_files))
    with pytest.raises(ChecksumError, match=rf"checksum mismatch for {mirror / spec.raw_files[0]} .*pinned"):
        fetch_raw(spec, tmp_path / "raw", tmp_path / "mirror")
    assert not (tmp_path / "raw" / spec.raw_subdir / spec.raw_files[0]).exists()


def test_stale_ogb_release_is_an_error_naming_the_folder(tmp_path):
    spec = get_dataset("ogbn-arxiv")
    write_raw(tmp_path / spec.raw_subdir, spec)
    (tmp_path / "ogbn_arxiv" / "RELEASE_v0.txt").touch()
    with pytest.raises(ConfigError, match=r"RELEASE_v0.txt.*RELEASE_v1.txt; delete .*ogbn_arxiv"):
        prepare_graph(spec, tmp_path, largest_component=False, normalize_features=False)
