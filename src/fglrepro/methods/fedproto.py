"""FedProto (Tan et al., AAAI 2022): federated prototype learning across heterogeneous clients.

Clients exchange class prototypes, never parameters. A client's prototype of class c is the
mean ``hidden`` embedding (the zoo's embedding before the readout) of its training nodes of
class c; the server averages each class's prototypes with weights = the clients' numbers of
training nodes of that class, and every client then trains on

    L = CE(logits, y) + lambda * MSE(h_i, p_{y_i})

over its training nodes, ``p_c`` the global prototype of class c (nodes of a class without a
global prototype add 0 to the mean squared error, as in the authors' code; the first round has
no prototypes and trains on CE alone). Any zoo models with ``readout: true`` and one ``hidden``
width may be mixed (``model.clients``, ``model.graphless``); each client is tested on its own
model by its logits.

Choices the paper leaves open: a client computes its prototypes after its local training with
the model in evaluation mode (the authors' code collects the embeddings of its training batches).

With ``train.engine: auto`` the clients train on the grouped path (:mod:`fglrepro.fl.grouped`:
the models of one architecture as one stacked model, one step for all, the prototypes of every
participant from one evaluation pass).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch.nn.functional as F
from torch import Tensor, nn

from fglrepro.components.prototypes import average_prototypes, client_prototypes, union_prototypes
from fglrepro.config import ConfigError
from fglrepro.fl.communication import tensor_bytes
from fglrepro.fl.engine import ClientBatch
from fglrepro.fl.grouped import GroupedRole, GroupedUpdates, PerClient
from fglrepro.fl.method import FederatedMethod, Federation, Objective, RunSetup, Upload
from fglrepro.methods import register


@dataclass(frozen=True)
class FedProtoHparams:
    """lam: weight lambda of the prototype term (FedProto paper and OpenFGL: 1; FedGLS: 1)."""

    lam: float = 1.0


@register("fedproto")
class FedProto(GroupedUpdates, FederatedMethod):
    """Prototype exchange; see the module docstring."""

    label = "FedProto"
    Hparams = FedProtoHparams
    has_global_model = False
    heterogeneous_models = True

    @classmethod
    def check_protocol(cls, hparams: FedProtoHparams, setup: RunSetup) -> None:
        configs = setup.model.variants()
        without = sorted({c.arch for c in configs if not c.readout})
        if without:
            raise ConfigError(f"fedproto needs model.readout: true on every client (its prototypes are the "
                              f"embedding before the readout); clients with arch {without} have none")
        widths = sorted({c.hidden for c in configs})
        if len(widths) > 1:
            raise ConfigError(f"fedproto needs one embedding width on every client; model.hidden takes {widths}")

    def __init__(self, federation: Federation, hparams: FedProtoHparams) -> None:
        super().__init__(federation, hparams)
        models = [state.model for state in self.states]
        if any(getattr(model, "readout", None) is None for model in models):
            names = sorted({type(m).__name__ for m in models if getattr(m, "readout", None) is None})
            raise ConfigError(f"fedproto needs models with a readout; {names} have none")
        self.num_classes = self.clients[0].num_classes
        self.dim = models[0].readout.in_features
        #: the server's prototypes ``[C, d]`` and which classes have one ``[C]`` (none yet)
        self.prototypes: Tensor | None = None
        self.present: Tensor | None = None
        #: local prototypes computed on the grouped path for this round's uploads
        self._computed: dict[int, tuple[Tensor, Tensor, Tensor]] = {}

    def local_objective(self, k: int, round_: int) -> Objective:
        """``CE + lam * MSE(h, p_y)`` on the client's training nodes (CE alone in the first round)."""
        model, client, lam = self.states[k].model, self.clients[k], self.hparams.lam
        mask = client.train_mask
        labels = client.y[mask]
        targets = weights = None
        if self.prototypes is not None:
            targets = self.prototypes.to(client.x.device)[labels]
            weights = self.present.to(client.x.device)[labels].to(targets.dtype).unsqueeze(1)

        def loss() -> Tensor:
            hidden, logits = model(client.x, client.adj, return_hidden=True)
            value = F.cross_entropy(logits[mask], labels)
            if targets is not None:
                value = value + lam * (weights * (hidden[mask] - targets).pow(2)).mean()
            return value

        return loss

    def grouped_roles(self) -> dict[str, list[nn.Module]]:
        return {"model": [s.model for s in self.states]}

    def grouped_loss(self, union: ClientBatch, roles: dict[str, GroupedRole], round_: int) -> Tensor:
        """:meth:`local_objective` of every participant, ``[m]``."""
        mask = union.train_mask
        hidden, logits = (t[mask] for t in roles["model"].forward())
        labels, clients = union.y[mask], PerClient(union.batch[mask], union.num_clients)
        loss = clients.cross_entropy(logits, labels)
        if self.prototypes is None:
            return loss
        targets = self.prototypes.to(hidden.device)[labels]
        weights = self.present.to(hidden.device)[labels].to(targets.dtype).unsqueeze(1)
        return loss + self.hparams.lam * clients.mean((weights * (hidden - targets).pow(2)).sum(1)) / hidden.size(1)

    def grouped_trained(self, ks: list[int], union: ClientBatch, roles: dict[str, GroupedRole], round_: int) -> None:
        """Every participant's local prototypes from one evaluation pass per architecture."""
        self._computed = union_prototypes(roles["model"].predict(ks)[0], union, self.num_classes)

    def upload(self, k: int, round_: int, loss: float) -> Upload:
        """The client's prototypes of the classes among its training nodes, with their node counts."""
        computed = self._computed.pop(k, None)
        if computed is None:
            computed = client_prototypes(self.states[k].model, self.clients[k])
        classes, prototypes, counts = computed
        return Upload(params={}, extras={"classes": classes, "prototypes": prototypes, "counts": counts},
                      weight=float(self.clients[k].num_nodes), loss=loss)

    def server_update(self, round_: int, uploads: dict[int, Upload]) -> None:
        parts = [(u.extras["classes"], u.extras["prototypes"], u.extras["counts"]) for u in uploads.values()]
        if parts:
            self.prototypes, self.present = average_prototypes(parts, self.num_classes, self.dim)

    def download_bytes(self, k: int) -> int:
        """The global prototypes of the classes that have one."""
        return 0 if self.prototypes is None else tensor_bytes([self.prototypes[self.present]])
