"""Model-heterogeneous clients trained together, one batched computation per architecture.

The model-heterogeneous methods (FML, FedKD, FedGKC, FedTGP, FedProto, FedPPN, LG-FedAvg) give
every client modules of its own (a private model of any zoo architecture, a copy of a shared
model, a hidden map). Clients whose module of one role has the same architecture form a group
(client k gets zoo entry ``k mod 5``: five groups of private models; one group of shared
copies). Within a group every
parameter is stacked over the members (``[m, ...]``, weights transposed to ``[m, in, out]``
as in :class:`fglrepro.fl.engine.StackedGCN`), the members' graphs form one disjoint union
(:class:`~fglrepro.fl.engine.ClientBatch`: block-diagonal adjacency, client-stacked sparse
features), and each layer multiplies each client's nodes by its own weights, PyG's
``HeteroLinear`` / ``segment_matmul`` idea:

    first layer:  X_union W = [X_1 | ... | X_m]_stacked [W_1; ...; W_m]   (one sparse product),
    later layers: H W       = unpad(bmm(pad(H), [W_1, ..., W_m])),

message passing over the union's edges (edges never cross clients). Outputs come back in
the node order of the participants' union (client by client), so a method writes its loss
once on the union, each term reduced per client (:class:`PerClient`), and one step
differentiates the sum of the clients' losses: every client's gradient is the one it would
compute alone. Each client's modules keep views of their stack rows, so the methods'
per-client hooks (receive, upload, evaluation) read and write the stacks without copies.

Architectures: GCN (with readout, jumping knowledge or not), SGC (with readout), GAT (one head),
GraphSAGE (mean), GIN and bias-free or
biased ``nn.Linear`` (:func:`architecture_of`); any other module keeps the per-client path.
The grouped path runs with the fast kernels and fast dropout (``train.engine`` ``auto``,
:func:`grouped_enabled`); ``sequential`` keeps the per-client reference. Results equal the
per-client path's up to float rounding and the random numbers of dropout and perturbed views
(drawn per group rather than per client).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fglrepro.config import TrainConfig
from fglrepro.fl.clients import ClientData, normalized_adjacency
from fglrepro.fl.engine import ClientBatch, Remade, StackedOptimizer
from fglrepro.fl.losses import kl_divergence
from fglrepro.fl.training import check_finite
from fglrepro.models import (
    GCN,
    SGC,
    PyGNet,
    dropout,
    edge_index_of,
    fast_dropout_enabled,
    fast_kernels_enabled,
)
from fglrepro.sparse import SparseRows, is_symmetric, sparse_matmul, symmetric_propagation

#: Architectures with a grouped forward (:func:`architecture_of`).
GROUPED_ARCHS = ("gcn", "sgc", "gat", "sage", "gin", "linear")


def grouped_enabled() -> bool:
    """Whether methods take the grouped path: with the fast kernels and fast dropout both on
    (``train.engine`` not ``sequential``; the path draws its random numbers per group, as
    fast dropout draws other ones than the reference)."""
    return fast_kernels_enabled() and fast_dropout_enabled()


def architecture_of(module: nn.Module) -> str | None:
    """The grouped architecture of ``module`` (one of :data:`GROUPED_ARCHS`), or ``None``
    where it has no grouped forward (GCN/SGC without readout, MLP, APPNP, ...)."""
    if type(module) is nn.Linear:
        return "linear"
    if type(module) is GCN and module.readout is not None:
        return "gcn"
    if type(module) is SGC and module.readout is not None:
        return "sgc"
    if type(module) is PyGNet and module.readout is not None:
        if module.arch == "gin" and any(isinstance(conv.eps, nn.Parameter) for conv in module.convs):
            return None
        return module.arch
    return None


def _to_stack(name: str, value: Tensor) -> Tensor:
    """A parameter in stack layout: weights ``[out, in]`` -> ``[in, out]``."""
    return value.transpose(-1, -2) if name.endswith("weight") else value


@dataclass
class GraphView(Remade):
    """What a grouped forward reads of a group's union of ``N`` nodes; one made by :meth:`of` pickles
    as that call (:class:`~fglrepro.fl.engine.Remade`).

    Attributes:
        batch: the union (node order, client index ``batch.batch [N]``, padding).
        edge_index: ``[2, E]`` the off-diagonal edges ``source -> target`` of the graph.
        rows: client-stacked sparse features ``[N, m * F]`` (sparse inputs), else ``None``.
        x_pad: ``[m, n_max, F]`` padded dense features (dense inputs), else ``None``.
        kept: ``[2, E']`` the edges of a perturbed view (``None``: the union's own graph).
        _adj: ``(A, whether A is symmetric)``, the view's normalised adjacency (:meth:`propagate`).
    """

    batch: ClientBatch
    edge_index: Tensor
    rows: SparseRows | None
    x_pad: Tensor | None
    kept: Tensor | None = None
    _adj: tuple[Tensor, bool] | None = None

    @classmethod
    def of(cls, batch: ClientBatch) -> "GraphView":
        """The union as it is."""
        view = cls(batch, edge_index_of(batch.adj), batch.stacked, batch.x_pad,
                    _adj=(batch.adj, is_symmetric(batch.adj)))
        view._recipe = (cls.of, (batch,))
        return view

    def propagate(self, h: Tensor) -> Tensor:
        """``A h`` ``[N, d]`` with the normalised adjacency ``A`` (self-loops included) of the
        view's graph: the union's (when symmetric, :func:`~fglrepro.sparse.symmetric_propagation`) or,
        built on first use, the perturbed view's (:func:`~fglrepro.fl.clients.normalized_adjacency`
        of the kept edges, as the per-client path builds it)."""
        if self._adj is None:
            self._adj = (normalized_adjacency(self.kept, self.batch.batch.numel()), False)
        adj, symmetric = self._adj
        return symmetric_propagation(adj, h) if symmetric else torch.sparse.mm(adj, h)

    def perturbed(self, union_edges: Tensor, edge_drop: float, feature_mask: float) -> "GraphView":
        """A fresh random view (:func:`fglrepro.fl.augment.perturbed_view` for every client of
        the union at once): each directed edge of ``union_edges [2, E]`` removed with
        probability ``edge_drop``, each client's feature columns zeroed with probability
        ``feature_mask`` (its own columns)."""
        batch = self.batch
        kept = union_edges[:, torch.rand(union_edges.size(1), device=union_edges.device) >= edge_drop]
        num_features = batch.x.size(1)
        keep = (torch.rand(batch.num_clients, num_features, device=batch.x.device) >= feature_mask).to(batch.x.dtype)
        rows = x_pad = None
        if self.rows is not None:
            rows = SparseRows(self.rows.rows, self.rows.columns, self.rows.values * keep.view(-1)[self.rows.columns],
                              self.rows.offsets, self.rows.shape, _pattern=self.rows)
        else:
            x_pad = self.x_pad * keep.unsqueeze(1)
        edge_index = kept[:, kept[0] != kept[1]]
        return GraphView(batch, edge_index, rows, x_pad, kept=kept)


def _first(view: GraphView, weight: Tensor) -> Tensor:
    """``[N, F] -> [N, out]`` with each client's weight ``weight [m, F, out]``."""
    if view.rows is not None:
        return sparse_matmul(view.rows, weight.reshape(-1, weight.size(-1)))
    return view.batch.unpad(torch.bmm(view.x_pad, weight))


def _linear(h: Tensor, weight: Tensor, view: GraphView, bias: Tensor | None = None) -> Tensor:
    """``[N, in] -> [N, out]`` with client-stacked ``weight [m, in, out]`` and ``bias [m, out]``."""
    batch = view.batch
    if batch.num_clients == 1:
        return h @ weight[0] if bias is None else torch.addmm(bias[0], h, weight[0])
    padded = batch.pad(h)
    out = torch.bmm(padded, weight) if bias is None else torch.baddbmm(bias.unsqueeze(1), padded, weight)
    return batch.unpad(out)


def _per_node(values: Tensor, view: GraphView) -> Tensor:
    """Client-stacked ``values [m, d]`` as ``[N, d]`` (each node its client's row)."""
    return values.index_select(0, view.batch.batch)


def _layer(i: int, h: Tensor, weight: Tensor, view: GraphView) -> Tensor:
    return _first(view, weight) if i == 0 else _linear(h, weight, view)


def _sum_neighbours(h: Tensor, edge_index: Tensor) -> Tensor:
    """``[N, d]``: sum of ``h`` over the sources of each node's incoming edges."""
    source, target = edge_index
    return torch.zeros_like(h).index_add_(0, target, h.index_select(0, source))


def _gat(i: int, h: Tensor, p: dict[str, Tensor], view: GraphView) -> Tensor:
    """PyG ``GATConv`` (one head, self-loops added, LeakyReLU 0.2, no attention dropout)."""
    z = _layer(i, h, p["lin.weight"], view)
    att = _per_node(torch.cat([p["att_src"].flatten(1), p["att_dst"].flatten(1)], dim=1), view)
    width = z.size(1)
    score_src = (z * att[:, :width]).sum(-1)
    score_dst = (z * att[:, width:]).sum(-1)
    loops = torch.arange(z.size(0), device=z.device)
    source, target = (torch.cat([e, loops]) for e in view.edge_index)
    score = F.leaky_relu(score_src.index_select(0, source) + score_dst.index_select(0, target), 0.2)
    top = torch.full_like(score_src, float("-inf")).scatter_reduce(0, target, score.detach(), "amax")
    weight = (score - top.index_select(0, target)).exp()
    total = torch.zeros_like(top).index_add_(0, target, weight)
    alpha = weight / (total.index_select(0, target) + 1e-16)
    messages = z.index_select(0, source) * alpha.unsqueeze(1)
    return torch.zeros_like(z).index_add_(0, target, messages) + _per_node(p["bias"], view)


def _sage(i: int, h: Tensor, p: dict[str, Tensor], view: GraphView) -> Tensor:
    """PyG ``SAGEConv`` (mean aggregation, root weight): ``mean_j(x_j W_l) + b_l + x W_r``."""
    target = view.edge_index[1]
    neighbours = _sum_neighbours(_layer(i, h, p["lin_l.weight"], view), view.edge_index)
    count = torch.zeros(neighbours.size(0), device=neighbours.device).index_add_(
        0, target, torch.ones_like(target, dtype=neighbours.dtype)).clamp_(min=1)
    root = _layer(i, h, p["lin_r.weight"], view)
    return neighbours / count.unsqueeze(1) + _per_node(p["lin_l.bias"], view) + root


def _gin(i: int, h: Tensor, p: dict[str, Tensor], view: GraphView, eps: float) -> Tensor:
    """PyG ``GINConv`` with MLP ``Linear -> ReLU -> Linear``: ``MLP((1 + eps) x + sum_j x_j)``,
    the first linear map applied before the sum (they commute)."""
    z = _layer(i, h, p["nn.0.weight"], view)
    z = _sum_neighbours(z, view.edge_index) + (1 + eps) * z + _per_node(p["nn.0.bias"], view)
    return _linear(F.relu(z), p["nn.2.weight"], view, p["nn.2.bias"])


def _gcn(i: int, h: Tensor, p: dict[str, Tensor], view: GraphView) -> Tensor:
    """:class:`~fglrepro.models.GCNLayer`: ``A (x W) + b``."""
    return view.propagate(_layer(i, h, p["lin.weight"], view)) + _per_node(p["bias"], view)


class GroupedArchitecture:
    """The functional forward of one architecture over client-stacked parameters, as the
    module ``template`` computes it (``return_hidden=True``: the head's input ``[N, d]`` and
    the logits ``[N, C]``)."""

    def __init__(self, template: nn.Module) -> None:
        self.arch = architecture_of(template)
        if self.arch is None:
            raise ValueError(f"{type(template).__name__} has no grouped forward")
        self.names = [name for name, _ in template.named_parameters()]
        self.dropout = getattr(template, "dropout", 0.0)
        self.num_convs = len(template.convs) if hasattr(template, "convs") else 0
        self.hops = getattr(template, "hops", 0)
        self.eps = [float(conv.eps) for conv in template.convs] if self.arch == "gin" else []
        self.jk = getattr(template, "jk", None)

    def forward(self, stacks: list[Tensor], view: GraphView, training: bool) -> tuple[Tensor, Tensor]:
        """``(hidden [N, d], logits [N, C])`` of every client of ``view``'s union with its own
        parameters ``stacks`` (``[m, ...]`` each, stack layout)."""
        p = dict(zip(self.names, stacks))
        if self.arch == "sgc":
            h = _first(view, p["linear.weight"])
            for _ in range(self.hops):
                h = view.propagate(h)
            hidden = dropout(F.relu(h + _per_node(p["linear.bias"], view)), self.dropout, training)
        else:
            hidden, outputs = None, []
            for i in range(self.num_convs):
                layer = {k.split(".", 2)[2]: v for k, v in p.items() if k.startswith(f"convs.{i}.")}
                if self.arch == "gin":
                    hidden = _gin(i, hidden, layer, view, self.eps[i])
                else:
                    hidden = {"gcn": _gcn, "gat": _gat, "sage": _sage}[self.arch](i, hidden, layer, view)
                hidden = dropout(F.relu(hidden), self.dropout, training)
                outputs.append(hidden)
            if self.jk == "cat":
                hidden = torch.cat(outputs, dim=-1)
            elif self.jk == "max":
                hidden = torch.stack(outputs).amax(dim=0)
        return hidden, _linear(hidden, p["readout.weight"], view, p["readout.bias"])


class PerClient:
    """Loss terms reduced per client: each term of ``n'`` nodes (a node subset of a union,
    ``client [n']`` the position of each node's client, ``m`` clients) gives ``[m]`` values,
    each client's mean over its own nodes, as :class:`WholeGraph` gives it for one client."""

    def __init__(self, client: Tensor, num_clients: int) -> None:
        self.client, self.num_clients = client, num_clients
        self.counts = torch.bincount(client, minlength=num_clients).clamp_min(1)

    def sum(self, values: Tensor) -> Tensor:
        """``[m]`` per-client sums of ``values [n']``."""
        return values.new_zeros(self.num_clients).index_add(0, self.client, values)

    def mean(self, values: Tensor) -> Tensor:
        """``[m]`` per-client means of ``values [n']``."""
        return self.sum(values) / self.counts

    def cross_entropy(self, logits: Tensor, labels: Tensor) -> Tensor:
        """``F.cross_entropy`` per client, ``logits [n', C]``, ``labels [n']``."""
        return self.mean(F.cross_entropy(logits, labels, reduction="none"))

    def kl(self, target_logits: Tensor, input_logits: Tensor) -> Tensor:
        """:func:`~fglrepro.fl.losses.kl_divergence` (``batchmean``) per client."""
        return self.mean(kl_divergence(target_logits, input_logits, reduction="none").sum(-1))

    def mse(self, input: Tensor, target: Tensor) -> Tensor:
        """``F.mse_loss`` (mean over entries) per client, ``[n', d]`` inputs."""
        return self.mean(F.mse_loss(input, target, reduction="none").sum(-1)) / input.size(1)


class WholeGraph:
    """The loss terms of one client as the per-client path computes them (scalars):
    ``F.cross_entropy``, :func:`~fglrepro.fl.losses.kl_divergence`, ``F.mse_loss``."""

    cross_entropy = staticmethod(F.cross_entropy)
    kl = staticmethod(kl_divergence)
    mse = staticmethod(F.mse_loss)


WHOLE_GRAPH = WholeGraph()


@dataclass
class _Group:
    """Members (federation ids, ascending) of one architecture and their stacked parameters
    (``arch`` ``None`` for a linear map)."""

    arch: GroupedArchitecture | None
    members: list[int]
    stacks: list[Tensor]
    optimizer: StackedOptimizer


@dataclass
class _Part:
    """A group's participants in one round: their rows of the group's stacks (a list and, on the
    stacks' device, ``row_index``), the union of their graphs, its edges and the positions of its
    nodes in the participants' union."""

    group: _Group
    rows: list[int]
    row_index: Tensor
    view: GraphView
    edges: Tensor
    positions: Tensor


class GroupedRole:
    """One role of per-client module (``modules[k]`` of client k: a private model, a shared
    model's copy, a hidden map), its clients grouped by architecture, each group's parameters
    stacked and optimised together (the study's optimiser, each client with its own state);
    the modules hold views of their rows.

    Between :meth:`begin` and :meth:`end` the participants' rows are live (trainable) and
    :meth:`forward` / :meth:`map` compute with them.
    """

    def __init__(self, modules: list[nn.Module], clients: list[ClientData], train: TrainConfig) -> None:
        self.modules, self.clients = modules, clients
        by_arch: dict[tuple, list[int]] = {}
        for k, module in enumerate(modules):
            shapes = tuple((n, tuple(p.shape)) for n, p in module.named_parameters())
            by_arch.setdefault((type(module), architecture_of(module), shapes), []).append(k)
        self.groups = []
        for members in by_arch.values():
            template = modules[members[0]]
            arch = None if architecture_of(template) == "linear" else GroupedArchitecture(template)
            named = [list(modules[k].named_parameters()) for k in members]
            with torch.no_grad():
                stacks = [torch.stack([_to_stack(n, params[j][1]) for params in named]).contiguous()
                          for j, (n, _) in enumerate(named[0])]
            self.groups.append(_Group(arch, members, stacks, StackedOptimizer(stacks, len(members), train)))
            for i, k in enumerate(members):
                for j, (name, param) in enumerate(modules[k].named_parameters()):
                    param.data = _to_stack(name, stacks[j][i])
        self._parts: dict[tuple[int, ...], tuple[list[_Part], Tensor]] = {}
        self._live: list[tuple[_Part, list[Tensor]]] = []
        self._inverse: Tensor | None = None

    def _round_parts(self, ks: list[int]) -> tuple[list[_Part], Tensor]:
        """The groups' parts of the participants ``ks`` (ascending) and the permutation from
        the parts' concatenated nodes to the participants' union (cached per ``ks``)."""
        key = tuple(ks)
        if key not in self._parts:
            sizes = [self.clients[k].num_nodes for k in ks]
            starts = dict(zip(ks, torch.tensor([0] + sizes).cumsum(0).tolist()))
            parts = []
            for group in self.groups:
                rows = [i for i, k in enumerate(group.members) if k in starts]
                if not rows:
                    continue
                members = [group.members[i] for i in rows]
                clients = [self.clients[k] for k in members]
                batch = ClientBatch.of(clients, members)
                offsets = (batch.sizes.cumsum(0) - batch.sizes).tolist()
                edges = torch.cat([c.edge_index + o for c, o in zip(clients, offsets)], dim=1)
                positions = torch.cat([torch.arange(starts[k], starts[k] + c.num_nodes, device=c.x.device)
                                       for k, c in zip(members, clients)])
                row_index = torch.tensor(rows, device=group.stacks[0].device)
                parts.append(_Part(group, rows, row_index, GraphView.of(batch), edges, positions))
            self._parts[key] = (parts, torch.argsort(torch.cat([p.positions for p in parts])))
        return self._parts[key]

    def begin(self, ks: list[int]) -> list[Tensor]:
        """Make the participants' rows live; returns the live parameters (leaves)."""
        parts, self._inverse = self._round_parts(ks)
        self._live = []
        for part in parts:
            everyone = len(part.rows) == len(part.group.members)
            params = [(s if everyone else s.index_select(0, part.row_index)).detach().requires_grad_(True)
                      for s in part.group.stacks]
            self._live.append((part, params))
        return [p for _, params in self._live for p in params]

    def step(self, grads: list[Tensor | None]) -> None:
        """One optimiser step of every live group with ``grads`` (in :meth:`begin`'s order)."""
        offset = 0
        for part, params in self._live:
            own = grads[offset:offset + len(params)]
            offset += len(params)
            own = [torch.zeros_like(p) if g is None else g for p, g in zip(params, own)]
            part.group.optimizer.step(part.rows, params, own)

    @torch.no_grad()
    def end(self) -> None:
        """Write the live rows of partial groups back into the stacks."""
        for part, params in self._live:
            if len(part.rows) < len(part.group.members):
                for stack, p in zip(part.group.stacks, params):
                    stack.index_copy_(0, part.row_index, p.detach())
        self._live = []

    def _union(self, outputs: list[Tensor]) -> Tensor:
        out = torch.cat(outputs)
        return out if len(outputs) == 1 else out.index_select(0, self._inverse)

    def forward(self, training: bool = True, perturb: tuple[float, float] | None = None,
                weights: Callable[[list[int], list[Tensor]], list[Tensor]] | None = None) -> tuple[Tensor, Tensor]:
        """``(hidden [N, d], logits [N, C])`` of every participant's module on its graph (on a
        fresh perturbed view with ``perturb = (edge_drop, feature_mask)``, see
        :meth:`GraphView.perturbed`), nodes in the participants' union order. ``weights(ks,
        stacks)`` gives the parameters a group computes with from its live ``stacks`` (``[m,
        ...]`` each, the rows of clients ``ks``; default: the stacks themselves), e.g. masked."""
        hidden, logits = [], []
        for part, params in self._live:
            view = part.view if perturb is None else part.view.perturbed(part.edges, *perturb)
            if weights is not None:
                params = weights([part.group.members[i] for i in part.rows], params)
            h, z = part.group.arch.forward(params, view, training)
            hidden.append(h)
            logits.append(z)
        return self._union(hidden), self._union(logits)

    @torch.no_grad()
    def predict(self, ks: list[int]) -> tuple[Tensor, Tensor]:
        """:meth:`forward` of the participants ``ks`` in evaluation mode (no dropout, no
        gradient), outside the steps."""
        self.begin(ks)
        try:
            return self.forward(training=False)
        finally:
            self._live = []

    def map(self, h: Tensor, prefix: str = "") -> Tensor:
        """Each participant's linear map applied to its rows of ``h [N, in]`` (union order):
        the module itself (a linear role), or its linear submodule ``prefix`` (e.g. a
        model's head, ``"readout."``)."""
        outputs = []
        for part, params in self._live:
            p = dict(zip((n for n, _ in self.modules[part.group.members[0]].named_parameters()), params))
            rows = h.index_select(0, part.positions) if len(self._live) > 1 else h
            outputs.append(_linear(rows, p[f"{prefix}weight"], part.view, p.get(f"{prefix}bias")))
        return self._union(outputs)


class GroupedTraining:
    """The grouped roles of a method's per-client modules and the participants' unions.

    :meth:`build` gives ``None`` when some module has no grouped forward (the method then
    keeps its per-client path).
    """

    def __init__(self, clients: list[ClientData], train: TrainConfig, roles: dict[str, list[nn.Module]]) -> None:
        self.clients, self.train = clients, train
        self.roles = {name: GroupedRole(modules, clients, train) for name, modules in roles.items()}
        self._unions: dict[tuple[int, ...], ClientBatch] = {}

    @classmethod
    def build(cls, clients: list[ClientData], train: TrainConfig,
              roles: dict[str, list[nn.Module]]) -> "GroupedTraining | None":
        if any(architecture_of(m) is None for modules in roles.values() for m in modules):
            return None
        return cls(clients, train, roles)

    def union(self, ks: list[int]) -> ClientBatch:
        """The participants' union (cached per participant set)."""
        key = tuple(ks)
        if key not in self._unions:
            self._unions[key] = ClientBatch.of([self.clients[k] for k in ks], ks)
        return self._unions[key]

    def run(self, ks: list[int], steps: int, loss: Callable[[ClientBatch], Tensor]) -> list[float]:
        """``steps`` steps of every participant ``ks`` (ascending): ``loss(union)`` gives each
        participant's loss ``[m]`` (computed with the roles' :meth:`GroupedRole.forward`),
        their sum is differentiated and every role's optimiser steps. Returns the last step's
        losses (raises :class:`~fglrepro.fl.training.Diverged` if one is not finite)."""
        union = self.union(ks)
        roles = list(self.roles.values())
        live = [role.begin(ks) for role in roles]
        values = [float("nan")] * len(ks)
        try:
            for _ in range(steps):
                per_client = loss(union)
                params = [p for group in live for p in group]
                grads = torch.autograd.grad(per_client.sum(), params, allow_unused=True)
                offset = 0
                for role, group in zip(roles, live):
                    role.step(list(grads[offset:offset + len(group)]))
                    offset += len(group)
                values = per_client.detach().tolist()
        finally:
            for role in roles:
                role.end()
        for value in values if steps else []:
            check_finite(value)
        return values


class GroupedUpdates:
    """Mixin of a :class:`~fglrepro.fl.method.FederatedMethod` whose clients' modules train on
    the grouped path when it is enabled (:func:`grouped_enabled`) and every module has a
    grouped forward: the participants' ``receive``, ``train.local_epochs`` grouped steps of
    :meth:`grouped_loss`, their ``upload``. Otherwise the per-client path."""

    _grouped: GroupedTraining | None | bool = False  # False: not built yet

    @property
    def on_grouped_path(self) -> bool:
        """Whether the local steps ran on the grouped path (recorded as the run's engine)."""
        return isinstance(self._grouped, GroupedTraining)

    def grouped_roles(self) -> dict[str, list[nn.Module]]:
        """The per-client modules trained, by role (``{"model": [...], ...}``, K each)."""
        raise NotImplementedError

    def grouped_loss(self, union: ClientBatch, roles: dict[str, GroupedRole], round_: int) -> Tensor:
        """Each participant's local loss ``[m]`` on the participants' ``union``."""
        raise NotImplementedError

    def grouped_trained(self, ks: list[int], union: ClientBatch, roles: dict[str, GroupedRole], round_: int) -> None:
        """Work for all participants ``ks`` after their steps, before their uploads (none by
        default)."""

    def client_updates(self, ks: list[int], round_: int):
        if grouped_enabled() and self._grouped is False:
            self._grouped = GroupedTraining.build(self.clients, self.federation.train, self.grouped_roles())
        if not grouped_enabled() or self._grouped is None or self._grouped is False:
            return super().client_updates(ks, round_)
        for k in ks:
            self.receive(k, round_)
        grouped = self._grouped
        losses = grouped.run(ks, self.federation.train.local_epochs,
                             lambda union: self.grouped_loss(union, grouped.roles, round_))
        self.grouped_trained(ks, grouped.union(ks), grouped.roles, round_)
        uploads = {k: self.upload(k, round_, value) for k, value in zip(ks, losses)}
        return {k: u for k, u in uploads.items() if u is not None}
