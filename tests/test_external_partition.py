"""The ``external`` partitioner: a partition and its splits read from a JSON file, validated."""

from __future__ import annotations

import json

import pytest
from conftest import make_sbm

from fglrepro.config import ConfigError
from fglrepro.data import checksums
from fglrepro.partition.build import PartitionSpec, build_partition

NUM_NODES = 40  # make_sbm(num_blocks=4, block_size=10)


def valid_document() -> dict:
    """Two clients, nodes 0..19 and 20..39, with 4 / 4 / 8 train / val / test nodes (4 in no split)."""
    clients = []
    for first in (0, 20):
        nodes = list(range(first, first + 20))
        clients.append({"nodes": nodes, "train": nodes[:4], "val": nodes[4:8], "test": nodes[8:16]})
    return {"dataset": "SBM", "num_nodes": NUM_NODES, "clients": clients}


def write(tmp_path, document) -> str:
    path = tmp_path / "partition.json"
    path.write_text(json.dumps(document))
    return str(path)


def spec(path, split="file", **options):
    fractions = (None, None) if split == "file" else (0.5, 0.25)
    return PartitionSpec("external", split, *fractions, {"path": path, **options})


@pytest.fixture(scope="module")
def graph():
    return make_sbm(num_blocks=4, block_size=10)


def test_the_file_gives_clients_and_splits_for_every_seed(graph, tmp_path):
    path = write(tmp_path, valid_document())
    for seed in (0, 1):
        part = build_partition(graph, spec(path), 2, seed=seed)
        assert [n.tolist() for n in part.client_nodes] == [list(range(20)), list(range(20, 40))]
        for k, first in enumerate((0, 20)):
            assert part.client_nodes[k][part.train_mask[k]].tolist() == list(range(first, first + 4))
            assert part.client_nodes[k][part.val_mask[k]].tolist() == list(range(first + 4, first + 8))
            assert part.client_nodes[k][part.test_mask[k]].tolist() == list(range(first + 8, first + 16))


def test_our_split_can_replace_the_files(graph, tmp_path):
    document = valid_document()
    for client in document["clients"]:
        del client["train"], client["val"], client["test"]
    part = build_partition(graph, spec(write(tmp_path, document), split="random"), 2, seed=0)
    assert [int(m.sum()) for m in part.train_mask] == [10, 10]


def _set(document, client, key, value):
    document["clients"][client][key] = value
    return document


@pytest.mark.parametrize("edit, match", [
    (lambda d: _set(d, 1, "nodes", list(range(20, 39)) + [40, 41]),
     r"client 1 'nodes' has ids outside \[0, 40\): \[40, 41\]"),
    (lambda d: _set(d, 1, "nodes", list(range(18, 40))), r"client 1 shares nodes with client\(s\) \[0\]: \[18, 19\]"),
    (lambda d: _set(d, 0, "nodes", []), r"client 0 has no nodes"),
    (lambda d: _set(d, 0, "nodes", list(range(20)) + [3]), r"client 0 'nodes' lists ids more than once: \[3\]"),
    (lambda d: _set(d, 0, "test", [8, 25]), r"client 0 'test' has ids outside the client: \[25\]"),
    (lambda d: _set(d, 1, "val", [20, 24]), r"client 1 has ids in both 'train' and 'val': \[20\]"),
    (lambda d: _set(d, 0, "train", [0, "1"]), r"client 0 'train' must be a list of integer node ids"),
    (lambda d: {**d, "num_nodes": 41}, r"for a graph of 41 nodes; this graph has 40"),
    (lambda d: {**d, "clients": []}, r"non-empty list 'clients'"),
])
def test_invalid_files_name_the_client_and_the_bad_ids(graph, tmp_path, edit, match):
    path = write(tmp_path, edit(valid_document()))
    with pytest.raises(ConfigError, match=match):
        build_partition(graph, spec(path), 2, seed=0)


def test_file_split_needs_splits_in_the_file(graph, tmp_path):
    document = valid_document()
    del document["clients"][1]["test"]
    with pytest.raises(ConfigError, match=r"needs \['train', 'val', 'test'\] for every client; clients \[1\]"):
        build_partition(graph, spec(write(tmp_path, document)), 2, seed=0)


def test_client_count_missing_file_and_digest_are_checked(graph, tmp_path):
    path = write(tmp_path, valid_document())
    with pytest.raises(ConfigError, match=r"holds 2 clients; the study asks for 3"):
        build_partition(graph, spec(path), 3, seed=0)
    with pytest.raises(ConfigError, match=r"partition file .*absent.json does not exist"):
        build_partition(graph, spec(str(tmp_path / "absent.json")), 2, seed=0)
    build_partition(graph, spec(path, sha256=checksums.sha256(path)), 2, seed=0)
    with pytest.raises(ConfigError, match=r"has SHA-256 [0-9a-f]{64}, expected 0+"):
        build_partition(graph, spec(path, sha256="0" * 64), 2, seed=0)


def test_file_split_mode_is_only_for_the_external_partitioner_and_takes_no_fractions():
    with pytest.raises(ConfigError, match=r"mode 'file' needs partitioner 'external', got 'metis'"):
        PartitionSpec("metis", "file", None, None)
    with pytest.raises(ConfigError, match=r"leave out train and val"):
        PartitionSpec("external", "file", 0.2, 0.4, {"path": "x.json"})
    with pytest.raises(ConfigError, match=r"mode 'stratified' needs train and val"):
        PartitionSpec("external", "stratified", None, None, {"path": "x.json"})
    read = PartitionSpec.from_dict({"partitioner": "external", "options": {"path": "x.json"},
                                    "split": {"mode": "file"}})
    assert (read.split, read.train, read.val) == ("file", None, None)


@pytest.mark.e2e
def test_the_workflow_takes_the_file_from_partition_dir_with_its_digest(tmp_path):
    from test_validation import dry_run, make_study, make_workdir

    study = make_study()
    study.update(datasets=["Cora"], clients=[2], seeds=[0])
    study["partition"] = {"partitioner": "external", "options": {"path": "cora.json"}, "split": {"mode": "file"}}
    work = make_workdir(tmp_path, study)
    files = tmp_path / "files"
    files.mkdir()
    nodes = [list(range(1354)), list(range(1354, 2708))]
    document = {"num_nodes": 2708, "clients": [{"nodes": n, "train": n[:10], "val": n[10:20], "test": n[20:]}
                                               for n in nodes]}
    missing = dry_run(work, "--config", f"partition_dir={files}")
    assert missing.returncode != 0
    assert f"partition file {files}/cora.json does not exist" in missing.stdout + missing.stderr
    (files / "cora.json").write_text(json.dumps(document))
    found = dry_run(work, "-p", "--config", f"partition_dir={files}")
    assert found.returncode == 0, found.stdout + found.stderr
    digest = checksums.sha256(files / "cora.json")
    assert f'"sha256": "{digest}"' in found.stdout, found.stdout
