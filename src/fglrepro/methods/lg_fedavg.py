"""LG-FedAvg (Liang et al., 2020, "Think Locally, Act Globally"), as FedGKC runs it on
heterogeneous client models: every client keeps its own encoder and all clients share one
linear classifier (FedGKC 5.1.2: "we set up the same classifier for all clients"), whose
parameters alone are averaged (HtFLlib ``serverlg``: weights n_k / N over the uploads).

With ``train.engine: auto`` the clients train on the grouped path (:mod:`fglrepro.fl.grouped`:
the models of one architecture as one stacked model, one step for all).
"""

from __future__ import annotations

import copy

from torch import Tensor, nn

from fglrepro.components.heterogeneous import linear_head, require_common_head
from fglrepro.config import ConfigError
from fglrepro.fl.aggregation import load_parameters, parameters_of, weighted_average
from fglrepro.fl.communication import module_bytes
from fglrepro.fl.engine import ClientBatch
from fglrepro.fl.grouped import GroupedRole, GroupedUpdates, PerClient
from fglrepro.fl.method import FederatedMethod, Federation, RunSetup, Upload
from fglrepro.methods import register


@register("lg_fedavg")
class LGFedAvg(GroupedUpdates, FederatedMethod):
    """Clients load the global head, train their whole model on cross-entropy, and upload
    the head (``readout.weight [C, d]``, ``readout.bias [C]``); the server averages the heads
    with weights n_k. The global head starts as client 0's initial head, so all clients
    start from one classifier. Clients are tested on their own models."""

    label = "LG-FedAvg"
    has_global_model = False
    heterogeneous_models = True

    def __init__(self, federation: Federation, hparams) -> None:
        super().__init__(federation, hparams)
        heads = [linear_head(state.model) for state in self.states]
        shapes = sorted({tuple(h.weight.shape) for h in heads})
        if len(shapes) > 1:
            raise ConfigError(f"LG-FedAvg needs one head shape [C, d] on every client (one model.hidden); got {shapes}")
        self.global_head = copy.deepcopy(heads[0])

    @classmethod
    def check_protocol(cls, hparams, setup: RunSetup) -> None:
        require_common_head(setup.model, "lg_fedavg")

    def receive(self, k: int, round_: int) -> None:
        load_parameters(linear_head(self.states[k].model), dict(self.global_head.named_parameters()))

    def grouped_roles(self) -> dict[str, list[nn.Module]]:
        return {"model": [s.model for s in self.states]}

    def grouped_loss(self, union: ClientBatch, roles: dict[str, GroupedRole], round_: int) -> Tensor:
        """Each participant's cross-entropy on its training nodes, ``[m]``."""
        mask = union.train_mask
        return PerClient(union.batch[mask], union.num_clients).cross_entropy(roles["model"].forward()[1][mask],
                                                                             union.y[mask])

    def upload(self, k: int, round_: int, loss: float) -> Upload:
        """The head's parameters, named as in the client model (``readout.*``)."""
        head = parameters_of(linear_head(self.states[k].model))
        return Upload(params={f"readout.{name}": p for name, p in head.items()},
                      weight=float(self.clients[k].num_nodes), loss=loss)

    def server_update(self, round_: int, uploads: dict[int, Upload]) -> None:
        ups = list(uploads.values())
        average = weighted_average([u.params for u in ups], [u.weight for u in ups])
        load_parameters(self.global_head, {name.removeprefix("readout."): p for name, p in average.items()})

    def download_bytes(self, k: int) -> int:
        return module_bytes(self.global_head)
