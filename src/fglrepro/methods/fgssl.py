"""FGSSL (Huang et al., IJCAI 2023, "Federated Graph Semantic and Structural Learning"), as
OpenFGL runs it (``flcore/fgssl``): FedAvg whose local loss calibrates the local model with
the received global model.

Each step draws a weak view (edge removal 0.3, feature masking 0.3) for the global model
and a strong view (0.8, 0.5) for the local model. Federated graph structure distillation
(FGSD): for every edge ``(u, v)`` of the client graph, the distribution
``softmax(|h_u - h_v| / tau)`` over the hidden dimensions of the local model's embeddings
``h`` (strong view) is pulled towards that of the global model's (weak view, no gradient)
by ``KL(global || local)``, averaged over edges. Federated node semantic contrast (FNSC):
a supervised InfoNCE that pulls each local training-node embedding towards the global
embeddings of the training nodes of its class and away from the others; OpenFGL computes it
but leaves it out of the loss, so its weight defaults to 0. The embedding is the input of
the last layer (OpenFGL's GCN returns it with the logits).

    L = CE(y, local model on the original graph) + structure_weight FGSD + contrast_weight FNSC
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from fglrepro.config import ConfigError
from fglrepro.fl.augment import perturbed_view
from fglrepro.fl.method import Objective, ParameterAveraging
from fglrepro.methods import register


@dataclass(frozen=True)
class FGSSLHparams:
    """structure_weight, temperature: weight and ``tau`` of the edge-distribution
        distillation (OpenFGL: ``loss_ff * 0.1``, ``tau = 0.1``).
    contrast_weight, contrast_temperature: weight and ``tau`` of the node semantic contrast
        (OpenFGL computes it with ``InfoNCE(tau=0.1)`` and discards it: weight 0).
    weak_edge_drop, weak_feature_mask, strong_edge_drop, strong_feature_mask: the two views
        (OpenFGL: 0.3 / 0.3 and 0.8 / 0.5).
    """

    structure_weight: float = 0.1
    temperature: float = 0.1
    contrast_weight: float = 0.0
    contrast_temperature: float = 0.1
    weak_edge_drop: float = 0.3
    weak_feature_mask: float = 0.3
    strong_edge_drop: float = 0.8
    strong_feature_mask: float = 0.5

    def __post_init__(self) -> None:
        for key in ("weak_edge_drop", "weak_feature_mask", "strong_edge_drop", "strong_feature_mask"):
            if not 0.0 <= getattr(self, key) <= 1.0:
                raise ConfigError(f"hparams.{key} must be in [0, 1], got {getattr(self, key)}")
        if self.temperature <= 0 or self.contrast_temperature <= 0:
            raise ConfigError("hparams.temperature and contrast_temperature must be > 0")


def edge_distribution_kl(local: Tensor, teacher: Tensor, edge_index: Tensor, temperature: float) -> Tensor:
    """FGSD: ``mean_e KL(softmax(|g_u - g_v| / tau) || softmax(|h_u - h_v| / tau))`` over the
    edges ``(u, v)`` of ``edge_index [2, E]``; ``local`` ``h`` and ``teacher`` ``g`` are
    ``[n, d]`` (0 without edges)."""
    if edge_index.size(1) == 0:
        return local.sum() * 0.0
    u, v = edge_index
    log_local = F.log_softmax((local[u] - local[v]).abs() / temperature, dim=-1)
    log_teacher = F.log_softmax((teacher[u] - teacher[v]).abs() / temperature, dim=-1)
    return F.kl_div(log_local, log_teacher, reduction="batchmean", log_target=True)


def semantic_contrast(local: Tensor, teacher: Tensor, labels: Tensor, temperature: float) -> Tensor:
    """FNSC: ``-mean_i 1/|P_i| sum_{p in P_i} log(e^{s_ip} / sum_j e^{s_ij})`` with
    ``s_ij = cos(h_i, g_j) / tau``, ``P_i`` the nodes of ``i``'s class (``i`` included);
    ``local`` ``h`` and ``teacher`` ``g`` ``[m, d]``, ``labels [m]``."""
    logits = F.normalize(local, dim=-1) @ F.normalize(teacher, dim=-1).T / temperature
    positive = (labels.unsqueeze(0) == labels.unsqueeze(1)).to(logits.dtype)
    log_prob = F.log_softmax(logits, dim=1)
    return -((log_prob * positive).sum(dim=1) / positive.sum(dim=1)).mean()


@register("fgssl")
class FGSSL(ParameterAveraging):
    """FedAvg with FGSSL's local loss (homogeneous models; the global model is tested)."""

    label = "FGSSL"
    Hparams = FGSSLHparams

    def local_objective(self, k: int, round_: int) -> Objective:
        model, teacher, client, hp = self.states[k].model, self.global_model, self.clients[k], self.hparams
        mask = client.train_mask

        def loss() -> Tensor:
            value = F.cross_entropy(model(client.x, client.adj)[mask], client.y[mask])
            teacher.eval()
            with torch.no_grad():
                global_hidden = teacher(*perturbed_view(client, hp.weak_edge_drop, hp.weak_feature_mask),
                                        return_hidden=True)[0]
            local_hidden = model(*perturbed_view(client, hp.strong_edge_drop, hp.strong_feature_mask),
                                 return_hidden=True)[0]
            value = value + hp.structure_weight * edge_distribution_kl(local_hidden, global_hidden, client.edge_index,
                                                                      hp.temperature)
            if hp.contrast_weight:
                value = value + hp.contrast_weight * semantic_contrast(local_hidden[mask], global_hidden[mask],
                                                                       client.y[mask], hp.contrast_temperature)
            return value

        return loss
