"""FedStar (Tan et al., AAAI 2023, "Federated learning on non-IID graphs via structural
knowledge sharing"), adapted from graph to node classification for FedGKD's Tables 1 and 5.

Every node gets a structure encoding (random-walk return probabilities of lengths 1..16 and
its one-hot degree, 16 + 16 values). A client's model has two channels: the structure channel
``s`` (a linear embedding of the encoding, then GCN layers with tanh) and the feature channel
``h`` (GCN layers with ReLU and dropout whose input at every layer is ``[h || s]``); the
READOUT maps ``[h_L || s_L]`` to class logits. Only the structure channel (parameters
``*_s``) is averaged (weights n_k / N); the feature channel and READOUT stay local.

Our adaptation (FedStar and FedGKD describe graph classification only): the node embedding
``[h_L || s_L]`` replaces FedStar's pooled graph embedding and its graph-level classifier; GIN
layers are replaced by the study's GCN layers (FedGKD's backbone); the return probabilities
are those of ``A + I`` (:func:`fglrepro.components.topology.return_probabilities`; FedStar's code
uses ``A D^-1`` without self-loops).
"""

from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fglrepro.components.partial import PartialAveraging
from fglrepro.components.topology import structure_encoding
from fglrepro.config import ConfigError
from fglrepro.fl.method import Federation, RunSetup
from fglrepro.methods import register
from fglrepro.models import GCN, GCNLayer, dropout, fast_kernels_enabled, feature_linear, propagate_once


@dataclass(frozen=True)
class FedStarHparams:
    """FedStar's defaults (paper and code): 16 random-walk steps, 16 degree bins."""

    walk_length: int = 16
    degree_dim: int = 16

    def __post_init__(self) -> None:
        for key in ("walk_length", "degree_dim"):
            if getattr(self, key) < 1:
                raise ConfigError(f"hparams.{key} must be >= 1, got {getattr(self, key)}")


class DecoupledGCN(nn.Module):
    r"""FedStar's decoupled structure / feature GNN on GCN layers.

    .. math:: s_0 = W_s e, \quad s_l = \tanh(\mathrm{GCN}^s_l(s_{l-1})), \quad
        h_l = \mathrm{dropout}(\mathrm{ReLU}(\mathrm{GCN}_l([h_{l-1} | s_{l-1}]))), \quad
        \mathrm{logits} = \mathrm{READOUT}([h_L | s_L]),

    with ``h_0 = x``. Input ``[n, F + S]``: node features with the structure encoding ``e``
    in the last ``S`` columns. Parameters of the structure channel end in ``_s``
    (``embedding_s``, ``convs_s``).
    """

    def __init__(self, in_channels: int, structure_dim: int, hidden: int, out_channels: int, layers: int,
                 dropout: float) -> None:
        super().__init__()
        self.structure_dim, self.dropout = structure_dim, dropout
        self.embedding_s = nn.Linear(structure_dim, hidden)
        self.convs_s = nn.ModuleList(GCNLayer(hidden, hidden) for _ in range(layers))
        widths = [in_channels] + [hidden] * layers
        self.convs = nn.ModuleList(GCNLayer(a + hidden, b) for a, b in zip(widths[:-1], widths[1:]))
        self.readout = nn.Linear(2 * hidden, out_channels)

    def forward(self, x: Tensor, adj: Tensor, return_hidden: bool = False) -> Tensor | tuple[Tensor, Tensor]:
        """``x [n, F + S]``, ``adj [n, n]`` -> logits ``[n, C]`` (and ``[h_L || s_L]``, ``[n, 2 hidden]``).

        With the fast kernels on (:func:`~fglrepro.models.set_fast_kernels`) the first feature
        convolution splits its weight ``W = [W_x | W_s]`` by input columns:
        ``[x | s_0] W^T = x W_x^T + s_0 W_s^T``, the first product sparse on bag-of-words
        features (read from the whole input ``[x | e]`` with zero weights on ``e``, so that
        the input's sparse form is built once per client); equal up to float rounding."""
        h, s = x[:, :-self.structure_dim], self.embedding_s(x[:, -self.structure_dim:])
        for i, (conv, conv_s) in enumerate(zip(self.convs, self.convs_s)):
            if i == 0 and fast_kernels_enabled():
                h = first_convolution(conv, x, s, adj)
            else:
                h = conv(torch.cat([h, s], dim=1), adj)
            s = torch.tanh(conv_s(s, adj))
            h = dropout(F.relu(h), self.dropout, self.training)
        hidden = torch.cat([h, s], dim=1)
        logits = self.readout(hidden)
        return (hidden, logits) if return_hidden else logits


def first_convolution(conv: GCNLayer, x: Tensor, s: Tensor, adj: Tensor) -> Tensor:
    """``conv([x[:, :F] | s], adj)`` for ``x [n, F + S]`` (features, then the structure
    encoding) and ``s [n, H]``: ``Â (x [W_x | 0]^T + s W_s^T) + b``, the first product a
    :func:`~fglrepro.models.feature_linear` of the whole ``x`` (sparse where it is)."""
    num_features, weight = conv.in_channels - s.size(1), conv.lin.weight
    padded = torch.cat([weight[:, :num_features], weight.new_zeros(weight.size(0), x.size(1) - num_features)], dim=1)
    h = feature_linear(x, padded) + s @ weight[:, num_features:].t()
    return propagate_once(adj, h) + conv.bias


def decoupled_like(gcn: GCN, structure_dim: int) -> DecoupledGCN:
    """A :class:`DecoupledGCN` with the width, depth, dropout and class count of ``gcn``."""
    out = gcn.readout.out_features if gcn.readout is not None else gcn.convs[-1].out_channels
    hidden = gcn.convs[0].out_channels
    model = DecoupledGCN(gcn.convs[0].in_channels, structure_dim, hidden, out, len(gcn.convs), gcn.dropout)
    return model.to(next(gcn.parameters()).device)


@register("fedstar")
class FedStar(PartialAveraging):
    """Clients train :class:`DecoupledGCN` models on their features with the structure encoding
    appended (``self.clients``); the server averages the structure channel."""

    label = "FedStar"
    Hparams = FedStarHparams

    def __init__(self, federation: Federation, hparams: FedStarHparams) -> None:
        super().__init__(federation, hparams)
        dim = hparams.walk_length + hparams.degree_dim
        self.clients = [
            dataclasses.replace(c, x=torch.cat(
                [c.x, structure_encoding(c.edge_index, c.num_nodes, hparams.walk_length,
                                         hparams.degree_dim).to(c.x.device)], dim=1))
            for c in self.clients
        ]
        self.global_model = decoupled_like(federation.model, dim)
        for state in self.states:
            state.model = copy.deepcopy(self.global_model)
            state.received = self.global_model

    @classmethod
    def check_protocol(cls, hparams: FedStarHparams, setup: RunSetup) -> None:
        if setup.model.arch != "gcn":
            raise ConfigError(f"fedstar builds its decoupled model from model.arch 'gcn'; got {setup.model.arch!r}")

    def shares(self, name: str) -> bool:
        """The structure channel: parameters of modules whose name ends in ``_s``."""
        return name.split(".")[0].endswith("_s")

