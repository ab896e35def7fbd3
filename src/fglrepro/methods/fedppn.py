"""FedPPN (Liu et al., 2024, model-heterogeneous federated graph learning with prototype
propagation; code: poipoipoi233/FedPPN, ``FedPPN_trainer`` / ``FedPPN_worker``).

Clients (any architecture with a linear head on one hidden width ``d``) upload the class
means of their training nodes' hidden embeddings; the server averages them per class over
the clients that report the class (plain mean). A client then places the global prototype
of each training node's class on that node (zeros elsewhere), propagates these prototype
"labels" over its graph (label propagation, ``Y' = alpha A Y' + (1 - alpha) Y`` for
``lp_layers`` steps), and classifies the propagated prototypes with its own head. Its loss
adds the cross-entropy of that prototype prediction and of the ensemble
``w z_model + (1 - w) z_prototype`` to the model's cross-entropy (all on training nodes).
Clients are tested on their own model's prediction (the code's reported ``acc``).

With ``train.engine: auto`` the clients train on the grouped path (:mod:`fglrepro.fl.grouped`:
the models of one architecture as one stacked model, each client's head on its propagated
prototypes, one step for all, every participant's prototypes from one evaluation pass).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fglrepro.components.heterogeneous import linear_head, require_common_head
from fglrepro.components.prototypes import average_prototypes, plain_mean_parts, prototype_upload, union_prototypes
from fglrepro.config import ConfigError
from fglrepro.fl.clients import ClientData
from fglrepro.fl.engine import ClientBatch
from fglrepro.fl.grouped import GroupedRole, GroupedUpdates, PerClient
from fglrepro.fl.method import FederatedMethod, Objective, RunSetup, Upload
from fglrepro.fl.training import cross_entropy_loss
from fglrepro.methods import register


@dataclass(frozen=True)
class FedPPNHparams:
    """lp_layers, lp_alpha: propagation steps and ``alpha`` of the prototype propagation
        (code graph configs: ``LP_layer`` 2, ``LP_alpha`` 0.5).
    private_weight: ``w`` of the ensemble of model and prototype logits (code:
        ``weight_private`` 0.5).
    lp_normalize: propagate with ``D^-1/2 A D^-1/2`` (PyG ``LabelPropagation``'s documented
        operator) instead of the plain neighbour sum ``A`` the code applies (its
        ``edge_index`` is a tensor, so no normalisation happens). Neither adds self-loops.
    """

    lp_layers: int = 2
    lp_alpha: float = 0.5
    private_weight: float = 0.5
    lp_normalize: bool = False

    def __post_init__(self) -> None:
        if self.lp_layers < 0:
            raise ConfigError(f"hparams.lp_layers must be >= 0, got {self.lp_layers}")
        for key in ("lp_alpha", "private_weight"):
            if not 0.0 <= getattr(self, key) <= 1.0:
                raise ConfigError(f"hparams.{key} must be in [0, 1], got {getattr(self, key)}")


def propagate_prototypes(labels: Tensor, edge_index: Tensor, layers: int, alpha: float, normalize: bool) -> Tensor:
    """Label propagation of ``labels [n, d]`` over ``edge_index [2, E]`` (no self-loops):
    ``Y_{t+1} = alpha A Y_t + (1 - alpha) Y_0`` for ``layers`` steps, with ``A`` the
    adjacency (message from ``edge_index[0]`` to ``edge_index[1]``) or its symmetric
    normalisation ``D^-1/2 A D^-1/2``."""
    n = labels.size(0)
    source, target = edge_index
    weight = torch.ones(source.numel(), dtype=labels.dtype, device=labels.device)
    if normalize:
        degree = torch.zeros(n, dtype=labels.dtype, device=labels.device).index_add_(0, target, weight)
        inv_sqrt = degree.pow(-0.5).masked_fill_(degree == 0, 0.0)
        weight = inv_sqrt[source] * weight * inv_sqrt[target]
    adjacency = torch.sparse_coo_tensor(torch.stack([target, source]), weight, (n, n)).coalesce()
    out, residual = labels, (1 - alpha) * labels
    for _ in range(layers):
        out = alpha * torch.sparse.mm(adjacency, out) + residual
    return out


def initial_prototype_labels(client: ClientData, prototypes: Tensor, present: Tensor) -> Tensor:
    """``[n, d]``: the global prototype of its class on every training node whose class has
    one, zeros elsewhere (the code's ``initialize_prototype_label``)."""
    labels = prototypes.new_zeros(client.num_nodes, prototypes.size(1))
    nodes = client.train_mask & present[client.y]
    labels[nodes] = prototypes[client.y[nodes]]
    return labels


def ppn_loss(logits: Tensor, prototype_logits: Tensor, labels: Tensor, w: float,
             cross_entropy: Callable[[Tensor, Tensor], Tensor] = F.cross_entropy) -> Tensor:
    """Cross-entropy of the model's ``logits [n, C]``, of the prototype prediction
    ``prototype_logits [n, C]`` and of their ensemble ``w * logits + (1 - w) * prototype_logits``;
    a scalar, or ``[K]`` per client with :meth:`PerClient.cross_entropy` as ``cross_entropy``."""
    ensemble = w * logits + (1 - w) * prototype_logits
    return cross_entropy(logits, labels) + cross_entropy(prototype_logits, labels) + cross_entropy(ensemble, labels)


@register("fedppn")
class FedPPN(GroupedUpdates, FederatedMethod):
    """Prototype upload, plain per-class mean on the server, prototype propagation and the
    three cross-entropies on the client."""

    label = "FedPPN"
    Hparams = FedPPNHparams
    has_global_model = False
    heterogeneous_models = True

    def __init__(self, federation, hparams: FedPPNHparams) -> None:
        super().__init__(federation, hparams)
        for state in self.states:
            linear_head(state.model)
        #: (``[C, d]`` global prototypes, ``[C]`` present) from the last server step
        self.global_prototypes: tuple[Tensor, Tensor] | None = None
        #: grouped path: ``(round, participants, [N, d])`` the participants' propagated prototypes
        self._propagated: tuple[int, tuple[int, ...], Tensor] | None = None
        #: local prototypes computed on the grouped path for this round's uploads
        self._computed: dict[int, tuple[Tensor, Tensor, Tensor]] = {}

    @classmethod
    def check_protocol(cls, hparams, setup: RunSetup) -> None:
        require_common_head(setup.model, "fedppn")

    def propagated_prototypes(self, k: int) -> Tensor:
        """Client ``k``'s propagated prototype labels ``[n, d]`` (constants of the round)."""
        client, hp = self.clients[k], self.hparams
        start = initial_prototype_labels(client, *self.global_prototypes)
        return propagate_prototypes(start, client.edge_index, hp.lp_layers, hp.lp_alpha, hp.lp_normalize)

    def local_objective(self, k: int, round_: int) -> Objective:
        model, client = self.states[k].model, self.clients[k]
        if self.global_prototypes is None:
            return lambda: cross_entropy_loss(model, client)
        propagated = self.propagated_prototypes(k)[client.train_mask]
        mask, labels, w = client.train_mask, client.y[client.train_mask], self.hparams.private_weight

        def loss() -> Tensor:
            logits = model(client.x, client.adj)[mask]
            return ppn_loss(logits, linear_head(model)(propagated), labels, w)

        return loss

    def grouped_roles(self) -> dict[str, list[nn.Module]]:
        return {"model": [s.model for s in self.states]}

    def grouped_loss(self, union: ClientBatch, roles: dict[str, GroupedRole], round_: int) -> Tensor:
        """:meth:`local_objective` of every participant, ``[m]``: the heads of the prototype
        term are each client's own (:meth:`GroupedRole.map` of ``readout``)."""
        mask = union.train_mask
        labels, clients = union.y[mask], PerClient(union.batch[mask], union.num_clients)
        model = roles["model"]
        logits = model.forward()[1][mask]
        if self.global_prototypes is None:
            return clients.cross_entropy(logits, labels)
        key = (round_, tuple(union.clients))
        if self._propagated is None or self._propagated[:2] != key:
            self._propagated = (*key, torch.cat([self.propagated_prototypes(k) for k in union.clients]))
        prototype_logits = model.map(self._propagated[2], "readout.")[mask]
        return ppn_loss(logits, prototype_logits, labels, self.hparams.private_weight, clients.cross_entropy)

    def grouped_trained(self, ks: list[int], union: ClientBatch, roles: dict[str, GroupedRole], round_: int) -> None:
        """Every participant's local prototypes from one evaluation pass per architecture."""
        self._computed = union_prototypes(roles["model"].predict(ks)[0], union, self.clients[0].num_classes)

    def upload(self, k: int, round_: int, loss: float) -> Upload:
        """Local prototypes of the classes with training nodes (evaluation mode), no parameters."""
        return prototype_upload(self.states[k].model, self.clients[k], loss, self._computed.pop(k, None))

    def server_update(self, round_: int, uploads: dict[int, Upload]) -> None:
        """Plain per-class mean of the uploaded prototypes (the code's ``_proto_aggregation``)."""
        client, messages = self.clients[0], [u.extras for u in uploads.values()]
        width = messages[0]["prototypes"].size(1)
        prototypes, present = average_prototypes(plain_mean_parts(messages), client.num_classes, width)
        self.global_prototypes = prototypes.to(client.x.device), present.to(client.x.device)

    def download_bytes(self, k: int) -> int:
        prototypes, present = self.global_prototypes
        return int(present.sum()) * prototypes.size(1) * prototypes.element_size()
