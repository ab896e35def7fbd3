"""The datasets the pipeline knows, and how the PyG / OGB loader reads each one.

Each entry names the loader class, the folder the loader expects its raw files in
(relative to the raw root), the raw file names, and a size class that the workflow
uses to scale job resources.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from fglrepro.config import ConfigError


@dataclass(frozen=True)
class DatasetSpec:
    """How to obtain one dataset through its official loader.

    Attributes:
        name: canonical name used in configs and paths.
        loader: ``"planetoid"`` (``torch_geometric.datasets.Planetoid``).
        loader_name: name argument passed to the loader.
        raw_files: file names in the loader's raw directory.
        size: ``small`` / ``medium`` / ``large``, used for job resources.
    """

    name: str
    loader: str
    loader_name: str
    raw_files: tuple[str, ...] = field(default_factory=tuple)
    size: str = "small"

    @property
    def raw_subdir(self) -> str:
        """Raw directory relative to the raw root, as the loader lays it out."""
        return f"{self.name}/raw"


def _planetoid(name: str, size: str) -> DatasetSpec:
    key = name.lower()
    suffixes = ("x", "tx", "allx", "y", "ty", "ally", "graph", "test.index")
    return DatasetSpec(
        name=name,
        loader="planetoid",
        loader_name=name,
        raw_files=tuple(f"ind.{key}.{s}" for s in suffixes),
        size=size,
    )


DATASETS: dict[str, DatasetSpec] = {
    spec.name: spec
    for spec in (
        _planetoid("Cora", "small"),
        _planetoid("CiteSeer", "small"),
        _planetoid("PubMed", "small"),
    )
}


def get_dataset(name: str) -> DatasetSpec:
    """Look up a dataset by name; an unknown name lists the valid ones."""
    if name not in DATASETS:
        raise ConfigError(f"unknown dataset {name!r}; valid datasets: {sorted(DATASETS)}")
    return DATASETS[name]


def load_with_loader(spec: DatasetSpec, raw_root: str):
    """Instantiate the official loader on ``raw_root`` (downloads if raw files are missing).

    Returns the loader's dataset object; ``dataset[0]`` is the graph.
    """
    if spec.loader == "planetoid":
        from torch_geometric.datasets import Planetoid

        return Planetoid(root=raw_root, name=spec.loader_name)
    raise ConfigError(f"dataset {spec.name!r} has unsupported loader {spec.loader!r}")
