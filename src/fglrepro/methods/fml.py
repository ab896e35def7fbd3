"""FML (Shen et al., 2020, "Federated Mutual Learning") on heterogeneous client models.

Every client trains its private model (any architecture) together with a copy of a shared
"meme" model; the two teach each other by KL divergence, and only the meme model is
averaged (FedAvg, weights n_k / N). As in FedPPN's graph version (poipoipoi233/FedPPN
``FML_node_trainer``): on the training nodes,

    L_private = alpha CE(y, p_private) + (1 - alpha) KL(p_meme || p_private),
    L_meme    = beta  CE(y, p_meme)    + (1 - beta)  KL(p_private || p_meme),

teachers detached, KL averaged over nodes; both models take one step on their own loss.

With ``train.engine: auto`` the clients train on the grouped path
(:mod:`fglrepro.fl.grouped`): the private models of one architecture as one stacked model,
the meme models of all clients as another, one step for all; :func:`mutual_losses` is the
loss of both paths (reduced per client there).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

from torch import Tensor, nn

from fglrepro.config import ConfigError
from fglrepro.fl.aggregation import load_parameters, parameters_of, weighted_average
from fglrepro.fl.communication import module_bytes
from fglrepro.fl.engine import ClientBatch
from fglrepro.fl.grouped import WHOLE_GRAPH, GroupedRole, GroupedUpdates, PerClient, WholeGraph
from fglrepro.fl.method import FederatedMethod, Federation, Objective, Upload
from fglrepro.methods import register


@dataclass(frozen=True)
class FMLHparams:
    """alpha: weight of the private model's cross-entropy; ``1 - alpha`` weighs its
        distillation from the meme model (FedPPN's graph configs ``fml.alpha`` 0.3).
    beta: weight of the meme model's cross-entropy; ``1 - beta`` weighs its distillation
        from the private model (FedPPN's graph configs ``fml.beta`` 1.0: the meme model
        learns from the labels only).

    The meme model is the study's ``model`` block (FedPPN's graph configs: a 2-layer GCN of
    hidden width 64), initialised once and shared by all clients.
    """

    alpha: float = 0.3
    beta: float = 1.0

    def __post_init__(self) -> None:
        for key in ("alpha", "beta"):
            if not 0.0 <= getattr(self, key) <= 1.0:
                raise ConfigError(f"hparams.{key} must be in [0, 1], got {getattr(self, key)}")


def mutual_losses(private: Tensor, meme: Tensor, labels: Tensor, alpha: float, beta: float,
                  terms: WholeGraph | PerClient = WHOLE_GRAPH) -> tuple[Tensor, Tensor]:
    """``(L_private, L_meme)`` of FML from the two models' logits ``[m, C]`` on the training
    nodes and their labels ``[m]`` (each teacher detached in the other's loss); scalars, or
    per client ``[K]`` with ``terms`` :class:`~fglrepro.fl.grouped.PerClient`."""
    loss_private = alpha * terms.cross_entropy(private, labels) + (1 - alpha) * terms.kl(meme.detach(), private)
    loss_meme = beta * terms.cross_entropy(meme, labels) + (1 - beta) * terms.kl(private.detach(), meme)
    return loss_private, loss_meme


@register("fml")
class FML(GroupedUpdates, FederatedMethod):
    """Private model ``states[k].model`` (tested) and meme model ``states[k].modules["meme"]``
    trained by :func:`mutual_losses`; the server averages the meme models."""

    label = "FML"
    Hparams = FMLHparams
    has_global_model = False
    heterogeneous_models = True

    def __init__(self, federation: Federation, hparams: FMLHparams) -> None:
        super().__init__(federation, hparams)
        self.global_meme = copy.deepcopy(federation.model)
        for state in self.states:
            state.modules["meme"] = copy.deepcopy(federation.model)

    def receive(self, k: int, round_: int) -> None:
        load_parameters(self.states[k].modules["meme"], dict(self.global_meme.named_parameters()))

    def local_objective(self, k: int, round_: int) -> Objective:
        state, client = self.states[k], self.clients[k]
        private, meme, mask = state.model, state.modules["meme"], client.train_mask
        alpha, beta = self.hparams.alpha, self.hparams.beta

        def loss() -> Tensor:
            z_private, z_meme = private(client.x, client.adj)[mask], meme(client.x, client.adj)[mask]
            loss_private, loss_meme = mutual_losses(z_private, z_meme, client.y[mask], alpha, beta)
            return loss_private + loss_meme

        return loss

    def grouped_roles(self) -> dict[str, list[nn.Module]]:
        return {"private": [s.model for s in self.states], "meme": [s.modules["meme"] for s in self.states]}

    def grouped_loss(self, union: ClientBatch, roles: dict[str, GroupedRole], round_: int) -> Tensor:
        """:meth:`local_objective` of every participant, ``[m]``."""
        mask = union.train_mask
        z_private, z_meme = roles["private"].forward()[1][mask], roles["meme"].forward()[1][mask]
        terms = PerClient(union.batch[mask], union.num_clients)
        loss_private, loss_meme = mutual_losses(z_private, z_meme, union.y[mask], self.hparams.alpha,
                                                self.hparams.beta, terms)
        return loss_private + loss_meme

    def upload(self, k: int, round_: int, loss: float) -> Upload:
        """The meme model's parameters (the same shapes on every client)."""
        return Upload(params=parameters_of(self.states[k].modules["meme"]), weight=float(self.clients[k].num_nodes),
                      loss=loss)

    def server_update(self, round_: int, uploads: dict[int, Upload]) -> None:
        ups = list(uploads.values())
        load_parameters(self.global_meme, weighted_average([u.params for u in ups], [u.weight for u in ups]))

    def download_bytes(self, k: int) -> int:
        return module_bytes(self.global_meme)
