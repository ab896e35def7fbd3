"""FedTGP (Zhang et al., AAAI 2024, "Trainable Global Prototypes with Adaptive-Margin-Enhanced
Contrastive Learning for Data and Model Heterogeneity in Federated Learning").

Clients (any architecture with a linear head on one hidden width ``d``) train on
cross-entropy plus ``lam`` times the distance of their training nodes' hidden embeddings to
the global prototype of their class (OpenFGL ``fedtgp``: per class the mean squared error,
summed over classes), then upload the class means of those embeddings (their local
prototypes, classes without training nodes left out). The server does not average them:
it trains the global prototypes ``P = fc(ReLU(W e_c))`` of learnable class embeddings
``e_c`` so that every uploaded prototype is nearer its class's global prototype than any
other by a margin (adaptive-margin contrastive loss, :func:`margin_contrastive_loss`). The
margin is the largest class-wise minimum distance between the clients' averaged prototypes,
capped by ``margin_threshold`` (HtFLlib ``servertgp``, the authors' code).

With ``train.engine: auto`` the clients train on the grouped path (:mod:`fglrepro.fl.grouped`:
the models of one architecture as one stacked model, one step for all), the alignment term
per client (:func:`~fglrepro.components.prototypes.prototype_alignment_loss` with ``clients``).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fglrepro.components.heterogeneous import require_common_head
from fglrepro.components.prototypes import (
    average_prototypes,
    client_prototypes,
    margin_contrastive_loss,
    plain_mean_parts,
    prototype_alignment_loss,
    prototype_upload,
    union_prototypes,
)
from fglrepro.config import ConfigError
from fglrepro.fl.engine import ClientBatch
from fglrepro.fl.grouped import GroupedRole, GroupedUpdates, PerClient
from fglrepro.fl.method import FederatedMethod, Federation, Objective, RunSetup, Upload
from fglrepro.fl.training import cross_entropy_loss, make_optimizer
from fglrepro.methods import register


@dataclass(frozen=True)
class FedTGPHparams:
    """lam: weight of the prototype-alignment term (OpenFGL ``fedtgp_lambda`` 1; HtFLlib
        ``lamda`` 1.0).
    server_epochs, server_lr: full-batch Adam steps per round on the global prototypes and
        their learning rate (OpenFGL: 10 steps, lr 1e-2, the study's weight decay, coupled as
        torch's Adam couples it, whatever ``train.optimizer`` the clients use; HtFLlib
        trains 100 epochs of SGD on mini-batches of 10 prototypes).
    margin_threshold: cap of the adaptive margin (HtFLlib ``margin_threthold`` 100; OpenFGL
        caps at 100 too).
    """

    lam: float = 1.0
    server_epochs: int = 10
    server_lr: float = 0.01
    margin_threshold: float = 100.0

    def __post_init__(self) -> None:
        if self.lam < 0 or self.server_epochs < 0 or self.server_lr <= 0 or self.margin_threshold < 0:
            raise ConfigError(f"hparams.lam, server_epochs, margin_threshold must be >= 0 and server_lr > 0; got "
                              f"{self.lam}, {self.server_epochs}, {self.margin_threshold}, {self.server_lr}")


class TrainableGlobalPrototypes(nn.Module):
    """``P = fc(ReLU(middle(e)))`` of one learnable embedding per class: ``[C, d]``."""

    def __init__(self, num_classes: int, width: int) -> None:
        super().__init__()
        self.embeddings = nn.Embedding(num_classes, width)
        self.middle = nn.Linear(width, width)
        self.fc = nn.Linear(width, width)

    def forward(self) -> Tensor:
        return self.fc(F.relu(self.middle(self.embeddings.weight)))


def adaptive_margin(prototypes: Tensor, present: Tensor, threshold: float) -> float:
    """``min(max_c gap_c, threshold)`` with ``gap_c`` the distance of class ``c``'s averaged
    prototype to the nearest other present class's (``prototypes [C, d]``, ``present [C]``);
    ``threshold`` when fewer than two classes are present."""
    rows = prototypes[present]
    if rows.size(0) < 2:
        return threshold
    distance = torch.cdist(rows, rows).fill_diagonal_(float("inf"))
    return min(float(distance.min(dim=1).values.max()), threshold)


@register("fedtgp")
class FedTGP(GroupedUpdates, FederatedMethod):
    """Local prototypes up, trained global prototypes down; clients are tested on their own
    models."""

    label = "FedTGP"
    Hparams = FedTGPHparams
    has_global_model = False
    heterogeneous_models = True

    def __init__(self, federation: Federation, hparams: FedTGPHparams) -> None:
        super().__init__(federation, hparams)
        client = self.clients[0]
        width = client_prototypes(self.states[0].model, client)[1].size(1)
        self.num_classes = client.num_classes
        self.tgp = TrainableGlobalPrototypes(self.num_classes, width).to(client.x.device)
        server = replace(federation.train, optimizer="adam", lr=hparams.server_lr)
        self.optimizer = make_optimizer(self.tgp, server)
        #: ``[C, d]`` global prototypes clients align to (None before the first server step)
        self.global_prototypes: Tensor | None = None
        self.margin = hparams.margin_threshold
        #: local prototypes computed on the grouped path for this round's uploads
        self._prototypes: dict[int, tuple[Tensor, Tensor, Tensor]] = {}

    @classmethod
    def check_protocol(cls, hparams, setup: RunSetup) -> None:
        require_common_head(setup.model, "fedtgp")

    def local_objective(self, k: int, round_: int) -> Objective:
        model, client, prototypes = self.states[k].model, self.clients[k], self.global_prototypes
        if prototypes is None or self.hparams.lam == 0:
            return lambda: cross_entropy_loss(model, client)
        present = torch.ones(self.num_classes, dtype=torch.bool, device=prototypes.device)
        lam, mask = self.hparams.lam, client.train_mask

        def loss() -> Tensor:
            hidden, logits = model(client.x, client.adj, return_hidden=True)
            alignment = prototype_alignment_loss(hidden[mask], client.y[mask], prototypes, present)
            return F.cross_entropy(logits[mask], client.y[mask]) + lam * alignment

        return loss

    def grouped_roles(self) -> dict[str, list[nn.Module]]:
        return {"model": [s.model for s in self.states]}

    def grouped_loss(self, union: ClientBatch, roles: dict[str, GroupedRole], round_: int) -> Tensor:
        """:meth:`local_objective` of every participant, ``[m]``."""
        mask = union.train_mask
        hidden, logits = (t[mask] for t in roles["model"].forward())
        labels, clients = union.y[mask], PerClient(union.batch[mask], union.num_clients)
        loss = clients.cross_entropy(logits, labels)
        if self.global_prototypes is None or self.hparams.lam == 0:
            return loss
        present = torch.ones(self.num_classes, dtype=torch.bool, device=hidden.device)
        return loss + self.hparams.lam * prototype_alignment_loss(hidden, labels, self.global_prototypes, present,
                                                                  clients)

    def grouped_trained(self, ks: list[int], union: ClientBatch, roles: dict[str, GroupedRole], round_: int) -> None:
        """Every participant's local prototypes from one forward pass per architecture."""
        self._prototypes = union_prototypes(roles["model"].predict(ks)[0], union, self.num_classes)

    def upload(self, k: int, round_: int, loss: float) -> Upload:
        """Local prototypes of the classes with training nodes, no parameters."""
        return prototype_upload(self.states[k].model, self.clients[k], loss, self._prototypes.pop(k, None))

    def server_update(self, round_: int, uploads: dict[int, Upload]) -> None:
        """Adaptive margin from the averaged prototypes, then ``server_epochs`` steps of the
        margin contrastive loss over all uploaded prototypes."""
        messages = [u.extras for u in uploads.values()]
        local = torch.cat([m["prototypes"] for m in messages])
        labels = torch.cat([m["classes"] for m in messages])
        average, present = average_prototypes(plain_mean_parts(messages), self.num_classes, local.size(1))
        self.margin = adaptive_margin(average, present, self.hparams.margin_threshold)
        self.tgp.train()
        for _ in range(self.hparams.server_epochs):
            self.optimizer.zero_grad(set_to_none=True)
            margin_contrastive_loss(local, labels, self.tgp(), self.margin).backward()
            self.optimizer.step()
        with torch.no_grad():
            self.global_prototypes = self.tgp().detach()

    def download_bytes(self, k: int) -> int:
        return self.global_prototypes.numel() * self.global_prototypes.element_size()
