"""Shared fixtures: the repository, the bundled Cora graph, and small synthetic graphs."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from torch_geometric.data import Data
from torch_geometric.utils import stochastic_blockmodel_graph, to_undirected

REPO = Path(__file__).resolve().parents[1]
MIRROR = REPO / "resources" / "datasets" / "planetoid"

# One thread, as every training job runs (``fgl-train --threads 1``): the tests' small tensors gain
# nothing from more, and on a machine busy with other jobs, threads waiting for a busy core made
# tests/test_fedgm.py take 824 s instead of 11.
torch.set_num_threads(1)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The SLURM tests first (a stable sort, so a module's tests stay together): the longest test
    (minutes) then starts on one worker while the others share the rest, instead of running alone
    at the end of a parallel run (``-n auto`` in pyproject.toml)."""
    items.sort(key=lambda item: item.get_closest_marker("slurm") is None)


@pytest.fixture(scope="session")
def repo() -> Path:
    return REPO


@pytest.fixture(scope="session")
def raw_root(tmp_path_factory) -> Path:
    """Raw root with Cora and CiteSeer placed from the bundled mirror (verified)."""
    from fglrepro.data.download import fetch_raw
    from fglrepro.data.registry import get_dataset

    root = tmp_path_factory.mktemp("raw")
    for name in ("Cora", "CiteSeer"):
        fetch_raw(get_dataset(name), root, MIRROR)
    return root


@pytest.fixture(scope="session")
def cora(raw_root) -> Data:
    from fglrepro.data.prepare import prepare_graph
    from fglrepro.data.registry import get_dataset

    return prepare_graph(get_dataset("Cora"), raw_root, largest_component=False, normalize_features=False)


def make_sbm(num_blocks: int = 4, block_size: int = 30, num_features: int = 8, seed: int = 0) -> Data:
    """A small stochastic-block-model graph whose features weakly encode the block (label)."""
    gen = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    sizes = [block_size] * num_blocks
    probs = torch.full((num_blocks, num_blocks), 0.02)
    probs.fill_diagonal_(0.3)
    edge_index = to_undirected(stochastic_blockmodel_graph(sizes, probs))
    y = torch.arange(num_blocks).repeat_interleave(block_size)
    x = torch.randn(len(y), num_features, generator=gen)
    x[torch.arange(len(y)), y % num_features] += 2.0
    data = Data(x=x, edge_index=edge_index, y=y)
    data.num_classes = num_blocks
    return data


@pytest.fixture
def graph() -> tuple[torch.Tensor, torch.Tensor]:
    """A random 12-node undirected graph: features ``[12, 5]`` and its normalised adjacency."""
    from fglrepro.fl.clients import normalized_adjacency

    gen = torch.Generator().manual_seed(0)
    edges = torch.randint(0, 12, (2, 30), generator=gen)
    edges = torch.cat([edges, edges.flip(0)], dim=1)
    edges = edges[:, edges[0] != edges[1]].unique(dim=1)
    return torch.randn(12, 5, generator=gen), normalized_adjacency(edges, 12)


@pytest.fixture
def sbm() -> Data:
    return make_sbm()


@pytest.fixture
def mirror_copy(tmp_path) -> Path:
    """A writable copy of the bundled Planetoid mirror."""
    target = tmp_path / "mirror"
    shutil.copytree(MIRROR, target)
    return target


@pytest.fixture(scope="module")
def cli_inputs(tmp_path_factory) -> Path:
    """A folder with a prepared SBM graph ``g.pt`` and its 3-client Metis partition ``p.pt``, the
    inputs of ``fgl-train`` runs in the CLI tests."""
    from fglrepro.data.graph import save_graph
    from fglrepro.partition.build import PartitionSpec, build_partition

    root = tmp_path_factory.mktemp("cli")
    data = make_sbm()
    save_graph(data, root / "g.pt")
    build_partition(data, PartitionSpec("metis", "stratified", 0.4, 0.3), 3, seed=0).save(root / "p.pt")
    return root
