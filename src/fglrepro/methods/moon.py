"""MOON (Li et al., CVPR 2021): model-contrastive federated learning on node representations."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fglrepro.fl.aggregation import parameters_of
from fglrepro.fl.clients import ClientData
from fglrepro.fl.losses import model_contrastive_loss
from fglrepro.fl.method import Federation, ParameterAveraging, Upload
from fglrepro.fl.training import Objective, train_epochs
from fglrepro.methods import register


@dataclass(frozen=True)
class MoonHparams:
    """mu: weight of the model-contrastive loss (1: the MOON paper's value for most data
    sets, 5 for CIFAR-10; OpenFGL default ``moon_mu`` 1).
    temperature: tau of the contrastive softmax (0.5 in the MOON paper and OpenFGL)."""

    mu: float = 1.0
    temperature: float = 0.5


@torch.no_grad()
def node_representations(model: nn.Module, client: ClientData) -> Tensor:
    """The model's node representations ``[n, H]`` (input of its last layer), eval mode."""
    model.eval()
    return model(client.x, client.adj, return_hidden=True)[0]


@register("moon")
class Moon(ParameterAveraging):
    """Local loss = CE + mu * l_con(z, z_glob, z_prev) over all nodes of the client graph:
    ``z`` from the model being trained, ``z_glob`` from the model received this round
    (positive), ``z_prev`` from the client's model after its previous local training
    (negative). A client's first participation has no previous model and trains on CE
    alone (equivalently, MOON's loss is constant when positive and negative coincide).
    """

    label = "MOON"
    Hparams = MoonHparams

    def __init__(self, federation: Federation, hparams: MoonHparams) -> None:
        super().__init__(federation, hparams)
        self.has_trained = [False] * len(self.clients)

    def client_update(self, k: int, round_: int) -> Upload:
        client, model = self.clients[k], self.local_models[k]
        negative = node_representations(model, client) if self.has_trained[k] else None
        self.receive(k)
        positive = node_representations(self.global_model, client)
        loss = train_epochs(model, self.optimizers[k], client, self.federation.train.local_epochs,
                            objective=self.objective(positive, negative))
        self.has_trained[k] = True
        return Upload(tensors=parameters_of(model), weight=float(client.num_nodes), loss=loss)

    def objective(self, positive: Tensor, negative: Tensor | None) -> Objective:
        """CE on train nodes plus ``mu`` times the contrastive term; CE and the
        representation ``z`` come from one forward pass (one dropout mask), as in MOON."""
        mu, tau = self.hparams.mu, self.hparams.temperature

        def loss(model: nn.Module, client: ClientData) -> Tensor:
            hidden, logits = model(client.x, client.adj, return_hidden=True)
            value = F.cross_entropy(logits[client.train_mask], client.y[client.train_mask])
            if negative is not None:
                value = value + mu * model_contrastive_loss(hidden, positive, negative, tau)
            return value

        return loss
