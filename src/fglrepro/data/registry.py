"""The datasets the pipeline knows, and how the PyG / OGB loader reads each one.

Each entry names the loader, the folder the loader expects its raw files in
(relative to the raw root), the raw file names, and a size class that the workflow
uses to scale job resources.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from unittest import mock

from fglrepro.config import ConfigError, choice

SIZES = ("small", "medium", "large")

# Loader key -> class in ``torch_geometric.datasets``; "ogbn" is OGB's PygNodePropPredDataset.
PYG_LOADERS = {
    "planetoid": "Planetoid",
    "amazon": "Amazon",
    "coauthor": "Coauthor",
    "flickr": "Flickr",
    "reddit": "Reddit",
    "reddit2": "Reddit2",
    "actor": "Actor",
    "linkx": "LINKXDataset",
}
LOADERS = (*PYG_LOADERS, "ogbn")


@dataclass(frozen=True)
class DatasetSpec:
    """How to obtain one dataset through its official loader.

    Attributes:
        name: canonical name used in configs and paths.
        loader: one of ``LOADERS``: a key of ``PYG_LOADERS`` or ``"ogbn"``
            (``ogb.nodeproppred.PygNodePropPredDataset``).
        loader_name: name argument passed to the loader; ``None`` for a loader of a
            single dataset, which then gets ``<raw root>/<name>`` as its root.
        raw_subdir: the loader's raw directory, relative to the raw root.
        raw_files: file names the loader reads from ``raw_subdir``.
        size: ``small`` / ``medium`` / ``large``, used for job resources.
        num_nodes: node count of the graph as the official loader returns it (the PyG / OGB
            dataset statistics), before preprocessing; studies are checked against it
            (no more clients than nodes).
    """

    name: str
    loader: str
    loader_name: str | None
    raw_subdir: str
    raw_files: tuple[str, ...]
    size: str
    num_nodes: int | None = None

    def __post_init__(self) -> None:
        choice(self.loader, LOADERS, f"loader of dataset {self.name!r}")
        choice(self.size, SIZES, f"size of dataset {self.name!r}")

    @property
    def mirror_subdir(self) -> str:
        """The folder of a mirror root that holds this dataset's raw files: the loader key
        (``planetoid/``, ``amazon/``, ``coauthor/``, ``actor/``, ... as in ``../shared/datasets``), and
        for OGB, whose datasets share file names, ``ogbn/<name>``."""
        return f"ogbn/{self.name}" if self.loader == "ogbn" else self.loader


def _named(name: str, loader: str, raw_files: tuple[str, ...], size: str, num_nodes: int) -> DatasetSpec:
    """A loader that takes the dataset's name and keeps its raw files in ``<name>/raw``."""
    return DatasetSpec(name, loader, name, f"{name}/raw", raw_files, size, num_nodes)


def _single(name: str, loader: str, raw_files: tuple[str, ...], size: str, num_nodes: int) -> DatasetSpec:
    """A loader of one dataset, given root ``<name>``, keeps its raw files in ``<name>/raw``."""
    return DatasetSpec(name, loader, None, f"{name}/raw", raw_files, size, num_nodes)


def _ogbn(name: str, additional_node_files: tuple[str, ...], size: str, num_nodes: int) -> DatasetSpec:
    """OGB node-property dataset: gzipped CSVs in ``ogbn_<x>/raw`` (OGB's own folder name)."""
    stems = ("edge", "node-feat", "node-label", "num-node-list", "num-edge-list")
    return DatasetSpec(
        name, "ogbn", name, f"{name.replace('-', '_')}/raw",
        tuple(f"{stem}.csv.gz" for stem in stems + additional_node_files), size, num_nodes,
    )


def _planetoid_files(name: str) -> tuple[str, ...]:
    suffixes = ("x", "tx", "allx", "y", "ty", "ally", "graph", "test.index")
    return tuple(f"ind.{name.lower()}.{s}" for s in suffixes)


_GRAPHSAINT_FILES = ("adj_full.npz", "feats.npy", "class_map.json", "role.json")
_ACTOR_FILES = ("out1_node_feature_label.txt", "out1_graph_edges.txt") + tuple(
    f"film_split_0.6_0.2_{i}.npz" for i in range(10)
)

DATASETS: dict[str, DatasetSpec] = {
    spec.name: spec
    for spec in (
        # node counts: the STATS tables of the PyG dataset docs, OGB's dataset pages, and the
        # LINKX paper (Lim et al. 2021, Table 1) for genius
        _named("Cora", "planetoid", _planetoid_files("Cora"), "small", 2708),
        _named("CiteSeer", "planetoid", _planetoid_files("CiteSeer"), "small", 3327),
        _named("PubMed", "planetoid", _planetoid_files("PubMed"), "small", 19717),
        _named("Photo", "amazon", ("amazon_electronics_photo.npz",), "small", 7650),
        _named("Computers", "amazon", ("amazon_electronics_computers.npz",), "small", 13752),
        _named("CS", "coauthor", ("ms_academic_cs.npz",), "medium", 18333),
        _named("Physics", "coauthor", ("ms_academic_phy.npz",), "medium", 34493),
        _ogbn("ogbn-arxiv", ("node_year",), "medium", 169343),
        _ogbn("ogbn-products", (), "large", 2449029),
        _single("Flickr", "flickr", _GRAPHSAINT_FILES, "medium", 89250),
        _single("Reddit", "reddit", ("reddit_data.npz", "reddit_graph.npz"), "large", 232965),
        _single("Reddit2", "reddit2", _GRAPHSAINT_FILES, "large", 232965),
        _single("Actor", "actor", _ACTOR_FILES, "small", 7600),
        _named("genius", "linkx", ("data.mat",), "medium", 421961),
    )
}


def get_dataset(name: str) -> DatasetSpec:
    """Look up a dataset by name; an unknown name lists the valid ones."""
    if name not in DATASETS:
        raise ConfigError(f"unknown dataset {name!r}; valid datasets: {sorted(DATASETS)}")
    return DATASETS[name]


def load_with_loader(spec: DatasetSpec, raw_root: str):
    """Instantiate the official loader on ``raw_root`` (downloads if raw files are missing).

    The loader reads its raw files from ``<raw_root>/<spec.raw_subdir>``. Returns the
    loader's dataset object; ``dataset[0]`` is the graph.
    """
    if spec.loader == "ogbn":
        return _load_ogbn(spec, raw_root)
    import torch_geometric.datasets as pyg_datasets

    loader_cls = getattr(pyg_datasets, PYG_LOADERS[spec.loader])
    if spec.loader_name is None:
        return loader_cls(root=str((Path(raw_root) / spec.raw_subdir).parent))
    return loader_cls(root=raw_root, name=spec.loader_name)


def _load_ogbn(spec: DatasetSpec, raw_root: str):
    """Run OGB's loader without its two stdin prompts (jobs have no stdin).

    OGB asks before using a folder that lacks its release marker and before a
    download over 1 GB (ogbn-products); the folder is marked as the installed
    release and the download, which the pipeline asked for, is confirmed. OGB reads
    its processed cache with ``torch.load``'s default ``weights_only=True``, which
    needs PyG's storage classes allowlisted.
    """
    import ogb.nodeproppred.dataset_pyg as ogb_pyg
    import torch
    from torch_geometric.data.data import DataEdgeAttr, DataTensorAttr
    from torch_geometric.data.storage import GlobalStorage

    _mark_ogb_release(spec, raw_root)
    pyg_classes = [DataEdgeAttr, DataTensorAttr, GlobalStorage]
    with (
        mock.patch.object(ogb_pyg, "decide_download", return_value=True),
        torch.serialization.safe_globals(pyg_classes),
    ):
        return ogb_pyg.PygNodePropPredDataset(name=spec.loader_name, root=raw_root)


def _mark_ogb_release(spec: DatasetSpec, raw_root: str) -> None:
    """Create ``RELEASE_v<version>.txt`` (version from OGB's master table) in the dataset folder.

    A marker of another release means the files are from an OGB release the installed
    ``ogb`` does not read; that is an error naming the folder to delete.
    """
    import ogb.nodeproppred
    import pandas as pd

    master_csv = Path(ogb.nodeproppred.__file__).with_name("master.csv")
    master = pd.read_csv(master_csv, index_col=0, keep_default_na=False)
    dataset_dir = (Path(raw_root) / spec.raw_subdir).parent
    marker = dataset_dir / f"RELEASE_v{master[spec.loader_name]['version']}.txt"
    stale = sorted(p.name for p in dataset_dir.glob("RELEASE_v*.txt") if p != marker)
    if stale:
        raise ConfigError(
            f"{dataset_dir} holds OGB release {stale}, but the installed ogb reads "
            f"{marker.name}; delete {dataset_dir} so that the current release is fetched"
        )
    dataset_dir.mkdir(parents=True, exist_ok=True)
    marker.touch()
