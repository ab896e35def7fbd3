"""Model zoo shared by every method.

Models take node features and a graph operator: ``forward(x, adj)`` with ``x`` of shape
``[n, F]`` and ``adj`` the client's GCN-normalised sparse adjacency ``[n, n]`` (self-loops
included, see :class:`fglrepro.fl.clients.ClientData`), and return logits ``[n, C]``.
``forward(x, adj, return_hidden=True)`` returns ``(hidden, logits)``; with ``readout: true``
every architecture is an encoder to ``[n, hidden]`` (ReLU and dropout after each layer)
followed by the linear head ``model.readout`` (``hidden`` is the head's input).

GAT, GraphSAGE and GIN wrap PyG's layers (imported when such a model is built) and read the
edges from the sparsity pattern of ``adj`` (:func:`edge_index_of`); GAT also takes a weighted
graph, :class:`WeightedEdges`, in place of ``adj``.

Fast kernels (:func:`set_fast_kernels`, off by default; ``fgl-train`` turns them on unless
``train.engine`` is ``sequential``): every architecture's first layer multiplies sparse
bag-of-words features (:func:`sparse_rows`: density below :data:`SPARSE_BELOW`, no gradient)
by its weight as a sparse product (:func:`feature_linear`), GraphSAGE and GIN aggregate their
first layer after its linear map where that is narrower (:meth:`PyGNet.projects_first`), SGC /
S²GC keep the propagated features of an unchanged input (:func:`propagated`), and local
optimisers take torch's fused kernel (:func:`fglrepro.fl.training.make_optimizer`). Features
stay dense tensors for the methods; the sparse form is built once per tensor and kept while it
lives unmodified. Off, every model computes exactly the dense operations it always did. Fast
dropout (:func:`set_fast_dropout`, also on unless ``sequential``) draws the masks of
:func:`dropout` with :func:`bernoulli_mask`: the same distribution from other random numbers.
"""

from __future__ import annotations

import contextlib
import math
import sys
import weakref
from dataclasses import dataclass
from typing import Callable, Iterator, TypeVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fglrepro.config import ConfigError, ModelConfig
from fglrepro.sparse import SparseRows, is_symmetric, sparse_matmul, symmetric_propagation

#: Features whose share of non-zero entries is below this are multiplied as sparse rows (the
#: vectorised engine's threshold, :meth:`fglrepro.fl.engine.ClientBatch.of`).
SPARSE_BELOW = 0.1

_fast_kernels = False
_fast_dropout = False


def set_fast_kernels(enabled: bool) -> None:
    """Switch the fast kernels (sparse first-layer products, cached propagation, fused local
    optimisers) on or off for the whole process. Their results equal the dense operations' up
    to float rounding."""
    global _fast_kernels
    _fast_kernels = bool(enabled)


def fast_kernels_enabled() -> bool:
    """Whether the fast kernels are on (:func:`set_fast_kernels`)."""
    return _fast_kernels


def set_fast_dropout(enabled: bool) -> None:
    """Switch :func:`dropout`'s masks between torch's ``F.dropout`` (off) and
    :func:`bernoulli_mask` (on) for the whole process: the same Bernoulli distribution, several
    times faster on CPU, but other random numbers, so runs differ from those with it off."""
    global _fast_dropout
    _fast_dropout = bool(enabled)


def fast_dropout_enabled() -> bool:
    """Whether fast dropout is on (:func:`set_fast_dropout`)."""
    return _fast_dropout


def bernoulli_mask(shape: tuple[int, ...], keep: float, device: torch.device) -> Tensor:
    """Boolean ``shape`` of independent Bernoulli(``keep``) draws, ``keep`` rounded to a
    multiple of 2^-16: each of the three low 16-bit words of a random 63-bit integer is one
    draw, ten times faster on CPU than ``torch.bernoulli``, which draws one number per element."""
    n = math.prod(shape)
    words = torch.empty((n + 2) // 3, dtype=torch.int64, device=device).random_()
    low = slice(0, 3) if sys.byteorder == "little" else slice(1, 4)  # the top word has 15 random bits
    draws = words.view(torch.int16).view(-1, 4)[:, low].reshape(-1)[:n]
    return (draws < round(keep * 65536) - 32768).view(shape)


def bernoulli_dropout(x: Tensor, p: float) -> Tensor:
    """Training-mode dropout of ``x [*]`` with a :func:`bernoulli_mask` of keep probability
    ``1 - p``: kept entries scaled by ``1 / (1 - p)``, the others 0."""
    keep = 1.0 - p
    return x * (bernoulli_mask(x.shape, keep, x.device) / keep)


def dropout(x: Tensor, p: float, training: bool) -> Tensor:
    """``F.dropout(x, p, training)`` ``[*] -> [*]``; with fast dropout on (:func:`set_fast_dropout`)
    :func:`bernoulli_dropout`."""
    if not (_fast_dropout and training) or p == 0:
        return F.dropout(x, p=p, training=training)
    return bernoulli_dropout(x, p)


@contextlib.contextmanager
def fast_kernels(enabled: bool = True) -> Iterator[None]:
    """:func:`set_fast_kernels` for the duration of a ``with`` block (restored after)."""
    previous = _fast_kernels
    set_fast_kernels(enabled)
    try:
        yield
    finally:
        set_fast_kernels(previous)


@contextlib.contextmanager
def fast_dropout(enabled: bool = True) -> Iterator[None]:
    """:func:`set_fast_dropout` for the duration of a ``with`` block (restored after)."""
    previous = _fast_dropout
    set_fast_dropout(enabled)
    try:
        yield
    finally:
        set_fast_dropout(previous)


T = TypeVar("T")


class _TensorMemo:
    """Values computed from tensors, each kept while all its source tensors live and none has
    been modified in place (same version counter): ``key + ids of the sources -> (weak
    references, versions, value)``; an entry leaves when one of its sources dies. Values must
    not reference their sources (they would never die)."""

    def __init__(self) -> None:
        self._entries: dict[tuple, tuple[list[weakref.ref], list[int], object]] = {}

    def get(self, key: tuple, sources: tuple[Tensor, ...], compute: Callable[[], T]) -> T:
        """``compute()``, or its value from an earlier call on the same unchanged ``sources``
        (inference tensors have no version counter and are not cached)."""
        if any(t.is_inference() for t in sources):
            return compute()
        ident = key + tuple(id(t) for t in sources)
        versions = [t._version for t in sources]
        entry = self._entries.get(ident)
        if entry is not None and entry[1] == versions and all(r() is t for r, t in zip(entry[0], sources)):
            return entry[2]
        value = compute()
        refs = [weakref.ref(t, lambda _, ident=ident: self._entries.pop(ident, None)) for t in sources]
        self._entries[ident] = (refs, versions, value)
        return value


_MEMO = _TensorMemo()


def sparse_rows(x: Tensor) -> SparseRows | None:
    """The sparse form of the features ``x [n, F]`` when the fast kernels are on, ``x`` does
    not require gradient and fewer than :data:`SPARSE_BELOW` of its entries are non-zero;
    otherwise ``None``. Decided and built once per tensor (kept while it lives unmodified)."""
    if not _fast_kernels or x.requires_grad or x.dim() != 2 or x.layout != torch.strided or not x.is_floating_point():
        return None

    def build() -> SparseRows | None:
        return SparseRows.of(x) if 0 < x.numel() and x.count_nonzero() < SPARSE_BELOW * x.numel() else None

    return _MEMO.get(("sparse rows",), (x,), build)


def share_sparsity(derived: Tensor, source: Tensor) -> Tensor:
    """Declare that ``derived [n, F]``'s non-zeros lie where ``source``'s do (a masked or
    dropped-out copy of it): with the fast kernels on and ``source`` sparse, ``derived``'s
    sparse form is read off ``source``'s pattern instead of a scan of every entry. Returns
    ``derived``; a non-zero outside ``source``'s pattern would be lost, hence the contract."""
    if derived is source or derived.shape != source.shape or derived.requires_grad or derived.is_inference():
        return derived
    pattern = sparse_rows(source)
    if pattern is not None:
        _MEMO.get(("sparse rows",), (derived,), lambda: pattern.with_values_of(derived))
    return derived


def feature_linear(x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """``F.linear(x, weight, bias)``: ``x [n, F]``, ``weight [H, F]`` -> ``[n, H]``; a sparse
    product when :func:`sparse_rows` gives ``x``'s sparse form (a model's first layer)."""
    rows = sparse_rows(x)
    if rows is None or rows.values.dtype != weight.dtype:
        return F.linear(x, weight, bias)
    out = sparse_matmul(rows, weight.t().contiguous())
    return out if bias is None else out + bias


def propagated(key: tuple, x: Tensor, adj: Tensor, compute: Callable[[], Tensor]) -> Tensor:
    """``compute()``, a propagation of ``x`` over ``adj`` named by ``key``; with the fast
    kernels on and neither input requiring gradient, kept while both live unmodified."""
    if not _fast_kernels or x.requires_grad or adj.requires_grad:
        return compute()
    return _MEMO.get(key, (x, adj), compute)


class _Weight(nn.Module):
    """Holds ``weight [out, in]`` under the name of PyG's bias-free ``Linear`` inside
    ``GCNConv`` (and ``GATConv``); calling it is :func:`feature_linear` ``[n, in] -> [n, out]``."""

    def __init__(self, in_channels: int, out_channels: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(out_channels, in_channels))

    def forward(self, x: Tensor) -> Tensor:
        return feature_linear(x, self.weight)


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
        return propagate_once(adj, feature_linear(x, self.lin.weight)) + self.bias


def propagate_once(adj: Tensor, h: Tensor) -> Tensor:
    """``adj @ h`` for a sparse CSR or dense (differentiable) operator ``adj [n, n]``, ``h [n, d]``.
    With the fast kernels on, a symmetric CSR ``adj`` (checked once per tensor) passes the
    gradient as ``adj @ G`` (:func:`~fglrepro.sparse.symmetric_propagation`) instead of
    transposing itself in every backward pass: the transposed arrays are its own, so the
    values are the same bit for bit."""
    if adj.layout != torch.sparse_csr:
        return adj @ h
    if _fast_kernels and h.requires_grad and not adj.requires_grad and symmetric(adj):
        return symmetric_propagation(adj, h)
    return torch.sparse.mm(adj, h)


def symmetric(adj: Tensor) -> bool:
    """:func:`~fglrepro.sparse.is_symmetric` of the sparse CSR ``adj``, kept while it lives unmodified."""
    return _MEMO.get(("symmetric",), (adj,), lambda: is_symmetric(adj))


class ConvStack(nn.Module):
    """``layers`` graph convolutions with ReLU and dropout between them, optionally followed
    by a linear head (READOUT), and with jumping knowledge (Xu et al., ICML 2018) over the
    layers' outputs.

    Without readout the last convolution outputs class logits. With ``readout`` every
    convolution outputs ``hidden`` channels with ReLU and dropout, and ``readout`` (a linear
    layer) maps them, or with ``jk`` their combination over layers (``max``: element-wise
    maximum, ``[n, hidden]``; ``cat``: concatenation, ``[n, layers * hidden]``), to logits.
    Subclasses build ``convs`` and say what the convolutions take as graph (:meth:`graph`).
    """

    def __init__(self, convs: nn.ModuleList, hidden: int, out_channels: int, dropout: float,
                 readout: bool, jk: str | None = None) -> None:
        super().__init__()
        self.convs = convs
        width = hidden * (len(convs) if jk == "cat" else 1)
        self.readout = nn.Linear(width, out_channels) if readout else None
        self.layers, self.hidden, self.dropout, self.jk = len(convs), hidden, dropout, jk

    def graph(self, adj: Tensor):
        """What each convolution takes besides the features (the operator itself by default)."""
        return adj

    def convolve(self, i: int, x: Tensor, graph) -> Tensor:
        """Convolution ``i`` of the features ``x`` (``convs[i](x, graph)``)."""
        return self.convs[i](x, graph)

    def forward(self, x: Tensor, adj: Tensor, return_hidden: bool = False) -> Tensor | tuple[Tensor, Tensor]:
        """``x [n, F]``, ``adj [n, n]`` sparse normalised -> logits ``[n, C]``.

        With ``return_hidden`` also returns the input of the last layer ``[n, hidden]``
        (the node representation used by contrastive methods): ``(hidden, logits)``.
        """
        graph = self.graph(adj)
        hidden, outputs = x, []
        for i in range(len(self.convs)):
            if i == len(self.convs) - 1:
                hidden = x
            x = self.convolve(i, x, graph)
            if i < len(self.convs) - 1 or self.readout is not None:
                x = dropout(F.relu(x), self.dropout, self.training)
                outputs.append(x)
        if self.jk is not None:
            x = torch.cat(outputs, dim=-1) if self.jk == "cat" else torch.stack(outputs).amax(dim=0)
        if self.readout is not None:
            hidden = x
            x = self.readout(x)
        return (hidden, x) if return_hidden else x


def _widths(in_channels: int, hidden: int, out_channels: int, layers: int, readout: bool) -> list[int]:
    """Channel sizes ``[F, hidden, ..., hidden or C]`` of ``layers`` stacked convolutions."""
    if layers < 1:
        raise ConfigError(f"model.layers must be >= 1, got {layers}")
    return [in_channels] + [hidden] * (layers - 1) + [hidden if readout else out_channels]


class GCN(ConvStack):
    """``layers``-layer GCN (Kipf & Welling), optionally followed by a linear READOUT, and
    with ``jk`` a deep GCN with jumping knowledge (JKNet; needs ``readout``), see
    :class:`ConvStack`. The FED-PUB / FedGKD model is ``readout=True``.

    Args:
        in_channels: F, input feature size.
        hidden: width of hidden layers.
        out_channels: C, number of classes.
        layers: number of GCN layers (>= 1).
        dropout: dropout probability applied to hidden representations.
        readout: append a linear classifier after the GCN layers.
        jk: ``None``, ``"max"`` or ``"cat"``: combine every layer's output before the readout.
    """

    def __init__(
        self, in_channels: int, hidden: int, out_channels: int, layers: int = 2,
        dropout: float = 0.5, readout: bool = False, jk: str | None = None,
    ) -> None:
        widths = _widths(in_channels, hidden, out_channels, layers, readout)
        convs = nn.ModuleList(GCNLayer(a, b) for a, b in zip(widths[:-1], widths[1:]))
        super().__init__(convs, hidden, out_channels, dropout, readout, jk)


def edge_index_of(adj: Tensor) -> Tensor:
    """Edges ``[2, E]`` (source, target) of the operator ``adj [n, n]``: every non-zero
    ``adj[i, j]`` off the diagonal is an edge ``j -> i`` (node i aggregates node j, as in
    ``adj @ x``). The diagonal is left out: :func:`~fglrepro.fl.clients.normalized_adjacency`
    puts a self-loop on every node, and GAT adds its own. Computed once per sparse operator
    (cached while it lives unmodified); a dense operator is read each call."""
    if adj.layout != torch.sparse_csr:
        target, source = adj.detach().nonzero().t()
        keep = source != target
        return torch.stack([source[keep], target[keep]])

    def edges() -> Tensor:
        crow = adj.crow_indices()
        target = torch.repeat_interleave(torch.arange(crow.numel() - 1, device=crow.device), crow.diff())
        source = adj.col_indices()
        keep = source != target
        return torch.stack([source[keep], target[keep]])

    return _MEMO.get(("edges",), (adj,), edges)


@dataclass(frozen=True)
class WeightedEdges:
    """A weighted graph as a model that reads edges takes it instead of the normalised
    operator ``adj``: ``edge_index [2, E]`` (source, target; no self-loops) and positive
    ``weight [E]``. Only GAT uses the weights (:class:`fglrepro.weighted_gat.WeightedGATConv`); see
    :attr:`PyGNet.takes_edge_weights`."""

    edge_index: Tensor
    weight: Tensor

    @classmethod
    def of_dense(cls, weights: Tensor) -> WeightedEdges:
        """The non-zero off-diagonal entries of ``weights [n, n]``: ``weights[i, j]`` is an edge
        ``j -> i`` (node i aggregates node j, as :func:`edge_index_of`)."""
        target, source = weights.nonzero().t()
        keep = source != target
        target, source = target[keep], source[keep]
        return cls(torch.stack([source, target]), weights[target, source])


def _pyg_conv(arch: str, in_channels: int, out_channels: int, first: bool) -> nn.Module:
    """One PyG convolution ``[n, in] -> [n, out]``: ``GATConv`` (one head, OpenFGL's GAT; it
    also takes edge weights, :class:`~fglrepro.weighted_gat.WeightedGATConv`), ``SAGEConv`` (mean aggregation and
    root weight) or ``GINConv`` whose MLP is ``Linear(in, out) -> ReLU -> Linear(out, out)``
    (eps = 0, PyG's GIN model). The ``first`` GAT layer holds its (same, bias-free) weight
    ``lin.weight`` in a :class:`_Weight`, whose product is sparse on sparse features."""
    from torch_geometric.nn import GINConv, SAGEConv

    if arch == "gat":
        from fglrepro.weighted_gat import WeightedGATConv

        conv = WeightedGATConv(in_channels, out_channels)
        if first:
            holder = _Weight(in_channels, out_channels)
            holder.weight = conv.lin.weight
            conv.lin = holder
        return conv
    if arch == "sage":
        return SAGEConv(in_channels, out_channels)
    mlp = nn.Sequential(nn.Linear(in_channels, out_channels), nn.ReLU(), nn.Linear(out_channels, out_channels))
    return GINConv(mlp)


class PyGNet(ConvStack):
    """``layers`` PyG convolutions of architecture ``arch`` (``gat``: GAT, Veličković et al.,
    ICLR 2018; ``sage``: GraphSAGE-mean, Hamilton et al., NeurIPS 2017; ``gin``: GIN, Xu
    et al., ICLR 2019), with ReLU and dropout between layers and optional READOUT as
    :class:`GCN`. They take the unweighted edges of ``adj`` (:func:`edge_index_of`); GAT
    also takes a :class:`WeightedEdges` graph instead (:attr:`takes_edge_weights`)."""

    def __init__(self, arch: str, in_channels: int, hidden: int, out_channels: int, layers: int = 2,
                 dropout: float = 0.5, readout: bool = False) -> None:
        widths = _widths(in_channels, hidden, out_channels, layers, readout)
        convs = nn.ModuleList(_pyg_conv(arch, a, b, first=i == 0)
                              for i, (a, b) in enumerate(zip(widths[:-1], widths[1:])))
        super().__init__(convs, hidden, out_channels, dropout, readout)
        self.arch = arch
        self.first_narrows = widths[1] < widths[0]

    @property
    def takes_edge_weights(self) -> bool:
        """Whether ``forward`` takes a :class:`WeightedEdges` graph in place of ``adj`` (GAT)."""
        return self.arch == "gat"

    def graph(self, adj: Tensor | WeightedEdges) -> Tensor | WeightedEdges:
        if isinstance(adj, WeightedEdges):
            if not self.takes_edge_weights:
                raise ConfigError(f"model.arch {self.arch!r} takes no edge weights; only 'gat' does")
            return adj
        return edge_index_of(adj)

    def projects_first(self, i: int, x: Tensor) -> bool:
        """Whether convolution ``i`` (GraphSAGE, GIN) applies its first linear map before
        aggregating (:meth:`convolve`): the first layer with the fast kernels on, on sparse
        features (:func:`sparse_rows`: a sparse product) or on dense ones it narrows
        (``out < F``: PyG would gather an ``[E, F]`` message per edge, this an ``[E, out]`` one)."""
        if i > 0 or self.arch == "gat" or not _fast_kernels:
            return False
        return self.first_narrows or sparse_rows(x) is not None

    def convolve(self, i: int, x: Tensor, graph: Tensor | WeightedEdges) -> Tensor:
        r"""Convolution ``i``; where :meth:`projects_first`, GraphSAGE and GIN apply their first
        linear map before aggregating, at width ``out`` instead of ``F``: the mean and the sum
        over neighbours commute with it,

        .. math:: \mathrm{SAGE}: \ \mathrm{mean}_j(x_j W_l^\top) + b_l + x W_r^\top, \qquad
                  \mathrm{GIN}: \ \mathrm{MLP}_{>1}\big(\textstyle\sum_j x_j W^\top + (1+\epsilon) x W^\top + b\big),

        with PyG's own aggregation (``conv.propagate``) and parameters: the same values up to
        float rounding."""
        conv = self.convs[i]
        if isinstance(graph, WeightedEdges):
            return conv(x, graph.edge_index, edge_attr=graph.weight.log())
        if not self.projects_first(i, x):
            return conv(x, graph)
        if self.arch == "sage":
            neighbours = feature_linear(x, conv.lin_l.weight)
            out = conv.propagate(graph, x=(neighbours, neighbours)) + conv.lin_l.bias
            return out + feature_linear(x, conv.lin_r.weight, conv.lin_r.bias)
        first, rest = conv.nn[0], conv.nn[1:]
        h = feature_linear(x, first.weight)
        return rest(conv.propagate(graph, x=(h, h)) + (1 + conv.eps) * h + first.bias)


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
            x = feature_linear(x, lin.weight, lin.bias) if i == 0 else lin(x)
            if i < len(self.lins) - 1 or self.readout is not None:
                x = dropout(F.relu(x), self.dropout, self.training)
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

    With ``readout`` it is an encoder -> head model as the others of the zoo:
    ``hidden = dropout(ReLU(Â^K x W_1))`` ``[n, hidden]``, ``logits = readout(hidden)``.
    Without it ``hidden`` and ``dropout`` are unused (``layers`` always is).

    With the fast kernels on, sparse features are multiplied first, ``Â^K (x W^T) + b`` (the
    propagation at width ``out`` instead of ``F``; unless the propagated features ``[n, F]``
    are returned), and dense ones are propagated once per unchanged ``(x, adj)`` pair.
    """

    def __init__(self, in_channels: int, hidden: int, out_channels: int, hops: int = 2, dropout: float = 0.5,
                 readout: bool = False, **_unused) -> None:
        super().__init__()
        self.hops, self.dropout = hops, dropout
        self.linear = nn.Linear(in_channels, hidden if readout else out_channels)
        self.readout = nn.Linear(hidden, out_channels) if readout else None

    def forward(self, x: Tensor, adj: Tensor, return_hidden: bool = False) -> Tensor | tuple[Tensor, Tensor]:
        """``x [n, F]`` -> logits ``[n, C]`` (and the propagated features ``[n, F]``, with
        readout the encoder's output ``[n, hidden]``)."""
        if self.hops > 0 and not (return_hidden and self.readout is None) and sparse_rows(x) is not None:
            hidden = None  # the propagated features are not returned
            logits = propagate(feature_linear(x, self.linear.weight), adj, self.hops)[-1] + self.linear.bias
        else:
            hidden = x if self.hops == 0 else propagated(("sgc", self.hops), x, adj,
                                                         lambda: propagate(x, adj, self.hops)[-1])
            logits = feature_linear(hidden, self.linear.weight, self.linear.bias)
        if self.readout is not None:
            hidden = dropout(F.relu(logits), self.dropout, self.training)
            logits = self.readout(hidden)
        return (hidden, logits) if return_hidden else logits


class SSGC(nn.Module):
    """S²GC (Zhu & Koniusz, ICLR 2021): ``logits = (α x + (1-α)/K Σ_{k=1..K} Â^k x) W``
    (the definition of PyG's ``SSGConv``; paper defaults K = 16, α = 0.05). With the fast
    kernels on the smoothed features are computed once per unchanged ``(x, adj)`` pair."""

    def __init__(self, in_channels: int, hidden: int, out_channels: int, hops: int = 16,
                 alpha: float = 0.05, **_unused) -> None:
        super().__init__()
        self.hops, self.alpha = hops, alpha
        self.linear = nn.Linear(in_channels, out_channels)

    def forward(self, x: Tensor, adj: Tensor, return_hidden: bool = False) -> Tensor | tuple[Tensor, Tensor]:
        """``x [n, F]`` -> logits ``[n, C]`` (and the smoothed features ``[n, F]``)."""
        hidden = propagated(("ssgc", self.hops, self.alpha), x, adj, lambda: self.smooth(x, adj))
        logits = feature_linear(hidden, self.linear.weight, self.linear.bias)
        return (hidden, logits) if return_hidden else logits

    def smooth(self, x: Tensor, adj: Tensor) -> Tensor:
        """``α x + (1-α)/K Σ_k Â^k x`` ``[n, F]``."""
        hidden = self.alpha * x
        if self.hops > 0:
            hidden = hidden + (1 - self.alpha) * sum(propagate(x, adj, self.hops)) / self.hops
        return hidden


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
        x = share_sparsity(dropout(x, self.dropout, self.training), x)
        hidden = dropout(F.relu(feature_linear(x, self.lin1.weight, self.lin1.bias)), self.dropout, self.training)
        logits = self.propagation(self.lin2(hidden), adj)
        return (hidden, logits) if return_hidden else logits


MODELS: dict[str, type[nn.Module]] = {"gcn": GCN, "sgc": SGC, "ssgc": SSGC, "appnp": APPNPNet, "gat": PyGNet,
                                      "sage": PyGNet, "gin": PyGNet, "mlp": MLP}
#: architectures with a READOUT option (``model.readout``).
READOUT_ARCHS = ("gcn", "gat", "sage", "gin", "sgc", "mlp")
JK_MODES = ("cat", "max")


def build_model(config: ModelConfig, in_channels: int, num_classes: int) -> nn.Module:
    """Instantiate the architecture named by ``config.arch`` (decoupled models take
    ``hops``/``alpha`` when set, else their own defaults)."""
    if config.arch not in MODELS:
        raise ConfigError(f"unknown model.arch {config.arch!r}; valid architectures: {sorted(MODELS)}")
    if config.jk is not None:
        if config.arch != "gcn" or config.jk not in JK_MODES:
            raise ConfigError(f"model.jk = {config.jk!r} (arch {config.arch!r}) is not valid: jumping knowledge "
                              f"is one of {list(JK_MODES)} for arch 'gcn'")
        if not config.readout:
            raise ConfigError("model.jk needs model.readout: true (the linear layer after the layers' combination)")
    if config.readout and config.arch not in READOUT_ARCHS:
        raise ConfigError(f"model.readout applies to {list(READOUT_ARCHS)}, not {config.arch!r}")
    if config.arch in ("gcn", "gat", "sage", "gin", "mlp"):
        if config.hops is not None or config.alpha is not None:
            raise ConfigError(f"model.hops and model.alpha apply to 'sgc', 'ssgc' and 'appnp', not {config.arch!r}; "
                              f"use model.layers for the depth of a {config.arch.upper()}")
        if config.arch == "gcn":
            return GCN(in_channels, config.hidden, num_classes, layers=config.layers, dropout=config.dropout,
                       readout=config.readout, jk=config.jk)
        if config.arch == "mlp":
            return MLP(in_channels, config.hidden, num_classes, layers=config.layers, dropout=config.dropout,
                       readout=config.readout)
        return PyGNet(config.arch, in_channels, config.hidden, num_classes, layers=config.layers,
                      dropout=config.dropout, readout=config.readout)
    extra = {key: value for key, value in (("hops", config.hops), ("alpha", config.alpha)) if value is not None}
    if config.arch == "sgc":
        if "alpha" in extra:
            raise ConfigError("model.alpha is not a parameter of model.arch 'sgc'; remove it")
        extra["readout"] = config.readout
    return MODELS[config.arch](in_channels, config.hidden, num_classes, dropout=config.dropout, **extra)


def hidden_width(config: ModelConfig) -> int | None:
    """Width of the embedding ``hidden`` a model of ``config`` returns before its linear
    head (``None`` without ``readout``: the input of its last layer, which varies)."""
    if not config.readout:
        return None
    return config.hidden * (config.layers if config.jk == "cat" else 1)
