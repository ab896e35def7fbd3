"""Verified raw files and the canonical prepared graph."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from fglrepro.config import ConfigError
from fglrepro.data.checksums import ChecksumError, sha256
from fglrepro.data.download import PINNED_SUMS, fetch_raw, pinned_checksums
from fglrepro.data.graph import Graph, load_graph, save_graph
from fglrepro.data.prepare import prepare_graph
from fglrepro.data.registry import get_dataset


def test_mirror_files_are_verified_and_placed_in_loader_layout(tmp_path, mirror_copy):
    record = fetch_raw(get_dataset("Cora"), tmp_path, mirror_copy)
    assert record["source"].startswith("mirror") and record["pinned"]
    assert sorted(p.name for p in (tmp_path / "Cora" / "raw").iterdir()) == sorted(record["files"])


def test_corrupt_mirror_file_raises_and_is_not_used(tmp_path, mirror_copy):
    target = mirror_copy / "ind.cora.x"
    target.write_bytes(target.read_bytes()[:-1] + b"\0")
    with pytest.raises(ChecksumError) as err:
        fetch_raw(get_dataset("Cora"), tmp_path, mirror_copy)
    message = str(err.value)
    expected = pinned_checksums()["ind.cora.x"]
    assert f"checksum mismatch for {target} " in message  # the mirror file, not the partial copy
    assert f"expected sha256 {expected} (listed in {PINNED_SUMS})" in message
    assert f"got {sha256(target)}" in message and sha256(target) != expected
    raw_dir = tmp_path / "Cora" / "raw"
    assert not (raw_dir / "ind.cora.x").exists()
    assert not list(raw_dir.glob("*.part"))


def test_prepared_cora_is_undirected_without_self_loops(cora):
    assert (cora.num_nodes, cora.num_features, cora.num_classes) == (2708, 1433, 7)
    assert cora.is_undirected() and not cora.has_self_loops()
    assert cora.edge_index.size(1) == 10556


def test_largest_component_and_row_normalisation(raw_root):
    data = prepare_graph(get_dataset("Cora"), raw_root, largest_component=True, normalize_features=True)
    assert data.num_nodes == 2485  # FedGKD Table 2 / FED-PUB preprocessing
    row_sums = data.x.sum(1)
    assert torch.allclose(row_sums[row_sums > 0], torch.ones(int((row_sums > 0).sum())))


def test_prepared_graph_roundtrip(tmp_path, cora):
    save_graph(cora, tmp_path / "g.pt")
    back = load_graph(tmp_path / "g.pt")
    assert isinstance(back, Graph)
    assert torch.equal(back.edge_index, cora.edge_index) and back.num_classes == 7
    assert torch.equal(back.x, cora.x) and torch.equal(back.y, cora.y)
    assert (back.num_nodes, back.num_features) == (cora.num_nodes, cora.num_features)
    save_graph(back, tmp_path / "again.pt")  # a Graph is written the same way
    again = load_graph(tmp_path / "again.pt")
    assert all(torch.equal(getattr(again, f), getattr(back, f)) for f in ("x", "edge_index", "y"))


def test_unknown_dataset_lists_valid_names():
    with pytest.raises(ConfigError, match=r"unknown dataset 'Coraa'.*'CiteSeer'.*'Cora'"):
        get_dataset("Coraa")


def test_cli_reports_unknown_dataset_with_exit_code_2(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "fglrepro.cli.data", "download", "--dataset", "Nope",
         "--root", str(tmp_path), "--out", str(tmp_path / "x.json")],
        capture_output=True, text=True,
    )
    assert proc.returncode == 2
    assert "unknown dataset 'Nope'" in proc.stderr and "Cora" in proc.stderr


def test_cli_download_from_mirror_writes_record(tmp_path, mirror_copy):
    out = tmp_path / "rec.json"
    subprocess.run(
        [sys.executable, "-m", "fglrepro.cli.data", "download", "--dataset", "CiteSeer",
         "--root", str(tmp_path / "raw"), "--mirror", str(mirror_copy), "--out", str(out)],
        check=True, capture_output=True,
    )
    assert len(json.loads(out.read_text())["files"]) == 8


def test_official_download_with_wrong_checksum_is_rejected(tmp_path, monkeypatch):
    """The network branch: whatever the loader fetched is verified against pinned digests."""
    spec = get_dataset("Cora")

    def fake_loader(spec, root):
        raw = tmp_path / "Cora" / "raw"
        raw.mkdir(parents=True, exist_ok=True)
        for name in spec.raw_files:
            (raw / name).write_bytes(b"tampered")

    monkeypatch.setattr("fglrepro.data.download.load_with_loader", fake_loader)
    with pytest.raises(ChecksumError) as err:
        fetch_raw(spec, tmp_path, mirror=None)
    name = spec.raw_files[0]
    assert f"checksum mismatch for {tmp_path / 'Cora' / 'raw' / name}: " in str(err.value)
    assert f"expected sha256 {pinned_checksums()[name]} (listed in {PINNED_SUMS})" in str(err.value)
    assert not (tmp_path / "Cora" / "raw" / spec.raw_files[0]).exists()
