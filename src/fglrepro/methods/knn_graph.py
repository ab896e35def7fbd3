"""kNN graphs for graphless clients, then any method (FedGLS's Local-GNNk and Fed-GNNk baselines:
``{method: knn_graph, hparams: {base: local | fedavg, k: ...}}``).

Before the base method is built, every graphless client replaces its graph (the identity) by
the cosine kNN graph of its features, :func:`~fglrepro.components.graph_learning.cosine_knn_adjacency`:
the graph FedGLS's graph learner starts from. Clients with edges keep theirs.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import torch

from fglrepro.components.graph_learning import cosine_knn_adjacency
from fglrepro.config import ConfigError
from fglrepro.fl.method import Capabilities, Federation
from fglrepro.fl.wrapper import MethodWrapper
from fglrepro.methods import register


@dataclass(frozen=True)
class KnnGraphHparams:
    """base, base_hparams: the method run on the mended clients and its hparams.
    k: neighbours per node (top-(k+1) with the node itself; FedGLS: the same k as its learner)."""

    base: str = "fedavg"
    base_hparams: dict = field(default_factory=dict)
    k: int = 20

    def __post_init__(self) -> None:
        if self.k < 1:
            raise ConfigError(f"hparams.k of knn_graph must be >= 1, got {self.k}")


@register("knn_graph")
class KnnGraph(MethodWrapper):
    """The base method on clients whose missing graphs are cosine kNN graphs."""

    label = "+kNN"
    Hparams = KnnGraphHparams

    @classmethod
    def wrap_capabilities(cls, hparams: KnnGraphHparams, base: Capabilities) -> Capabilities:
        """The base's, on the sequential path (the engine batches the clients' original graphs)."""
        return replace(base, vectorised=False)

    @classmethod
    def prepare(cls, federation: Federation, hparams: KnnGraphHparams) -> None:
        """Give every graphless client the kNN graph of its features."""
        for k, client in enumerate(federation.clients):
            if client.graphless:
                with torch.no_grad():
                    federation.clients[k] = replace(client, adj=cosine_knn_adjacency(client.x, hparams.k))
