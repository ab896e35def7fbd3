"""Model zoo shared by every method.

Models take node features and a graph operator: ``forward(x, adj)`` with ``x`` of shape
``[n, F]`` and ``adj`` the client's GCN-normalised sparse adjacency ``[n, n]`` (self-loops
included, see :class:`fglrepro.fl.clients.ClientData`), and return logits ``[n, C]``.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fglrepro.config import ConfigError, ModelConfig


class _Weight(nn.Module):
    """Holds ``weight [out, in]`` under the name of PyG's ``Linear`` inside ``GCNConv``."""

    def __init__(self, in_channels: int, out_channels: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(out_channels, in_channels))


class GCNLayer(nn.Module):
    r"""Graph convolution (Kipf & Welling, ICLR 2017) on a pre-normalised operator:

    .. math:: X' = \hat{A} X W^\top + b,

    with ``adj`` = :math:`\hat{A} = D^{-1/2}(A + I)D^{-1/2}` (sparse CSR ``[n, n]``, or a dense
    ``[n, n]`` tensor, which may require gradient: a learned or distilled graph), ``x [n, F]``
    -> ``[n, out_channels]``. It is PyG's ``GCNConv(in_channels, out_channels,
    normalize=False)``: the same parameter names (``lin.weight [out, in]``, ``bias [out]``),
    the same Glorot/zeros initialisation from the same random numbers, and the same
    operations (``tests/test_model_zoo.py`` checks output and gradients against PyG). It is
    written here so that a training process does not import PyG, which costs seconds per
    job.
    """

    def __init__(self, in_channels: int, out_channels: int) -> None:
        super().__init__()
        self.in_channels, self.out_channels = in_channels, out_channels
        self.lin = _Weight(in_channels, out_channels)
        self.bias = nn.Parameter(torch.empty(out_channels))
        bound = math.sqrt(6.0 / (in_channels + out_channels))
        for _ in range(2):  # GCNConv's Linear initialises itself, then GCNConv resets it
            self.lin.weight.data.uniform_(-bound, bound)
        self.bias.data.fill_(0.0)

    def forward(self, x: Tensor, adj: Tensor) -> Tensor:
        return propagate_once(adj, F.linear(x, self.lin.weight)) + self.bias


def propagate_once(adj: Tensor, h: Tensor) -> Tensor:
    """``adj @ h`` for a sparse CSR or dense (differentiable) operator ``adj [n, n]``, ``h [n, d]``."""
    return torch.sparse.mm(adj, h) if adj.layout == torch.sparse_csr else adj @ h


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
        self.convs = nn.ModuleList(GCNLayer(a, b) for a, b in zip(widths[:-1], widths[1:]))
        self.readout = nn.Linear(hidden, out_channels) if readout else None
        self.layers, self.hidden, self.dropout = layers, hidden, dropout

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


class MLP(nn.Module):
    """``layers``-layer perceptron with the interface of :class:`GCN` (``adj`` is ignored):
    the feature encoder of FedGLS (eq. 20, ``H = σ(X W1) W2``) and the model of graphless
    clients in its baselines (Fed-MLP, Fed-GNNMLP, FedProto).

    Layer for layer it is :class:`GCN` with the identity as graph operator: ReLU and dropout
    after every layer but the last (after every layer with ``readout=True``, which appends a
    linear classifier). Linear layers use torch's default initialisation.

    Args:
        in_channels: F. hidden: width of hidden layers. out_channels: C (or the embedding
            width when used as an encoder). layers: number of linear layers (>= 1).
        dropout: dropout probability on hidden representations.
        readout: append a linear classifier ``hidden -> out_channels``.
    """

    def __init__(
        self, in_channels: int, hidden: int, out_channels: int, layers: int = 2,
        dropout: float = 0.5, readout: bool = False,
    ) -> None:
        super().__init__()
        if layers < 1:
            raise ConfigError(f"model.layers must be >= 1, got {layers}")
        widths = [in_channels] + [hidden] * (layers - 1) + [hidden if readout else out_channels]
        self.lins = nn.ModuleList(nn.Linear(a, b) for a, b in zip(widths[:-1], widths[1:]))
        self.readout = nn.Linear(hidden, out_channels) if readout else None
        self.layers, self.hidden, self.dropout = layers, hidden, dropout

    def forward(self, x: Tensor, adj: Tensor | None = None,
                return_hidden: bool = False) -> Tensor | tuple[Tensor, Tensor]:
        """``x [n, F]`` -> ``[n, C]``; with ``return_hidden`` also the input of the last layer
        (with readout: the ``[n, hidden]`` embedding), as ``(hidden, logits)``."""
        hidden = x
        for i, lin in enumerate(self.lins):
            if i == len(self.lins) - 1:
                hidden = x
            x = lin(x)
            if i < len(self.lins) - 1 or self.readout is not None:
                x = F.dropout(F.relu(x), p=self.dropout, training=self.training)
        if self.readout is not None:
            hidden = x
            x = self.readout(x)
        return (hidden, x) if return_hidden else x


def propagate(x: Tensor, adj: Tensor, hops: int) -> list[Tensor]:
    """``[Â x, Â² x, ..., Â^hops x]`` for the normalised sparse ``adj [n, n]``, ``x [n, F]``."""
    out = []
    for _ in range(hops):
        x = propagate_once(adj, x)
        out.append(x)
    return out


class SGC(nn.Module):
    """SGC (Wu et al., ICML 2019): ``logits = Â^K x W`` (a linear model on K-hop features).

    ``hidden``, ``layers`` and ``dropout`` are accepted for a uniform constructor and unused.
    """

    def __init__(self, in_channels: int, hidden: int, out_channels: int, hops: int = 2, **_unused) -> None:
        super().__init__()
        self.hops = hops
        self.linear = nn.Linear(in_channels, out_channels)

    def forward(self, x: Tensor, adj: Tensor, return_hidden: bool = False) -> Tensor | tuple[Tensor, Tensor]:
        """``x [n, F]`` -> logits ``[n, C]`` (and the propagated features ``[n, F]``)."""
        hidden = propagate(x, adj, self.hops)[-1] if self.hops > 0 else x
        logits = self.linear(hidden)
        return (hidden, logits) if return_hidden else logits


class SSGC(nn.Module):
    """S²GC (Zhu & Koniusz, ICLR 2021): ``logits = (α x + (1-α)/K Σ_{k=1..K} Â^k x) W``
    (the definition of PyG's ``SSGConv``; paper defaults K = 16, α = 0.05)."""

    def __init__(self, in_channels: int, hidden: int, out_channels: int, hops: int = 16,
                 alpha: float = 0.05, **_unused) -> None:
        super().__init__()
        self.hops, self.alpha = hops, alpha
        self.linear = nn.Linear(in_channels, out_channels)

    def forward(self, x: Tensor, adj: Tensor, return_hidden: bool = False) -> Tensor | tuple[Tensor, Tensor]:
        """``x [n, F]`` -> logits ``[n, C]`` (and the smoothed features ``[n, F]``)."""
        hidden = self.alpha * x
        if self.hops > 0:
            hidden = hidden + (1 - self.alpha) * sum(propagate(x, adj, self.hops)) / self.hops
        logits = self.linear(hidden)
        return (hidden, logits) if return_hidden else logits


class APPNPNet(nn.Module):
    """APPNP (Gasteiger et al., ICLR 2019): a 2-layer MLP ``F -> hidden -> C`` then K steps
    of personalised-PageRank propagation ``z <- (1-α) Â z + α h`` (PyG's ``APPNP`` layer on
    the already normalised ``adj``; paper defaults K = 10, α = 0.1)."""

    def __init__(self, in_channels: int, hidden: int, out_channels: int, hops: int = 10,
                 alpha: float = 0.1, dropout: float = 0.5, **_unused) -> None:
        super().__init__()
        from torch_geometric.nn import APPNP

        self.lin1, self.lin2 = nn.Linear(in_channels, hidden), nn.Linear(hidden, out_channels)
        self.propagation = APPNP(K=hops, alpha=alpha, normalize=False)
        self.dropout = dropout

    def forward(self, x: Tensor, adj: Tensor, return_hidden: bool = False) -> Tensor | tuple[Tensor, Tensor]:
        """``x [n, F]`` -> logits ``[n, C]`` (and the MLP's hidden layer ``[n, hidden]``)."""
        x = F.dropout(x, p=self.dropout, training=self.training)
        hidden = F.dropout(F.relu(self.lin1(x)), p=self.dropout, training=self.training)
        logits = self.propagation(self.lin2(hidden), adj)
        return (hidden, logits) if return_hidden else logits


MODELS: dict[str, type[nn.Module]] = {"gcn": GCN, "sgc": SGC, "ssgc": SSGC, "appnp": APPNPNet, "mlp": MLP}


def build_model(config: ModelConfig, in_channels: int, num_classes: int) -> nn.Module:
    """Instantiate the architecture named by ``config.arch`` (decoupled models take
    ``hops``/``alpha`` when set, else their own defaults)."""
    if config.arch not in MODELS:
        raise ConfigError(f"unknown model.arch {config.arch!r}; valid architectures: {sorted(MODELS)}")
    if config.arch in ("gcn", "mlp"):
        if config.hops is not None or config.alpha is not None:
            raise ConfigError(f"model.hops and model.alpha apply to 'sgc', 'ssgc' and 'appnp', not "
                              f"{config.arch!r}; use model.layers for the depth")
        return MODELS[config.arch](in_channels, config.hidden, num_classes, layers=config.layers,
                                   dropout=config.dropout, readout=config.readout)
    extra = {key: value for key, value in (("hops", config.hops), ("alpha", config.alpha)) if value is not None}
    if config.arch == "sgc" and "alpha" in extra:
        raise ConfigError("model.alpha is not a parameter of model.arch 'sgc'; remove it")
    return MODELS[config.arch](in_channels, config.hidden, num_classes, dropout=config.dropout, **extra)
