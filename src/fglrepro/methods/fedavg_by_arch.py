"""FedAvg within each group of clients that share an architecture: FedGLS's Fed-GNNMLP baseline
(with ``model.graphless: {arch: mlp}`` the clients with edges average a GCN and the graphless
clients an MLP, two separate federations in one run)."""

from __future__ import annotations

import copy

from torch import nn

from fglrepro.fl.aggregation import load_parameters, weighted_average
from fglrepro.fl.method import FederatedMethod, Federation, Upload
from fglrepro.methods import register


def architecture(model: nn.Module) -> tuple:
    """What two models must share to be averaged: their class and each parameter's name and shape."""
    return type(model).__name__, tuple((name, tuple(p.shape)) for name, p in model.named_parameters())


@register("fedavg_by_arch")
class FedAvgByArch(FederatedMethod):
    """One global model per architecture, FedAvg (weights n_k) over the clients that have it;
    each client receives its group's model (with one architecture: FedAvg)."""

    label = "FedAvg per architecture"
    has_server_models = True
    heterogeneous_models = True

    def __init__(self, federation: Federation, hparams) -> None:
        super().__init__(federation, hparams)
        #: client positions per architecture, in client order
        self.groups: dict[tuple, list[int]] = {}
        for k, state in enumerate(self.states):
            self.groups.setdefault(architecture(state.model), []).append(k)
        #: each group's global model, starting as its first client's initial model
        self.global_models = {key: copy.deepcopy(self.states[ks[0]].model) for key, ks in self.groups.items()}
        for key, ks in self.groups.items():
            for k in ks:
                self.states[k].received = self.global_models[key]

    def receive(self, k: int, round_: int) -> None:
        """Load the group's global model into the client's model."""
        load_parameters(self.states[k].model, dict(self.states[k].received.named_parameters()))

    def server_update(self, round_: int, uploads: dict[int, Upload]) -> None:
        for key, ks in self.groups.items():
            members = [uploads[k] for k in ks if k in uploads]
            if members:
                load_parameters(self.global_models[key],
                                weighted_average([u.params for u in members], [u.weight for u in members]))

    def server_models(self) -> list[nn.Module]:
        return list(self.global_models.values())
