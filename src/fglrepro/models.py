"""Model zoo shared by every method.

Models take node features and a graph operator: ``forward(x, adj)`` with ``x`` of shape
``[n, F]`` and ``adj`` the client's GCN-normalised sparse adjacency ``[n, n]`` (self-loops
included, see :class:`fglrepro.fl.clients.ClientData`), and return logits ``[n, C]``.
"""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor, nn
from torch_geometric.nn import GCNConv

from fglrepro.config import ConfigError, ModelConfig


class GCN(nn.Module):
    """``layers``-layer GCN (Kipf & Welling), optionally followed by a linear READOUT.

    Without readout the last GCN layer outputs class logits. With ``readout=True`` (the
    FED-PUB / FedGKD model) every GCN layer outputs ``hidden`` channels with ReLU and
    dropout, and a linear layer maps them to logits.

    Args:
        in_channels: F, input feature size.
        hidden: width of hidden layers.
        out_channels: C, number of classes.
        layers: number of GCN layers (>= 1).
        dropout: dropout probability applied to hidden representations.
        readout: append a linear classifier after the GCN layers.
    """

    def __init__(
        self, in_channels: int, hidden: int, out_channels: int, layers: int = 2,
        dropout: float = 0.5, readout: bool = False,
    ) -> None:
        super().__init__()
        if layers < 1:
            raise ConfigError(f"model.layers must be >= 1, got {layers}")
        widths = [in_channels] + [hidden] * (layers - 1) + [hidden if readout else out_channels]
        self.convs = nn.ModuleList(
            GCNConv(a, b, normalize=False) for a, b in zip(widths[:-1], widths[1:])
        )
        self.readout = nn.Linear(hidden, out_channels) if readout else None
        self.dropout = dropout

    def forward(self, x: Tensor, adj: Tensor, return_hidden: bool = False) -> Tensor | tuple[Tensor, Tensor]:
        """``x [n, F]``, ``adj [n, n]`` sparse normalised -> logits ``[n, C]``.

        With ``return_hidden`` also returns the input of the last layer ``[n, hidden]``
        (the node representation used by contrastive methods): ``(hidden, logits)``.
        """
        hidden = x
        for i, conv in enumerate(self.convs):
            if i == len(self.convs) - 1:
                hidden = x
            x = conv(x, adj)
            if i < len(self.convs) - 1 or self.readout is not None:
                x = F.dropout(F.relu(x), p=self.dropout, training=self.training)
        if self.readout is not None:
            hidden = x
            x = self.readout(x)
        return (hidden, x) if return_hidden else x


MODELS: dict[str, type[nn.Module]] = {"gcn": GCN}


def build_model(config: ModelConfig, in_channels: int, num_classes: int) -> nn.Module:
    """Instantiate the architecture named by ``config.arch``."""
    if config.arch not in MODELS:
        raise ConfigError(f"unknown model.arch {config.arch!r}; valid architectures: {sorted(MODELS)}")
    return MODELS[config.arch](
        in_channels, config.hidden, num_classes, layers=config.layers,
        dropout=config.dropout, readout=config.readout,
    )
