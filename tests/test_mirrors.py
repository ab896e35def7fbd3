"""Raw files from mirror roots laid out as ``../shared/datasets`` (one folder per loader).

The datasets beyond Planetoid (Amazon Photo / Computers, Coauthor CS / Physics, Actor) go through
the workflow's download and prepare steps from ``../shared/datasets`` and come out with PyG's
statistics; these tests skip when that folder is absent (a clone outside this workplace).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from torch_geometric.utils import remove_self_loops, to_undirected

from fglrepro.cli import data as data_cli
from fglrepro.config import ConfigError
from fglrepro.data.download import PINNED_SUMS, fetch_raw, mirror_arguments, pinned_checksums
from fglrepro.data.graph import load_graph
from fglrepro.data.registry import get_dataset, load_with_loader

REPO = Path(__file__).resolve().parents[1]
MIRROR = REPO / "resources" / "datasets" / "planetoid"
SHARED = REPO.parent / "shared" / "datasets"
BUNDLED = REPO / "resources" / "datasets"
needs_shared = pytest.mark.skipif(
    not SHARED.is_dir(), reason=f"no mirror of the raw files of Photo, Computers, CS, Physics and Actor at {SHARED}")

# PyG statistics of the official loaders (../shared/datasets/README.md): nodes, edges, features, classes.
PYG_STATS = {
    "Photo": (7650, 238162, 745, 8),
    "Computers": (13752, 491722, 767, 10),
    "CS": (18333, 163788, 6805, 15),
    "Physics": (34493, 495924, 8415, 5),
    "Actor": (7600, 30019, 932, 5),
}
# Download + prepare take 15 s (CS) and 45 s (Physics) of one core; the others 1-3 s.
MIRRORED = [pytest.param(name, marks=[pytest.mark.e2e] if name in ("CS", "Physics") else [])
            for name in PYG_STATS]


def cli(*argv: str) -> None:
    """``fgl-data`` as the workflow's rules call it (same entry point, in this process)."""
    data_cli.main([str(arg) for arg in argv])


@needs_shared
@pytest.mark.parametrize("name", MIRRORED)
def test_mirrored_dataset_goes_through_download_and_prepare_with_pyg_statistics(tmp_path, name):
    spec = get_dataset(name)
    raw, record = tmp_path / "raw", tmp_path / "download.json"
    cli("download", "--dataset", name, "--root", raw, "--mirror", BUNDLED, "--mirror", SHARED, "--out", record)
    written = json.loads(record.read_text())
    assert written["source"] == f"mirror:{SHARED / spec.mirror_subdir}" and written["pinned"]
    assert written["files"] == {f: pinned_checksums()[f] for f in spec.raw_files}
    cli("prepare", "--dataset", name, "--root", raw, "--record", record, "--out", tmp_path / "plain.pt")

    nodes, edges, features, classes = PYG_STATS[name]
    loaded = load_with_loader(spec, str(raw))[0]  # the processed cache the download step built
    assert (loaded.num_nodes, loaded.num_edges, loaded.num_features) == (nodes, edges, features)
    graph = load_graph(tmp_path / "plain.pt")
    assert (graph.num_nodes, graph.num_features, graph.num_classes) == (nodes, features, classes)
    assert torch.equal(graph.x, loaded.x) and torch.equal(graph.y, loaded.y)
    # The prepared graph is the loader's, undirected and without self-loops: the same edges for
    # the symmetric Amazon / Coauthor graphs, Actor's 30,019 directed edges symmetrised.
    expected = to_undirected(remove_self_loops(loaded.edge_index)[0], num_nodes=nodes)
    assert torch.equal(graph.edge_index, expected)
    assert graph.edge_index.size(1) == edges if name != "Actor" else graph.edge_index.size(1) > edges


@needs_shared
@pytest.mark.e2e
def test_the_workflow_takes_each_dataset_from_its_loaders_folder_of_a_mirror_root(repo, tmp_path):
    """A real Snakemake run of the download and prepare rules, with the config key ``mirror`` a list of roots."""
    from test_workflow import TINY_STUDY, make_workdir

    work = make_workdir(repo, tmp_path, {**TINY_STUDY, "datasets": ["Cora", "Photo", "Actor"]})
    config = {"studies": ["tiny"], "mirror": [str(BUNDLED), str(SHARED)]}
    (work / "config" / "config.yaml").write_text(yaml.safe_dump(config))
    targets = [f"data/prepared/{name}/plain.pt" for name in ("Cora", "Photo", "Actor")]
    proc = subprocess.run([sys.executable, "-m", "snakemake", "--cores", "2", *targets], cwd=work,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    sources = {name: json.loads((work / "data" / "raw" / name / "download.json").read_text())["source"]
               for name in ("Cora", "Photo", "Actor")}
    assert sources == {"Cora": f"mirror:{BUNDLED / 'planetoid'}", "Photo": f"mirror:{SHARED / 'amazon'}",
                       "Actor": f"mirror:{SHARED / 'actor'}"}
    assert load_graph(work / targets[1]).num_nodes == PYG_STATS["Photo"][0]


def test_a_root_above_the_bundled_folder_gives_the_download_rule_the_same_arguments():
    """Moving the config key from the folder to its root (or a list of roots) reruns no download."""
    for name in ("Cora", "CiteSeer"):
        spec = get_dataset(name)
        old = mirror_arguments(spec, str(MIRROR))
        assert old == ["--mirror", str(MIRROR)]
        assert mirror_arguments(spec, [str(BUNDLED), str(SHARED)]) == old
        assert mirror_arguments(spec, str(BUNDLED)) == old


def test_without_a_complete_folder_the_download_rule_passes_every_root(tmp_path):
    roots = [str(BUNDLED), str(tmp_path / "elsewhere")]
    assert mirror_arguments(get_dataset("PubMed"), roots) == ["--mirror", roots[0], "--mirror", roots[1]]
    assert mirror_arguments(get_dataset("PubMed"), None) == []


def test_the_first_root_holding_all_files_wins(tmp_path):
    spec = get_dataset("Cora")
    for root in ("a", "b"):
        shutil.copytree(MIRROR, tmp_path / root / "planetoid")
    record = fetch_raw(spec, tmp_path / "raw", [tmp_path / "missing", tmp_path / "a", tmp_path / "b"])
    assert record["source"] == f"mirror:{tmp_path / 'a' / 'planetoid'}"


def test_offline_error_names_each_folders_missing_files_and_the_key(tmp_path, monkeypatch):
    """A mirror with 7 of PubMed's 8 files (ind.pubmed.allx is missing) and no network."""
    spec = get_dataset("PubMed")
    partial = tmp_path / "root" / "planetoid"
    partial.mkdir(parents=True)
    for name in spec.raw_files[:2] + spec.raw_files[3:]:
        (partial / name).write_bytes(b"x")

    def no_network(spec, root):
        raise ConnectionRefusedError(111, "Connection refused")

    monkeypatch.setattr("fglrepro.data.download.load_with_loader", no_network)
    with pytest.raises(ConfigError) as err:
        fetch_raw(spec, tmp_path / "raw", [tmp_path / "root", tmp_path / "nowhere"])
    message = str(err.value)
    assert f"{partial}: missing ['ind.pubmed.allx']" in message
    assert f"{tmp_path / 'nowhere' / 'planetoid'}: no such folder" in message
    assert "set mirror: <root>" in message and "<root>/planetoid/" in message
    assert not (tmp_path / "raw" / spec.raw_subdir / "ind.pubmed.x").exists()  # nothing copied


def test_pinned_digests_cover_every_mirrored_dataset():
    """The package pins the official digests of every raw file the shared mirror layout names, so a
    network download of them gets the same check; file names are unique across datasets."""
    pinned = pinned_checksums()
    for name in ("Cora", "CiteSeer", *PYG_STATS):
        assert set(get_dataset(name).raw_files) <= set(pinned), name
    assert len(PINNED_SUMS.read_text().splitlines()) == len(pinned) == 32


@pytest.mark.parametrize("name", ["Photo", "Physics", "Actor"])
def test_a_network_download_is_checked_against_the_same_pinned_digests(tmp_path, monkeypatch, name):
    """Without a mirror PyG's loader downloads; bytes other than the official files are refused and removed."""
    from fglrepro.data.checksums import ChecksumError

    spec = get_dataset(name)
    raw = tmp_path / spec.raw_subdir

    def pyg_download(spec, root):
        raw.mkdir(parents=True, exist_ok=True)
        for file in spec.raw_files:
            (raw / file).write_bytes(b"not the official file")

    monkeypatch.setattr("fglrepro.data.download.load_with_loader", pyg_download)
    with pytest.raises(ChecksumError, match=rf"checksum mismatch for {raw / spec.raw_files[0]}: expected sha256 "
                                            rf"{pinned_checksums()[spec.raw_files[0]]} \(listed in {PINNED_SUMS}\)"):
        fetch_raw(spec, tmp_path, None)
    assert not (raw / spec.raw_files[0]).exists()


@needs_shared
def test_shared_mirror_sums_agree_with_the_pinned_digests():
    from fglrepro.data.checksums import read_sums

    pinned = pinned_checksums()
    for name in ("Cora", "CiteSeer", *PYG_STATS):
        folder = SHARED / get_dataset(name).mirror_subdir
        listed = read_sums(folder / "SHA256SUMS")
        files = get_dataset(name).raw_files
        assert {f: listed[f] for f in files} == {f: pinned[f] for f in files}


@needs_shared
@pytest.mark.parametrize("name", ["Photo", "Computers"])
def test_largest_component_has_the_graph_statistics_fedgkd_and_fedgkc_print(tmp_path, name):
    """FedGKD Table 2 and FedGKC Table 6 (config/paper/, as printed) give the Amazon graphs' largest
    connected component: its nodes, and its edges (FedGKD both directions, FedGKC each edge once)."""
    import pandas as pd

    from fglrepro.data.prepare import prepare_graph

    spec = get_dataset(name)
    fetch_raw(spec, tmp_path, SHARED)
    data = prepare_graph(spec, tmp_path, largest_component=True, normalize_features=False)
    printed = pd.concat([pd.read_csv(REPO / "config" / "paper" / f)
                         for f in ("fedgkd_table2.csv", "fedgkc_table6.csv")])
    value = printed[printed["dataset"] == name].set_index(["paper", "stat"])["value"]
    assert data.num_nodes == value["FedGKD", "nodes"] == value["FedGKC", "nodes"]
    assert data.edge_index.size(1) == value["FedGKD", "edges"] == 2 * value["FedGKC", "edges_printed"]
    assert data.num_features == value["FedGKD", "features"] == value["FedGKC", "features"]


def test_study_files_name_the_mirrored_datasets_as_the_registry_does(repo):
    """Each study's datasets are registry names; the mirrored ones are used under exactly those names."""
    from fglrepro.data.registry import DATASETS

    named = set()
    for path in sorted((repo / "config" / "studies").glob("*.yaml")):
        datasets = yaml.safe_load(path.read_text())["datasets"]
        assert set(datasets) <= set(DATASETS), (path.name, sorted(set(datasets) - set(DATASETS)))
        named |= set(datasets)
    assert set(PYG_STATS) <= named
    assert {get_dataset(n).mirror_subdir for n in PYG_STATS} == {"amazon", "coauthor", "actor"}
