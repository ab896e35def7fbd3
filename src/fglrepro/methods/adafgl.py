"""AdaFGL (Li et al., ICDE 2024, "AdaFGL: A New Paradigm for Federated Node Classification
with Topology Heterogeneity"), as OpenFGL runs it (``flcore/adafgl``).

Step 1: ``fedavg_rounds`` rounds of FedAvg. Step 2 (every later round, no communication):
each client turns the last global model into a personalised, topology-adaptive predictor.

- Soft labels ``S = softmax(f_global(X, A))`` ``[n, C]``.
- Reliability ``rho``: non-parametric label propagation (``lp_steps`` steps of
  ``Y <- alpha A_r Y + (1 - alpha) Y_0``, the seed nodes' one-hot rows added back each step)
  from a random half of the training nodes (one-hot; every other node uniform) scores its
  accuracy on the other half.
- A similarity graph ``U = 1[cos(softmax(S_i), softmax(S_j)) > 0.999]`` (no self-loops) is
  mixed with the client graph, ``alpha A + (1 - alpha) U``, and propagates the features:
  ``X_s = [X, P X, P^2 X, ..., P^prop_steps X]`` with ``P`` the ``r``-normalised mixed graph.
- Homophilous branch: an MLP on ``X_s`` (CE + MSE to ``S``). Heterophilous branch: MLPs on
  ``X`` and ``X_s`` and a learnable propagation that mixes positive and negative messages of
  the embedding similarity (three CEs). One Adam step on the summed loss per round.
- Prediction: ``rho (softmax(z_homo) + softmax(S)) / 2 + (1 - rho) mean(softmax(z_hete_*))``.

``A_r = D^(r-1) (A + I) D^(-r)`` (``r = 0.5``: the symmetric GCN normalisation). Dense
``[n, n]`` matrices are used for ``U`` and the learned propagation, as in the code.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fglrepro.config import ConfigError
from fglrepro.fl.aggregation import load_parameters
from fglrepro.fl.method import Federation, ParameterAveraging, RunSetup, Upload
from fglrepro.fl.training import make_optimizer, train_steps
from fglrepro.methods import register


@dataclass(frozen=True)
class AdaFGLHparams:
    """fedavg_rounds: rounds of step 1 (OpenFGL ``num_rounds_vanilla`` 50).
    prop_steps: feature propagation steps of step 2 (``prop_steps`` 3).
    r: normalisation exponent of ``D^(r-1) (A + I) D^(-r)`` (``r`` 0.5).
    alpha: weight of the client graph against the similarity graph, and of propagation in
        the reliability label propagation (``AdaFGLModel(alpha=0.5)``).
    lp_steps: steps of the reliability label propagation (``NonParaLP(prop_steps=10)``).
    similarity_threshold: cosine above which two nodes' soft labels are linked (0.999).
    steps_per_round: optimiser steps of step 2 per round (the code takes one; Adam with the
        study's learning rate and weight decay, OpenFGL ``adafgl_lr`` 1e-2, 5e-4).
    """

    fedavg_rounds: int = 50
    prop_steps: int = 3
    r: float = 0.5
    alpha: float = 0.5
    lp_steps: int = 10
    similarity_threshold: float = 0.999
    steps_per_round: int = 1

    def __post_init__(self) -> None:
        if self.fedavg_rounds < 1 or self.prop_steps < 0 or self.lp_steps < 0 or self.steps_per_round < 1:
            raise ConfigError("hparams.fedavg_rounds and steps_per_round must be >= 1, prop_steps and lp_steps >= 0")
        if not 0.0 <= self.alpha <= 1.0:
            raise ConfigError(f"hparams.alpha must be in [0, 1], got {self.alpha}")


def dense_adjacency(edge_index: Tensor, num_nodes: int) -> Tensor:
    """``[n, n]`` 0/1 adjacency of ``edge_index [2, E]``."""
    adjacency = torch.zeros(num_nodes, num_nodes, device=edge_index.device)
    adjacency[edge_index[0], edge_index[1]] = 1.0
    return adjacency


def r_normalized(adjacency: Tensor, r: float) -> Tensor:
    """``D^(r-1) (A + I) D^(-r)`` of a dense (weighted, symmetric) ``adjacency [n, n]``, ``D``
    the degrees of ``A + I`` (the code's ``adj_to_symmetric_norm``)."""
    looped = adjacency + torch.eye(adjacency.size(0), device=adjacency.device)
    degree = looped.sum(dim=1)
    return degree.pow(r - 1).unsqueeze(1) * looped * degree.pow(-r).unsqueeze(0)


def cosine_similarity_matrix(logits: Tensor) -> Tensor:
    """``[n, n]`` cosine similarities of the rows of ``softmax(logits)``, diagonal zeroed
    (the code's ``getre_scale``)."""
    probabilities = F.normalize(F.softmax(logits, dim=1), dim=1)
    return (probabilities @ probabilities.T).fill_diagonal_(0.0)


def reliability(labels: Tensor, train_mask: Tensor, operator: Tensor, num_classes: int, steps: int, alpha: float,
                generator: torch.Generator) -> float:
    """Accuracy of label propagation with ``operator [n, n]`` from a random half of the
    training nodes on the other half (1.0 without such nodes)."""
    train = torch.nonzero(train_mask).flatten()
    order = train[torch.randperm(train.numel(), generator=generator).to(train.device)]
    seeds, held_out = order[: train.numel() // 2], order[train.numel() // 2:]
    start = torch.full((labels.numel(), num_classes), 1.0 / num_classes, device=labels.device)
    start[seeds] = F.one_hot(labels[seeds], num_classes).to(start.dtype)
    out = start
    for _ in range(steps):
        out = alpha * operator @ out + (1 - alpha) * start
        out[seeds] += start[seeds]
    if held_out.numel() == 0:
        return 1.0
    return float((out[held_out].argmax(dim=1) == labels[held_out]).float().mean())


def mlp(widths: list[int], dropout: float) -> nn.Sequential:
    """Linear layers of ``widths`` with PReLU and dropout between them (Xavier init with ReLU
    gain, zero biases, as the code)."""
    layers: list[nn.Module] = []
    for i, (a, b) in enumerate(zip(widths[:-1], widths[1:])):
        linear = nn.Linear(a, b)
        nn.init.xavier_uniform_(linear.weight, gain=nn.init.calculate_gain("relu"))
        nn.init.zeros_(linear.bias)
        layers.append(linear)
        if i < len(widths) - 2:
            layers += [nn.PReLU(), nn.Dropout(dropout)]
    return nn.Sequential(*layers)


class HeterophilousPropagation(nn.Module):
    """The code's ``HetePropagateLayer``: an MLP embeds ``X_s`` into ``E [n, C]``; the cosine
    similarity ``R`` of ``softmax(E)`` is centred at its mean and scaled to [-1, 1] (the
    code's piecewise rule), the identity added, and positive and negative messages
    ``softmax(PReLU(R) E)``, ``softmax(PReLU(-R) E)`` combined with ``E``:
    ``((pos - neg) + E) / 2``."""

    def __init__(self, widths: list[int], dropout: float) -> None:
        super().__init__()
        self.embed = mlp(widths, dropout)
        self.activation = nn.PReLU()

    def forward(self, smoothed: Tensor) -> Tensor:
        embedding = self.embed(smoothed)
        similarity = cosine_similarity_matrix(embedding)
        mean, top = similarity.mean(), similarity.max()
        centred = similarity - mean
        scaled = torch.where(centred > 0, centred / (top - mean), -(centred + mean) / mean)
        scaled = scaled + torch.eye(scaled.size(0), device=scaled.device)
        positive = F.softmax(self.activation(scaled) @ embedding, dim=1)
        negative = F.softmax(self.activation(-scaled) @ embedding, dim=1)
        return ((positive - negative) + embedding) / 2


class PersonalizedPropagation(nn.Module):
    """A client's step-2 predictor on its own precomputed inputs: ``forward(x, adj)`` returns
    the combined class probabilities ``[n, C]`` (the graph arguments are the client's own and
    only give the interface of the other models)."""

    def __init__(self, features: Tensor, smoothed: Tensor, soft_labels: Tensor, rho: float, hidden: int,
                 dropout: float = 0.5) -> None:
        super().__init__()
        width, wide, classes = features.size(1), smoothed.size(1), soft_labels.size(1)
        self.features, self.smoothed, self.soft_labels, self.rho = features, smoothed, soft_labels, rho
        self.homo = mlp([wide, hidden, classes], dropout)
        self.hete_smooth = mlp([wide, hidden, hidden, classes], dropout)
        self.hete_local = mlp([width, hidden, hidden, classes], dropout)
        self.hete_propagation = HeterophilousPropagation([wide, hidden, hidden, classes], dropout)

    def branches(self) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """Logits ``[n, C]`` of the homophilous MLP and the three heterophilous outputs."""
        return (self.homo(self.smoothed), self.hete_local(self.features), self.hete_smooth(self.smoothed),
                self.hete_propagation(self.smoothed))

    def loss(self, labels: Tensor, train_mask: Tensor) -> Tensor:
        homo, *hete = self.branches()
        value = F.cross_entropy(homo[train_mask], labels[train_mask]) + F.mse_loss(homo, self.soft_labels)
        return value + sum(F.cross_entropy(z[train_mask], labels[train_mask]) for z in hete)

    def forward(self, x: Tensor, adj: Tensor) -> Tensor:
        homo, *hete = self.branches()
        homo_probabilities = (F.softmax(homo, dim=1) + F.softmax(self.soft_labels, dim=1)) / 2
        hete_probabilities = sum(F.softmax(z, dim=1) for z in hete) / len(hete)
        return self.rho * homo_probabilities + (1 - self.rho) * hete_probabilities


@register("adafgl")
class AdaFGL(ParameterAveraging):
    """FedAvg for ``fedavg_rounds`` rounds, then local personalised propagation."""

    label = "AdaFGL"
    Hparams = AdaFGLHparams

    def __init__(self, federation: Federation, hparams: AdaFGLHparams) -> None:
        super().__init__(federation, hparams)
        self.personal: dict[int, PersonalizedPropagation] = {}

    @classmethod
    def check_protocol(cls, hparams, setup: RunSetup) -> None:
        if setup.train.rounds <= hparams.fedavg_rounds:
            raise ConfigError(f"method 'adafgl' personalises after hparams.fedavg_rounds = {hparams.fedavg_rounds} "
                              f"rounds of FedAvg; train.rounds must be larger, got {setup.train.rounds}")

    def personalize(self, k: int) -> PersonalizedPropagation:
        """Client ``k``'s step-2 predictor from the global model it holds (its MLPs as wide as
        the model's hidden embedding, OpenFGL's ``hid_dim``)."""
        client, hp, model = self.clients[k], self.hparams, self.states[k].model
        load_parameters(model, dict(self.global_model.named_parameters()))
        model.eval()
        with torch.no_grad():
            hidden, logits = model(client.x, client.adj, return_hidden=True)
            soft_labels = F.softmax(logits, dim=1)
            graph = dense_adjacency(client.edge_index, client.num_nodes)
            rho = reliability(client.y, client.train_mask, r_normalized(graph, hp.r), client.num_classes,
                              hp.lp_steps, hp.alpha, self.federation.generator)
            similar = (cosine_similarity_matrix(soft_labels) > hp.similarity_threshold).to(graph.dtype)
            operator = r_normalized(hp.alpha * graph + (1 - hp.alpha) * similar, hp.r)
            blocks = [client.x]
            for _ in range(hp.prop_steps):
                blocks.append(operator @ blocks[-1])
        personal = PersonalizedPropagation(client.x, torch.cat(blocks, dim=1), soft_labels, rho, hidden.size(1))
        return personal.to(client.x.device)

    def client_update(self, k: int, round_: int) -> Upload | None:
        if round_ <= self.hparams.fedavg_rounds:
            return super().client_update(k, round_)
        if k not in self.personal:
            self.personal[k] = self.personalize(k)
            self.states[k].modules["personal"] = self.personal[k]
            self.states[k].optimizer = make_optimizer(self.personal[k], self.federation.train)
        personal, client = self.personal[k], self.clients[k]
        loss = train_steps(self.states[k].optimizer, [personal], self.hparams.steps_per_round,
                           lambda: personal.loss(client.y, client.train_mask))
        return Upload(params={}, weight=float(client.num_nodes), loss=loss)

    def server_update(self, round_: int, uploads: dict[int, Upload]) -> None:
        """FedAvg in step 1, nothing in step 2."""
        if round_ <= self.hparams.fedavg_rounds:
            super().server_update(round_, uploads)

    def download_bytes(self, k: int) -> int:
        return 0 if k in self.personal else super().download_bytes(k)

    def eval_model(self, k: int, stage: str) -> nn.Module:
        return self.personal[k] if k in self.personal else super().eval_model(k, stage)
