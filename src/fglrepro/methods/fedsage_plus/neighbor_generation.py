"""Missing-neighbour generation for subgraph FL (NeighGen of FedSage+, Zhang et al., NeurIPS 2021).

The pieces, reusable by any method that mends client subgraphs:

- :func:`impair_graph`: hide part of a client graph and record, for every kept node, how
  many neighbours it lost and their features (the training signal of NeighGen);
- :class:`NeighGen`: encoder + dGen (number of missing neighbours) + fGen (their features),
  whose output layer can be evaluated at the used slots only (:func:`used_slots`,
  :class:`SlotLinear`);
- :func:`greedy_feature_loss`: the greedy matching loss between generated and true
  neighbour features;
- :class:`NeighborSampler`: neighbour feature sets of random nodes of a graph
  (the targets another client's fGen is trained against);
- :func:`mend_graph` / :func:`mended_client`: add generated neighbours to a graph.

All edge indices are local, hold both directions of every undirected edge and no
self-loops, as :class:`~fglrepro.fl.clients.ClientData` does.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fglrepro.fl.buffers import BufferPool
from fglrepro.fl.clients import ClientData, normalized_adjacency
from fglrepro.fl.kernel_optimizer import KernelOptimizer
from fglrepro.models import GCN, dropout

#: fGen hidden widths (authors' code zkhku/fedsage ``Gen`` and OpenFGL ``fGen``: 256 -> 2048).
FGEN_WIDTHS = (256, 2048)


@dataclass
class ImpairedGraph:
    """A client graph with some nodes hidden, and what every kept node lost.

    Attributes:
        kept: ``[m]`` client-local ids of the kept nodes, ascending.
        hidden: ``[h]`` client-local ids of the hidden nodes, ascending.
        x: ``[m, F]`` features of the kept nodes.
        y: ``[m]`` their labels.
        edge_index: ``[2, E']`` edges among kept nodes, re-indexed to ``0..m-1``.
        adj: ``[m, m]`` GCN-normalised adjacency of ``edge_index``.
        train_mask: ``[m]`` kept training nodes.
        missing_count: ``[m]`` number of hidden neighbours of each kept node.
        train_missing_feat: ``[t, P, F]`` for the ``t`` kept training nodes in order (the only
            nodes whose hidden neighbours a loss reads): features of the first ``min(P, count)``
            hidden neighbours (by id), zero rows after them.
    """

    kept: Tensor
    hidden: Tensor
    x: Tensor
    y: Tensor
    edge_index: Tensor
    adj: Tensor
    train_mask: Tensor
    missing_count: Tensor
    train_missing_feat: Tensor


def impair_graph(client: ClientData, hidden_portion: float, num_pred: int,
                 generator: torch.Generator) -> ImpairedGraph:
    """Hide ``int(hidden_portion * c)`` of the ``c`` nodes outside the training and test
    sets (chosen uniformly with ``generator``) and every edge touching them, as the
    authors' code does (zkhku/fedsage ``wn_hide_subj``, OpenFGL ``get_impaired_subgraph``)."""
    n, device = client.num_nodes, client.x.device
    candidates = (~client.train_mask & ~client.test_mask).nonzero().flatten()
    count = int(hidden_portion * candidates.numel())
    pick = torch.randperm(candidates.numel(), generator=generator)[:count].to(device)
    is_hidden = torch.zeros(n, dtype=torch.bool, device=device)
    is_hidden[candidates[pick]] = True
    kept = (~is_hidden).nonzero().flatten()
    new_id = torch.full((n,), -1, dtype=torch.long, device=device)
    new_id[kept] = torch.arange(kept.numel(), device=device)

    src, dst = client.edge_index
    edge_index = new_id[client.edge_index[:, ~is_hidden[src] & ~is_hidden[dst]]]
    lost = ~is_hidden[src] & is_hidden[dst]
    owner, neighbor = new_id[src[lost]], dst[lost]
    order = torch.argsort(owner * n + neighbor)
    owner, neighbor = owner[order], neighbor[order]
    missing_count = torch.bincount(owner, minlength=kept.numel())
    rank = torch.arange(owner.numel(), device=device) - (missing_count.cumsum(0) - missing_count)[owner]
    train_mask = client.train_mask[kept]
    train_row = torch.cumsum(train_mask, 0) - 1  # row of each kept training node
    take = (rank < num_pred) & train_mask[owner]
    train_missing_feat = client.x.new_zeros(int(train_mask.sum()), num_pred, client.x.size(1))
    train_missing_feat[train_row[owner[take]], rank[take]] = client.x[neighbor[take]]
    return ImpairedGraph(
        kept=kept, hidden=is_hidden.nonzero().flatten(), x=client.x[kept], y=client.y[kept],
        edge_index=edge_index, adj=normalized_adjacency(edge_index, kept.numel()),
        train_mask=train_mask, missing_count=missing_count, train_missing_feat=train_missing_feat,
    )


def used_slots(count: Tensor, num_pred: int) -> Tensor:
    """``[n, P]`` mask of the generated-neighbour slots a node uses: ``p < min(P, floor(count))``
    for counts ``[n]`` (>= 0, real-valued or integer)."""
    return torch.arange(num_pred, device=count.device) < count.long().clamp(0, num_pred)[:, None]


#: fGen output-layer weight gradients (59 MB on Cora), reused across steps and clients
_WEIGHT_GRADIENTS = BufferPool()

#: rows of the output layer's weight whose gradient :class:`SlotLinear` forms at a time when it
#: steps the weight itself (1 MB at fGen's width 2048: stays in cache until stepped)
TILE_ROWS = 128


class SlotLinear(torch.autograd.Function):
    """fGen's output layer and activation ``tanh(h W^T + b)`` evaluated only at the used
    (row, slot) pairs.

    With ``W = [W_0; ...; W_{P-1}]`` (``F`` rows per slot), slot p of row i is
    ``tanh(h_i W_p^T + b_p)`` where ``used[i, p]``, and 0 elsewhere: one GEMM per slot over the
    rows using it instead of ``[r, H] @ [H, P*F]``, and tanh only where it is used. The weight
    and bias gradients are full dense tensors, zero at slots no row uses, so optimisers see the
    same shapes (and Adam's weight decay acts on every weight) as with the dense layer.

    Given an ``optimizer`` that can (:meth:`~fglrepro.fl.kernel_optimizer.KernelOptimizer.step_tiles`),
    the backward pass steps ``W`` itself instead of returning its gradient: the gradient is formed
    ``TILE_ROWS`` rows at a time and each tile stepped while in cache (the same update bit for bit;
    with few rows per slot, writing the ``[P*F, H]`` gradient and reading it back cost as much as
    the GEMMs). The input gradient reads every slot's weights before the first tile is stepped.

    Args:
        h: ``[r, H]`` input rows.
        weight: ``[P*F, H]``, bias: ``[P*F]``: the dense layer's parameters.
        used: ``[r, P]`` bool.
        optimizer: steps ``weight`` in the backward pass (once per backward pass), or None.

    Returns:
        ``[r, P, F]``.
    """

    @staticmethod
    def forward(ctx, h: Tensor, weight: Tensor, bias: Tensor, used: Tensor,
                optimizer: KernelOptimizer | None = None) -> Tensor:
        num_pred = used.size(1)
        w, b = weight.view(num_pred, -1, h.size(1)), bias.view(num_pred, -1)
        out = h.new_zeros(h.size(0), num_pred, w.size(1))
        rows = [used[:, p].nonzero().flatten() for p in range(num_pred)]
        for p, r in enumerate(rows):
            if r.numel():
                out[r, p] = torch.tanh(torch.addmm(b[p], h[r], w[p].t()))
        ctx.save_for_backward(h, weight, out)
        ctx.rows, ctx.optimizer = rows, optimizer
        return out

    @staticmethod
    def backward(ctx, grad_out: Tensor):
        h, weight, out = ctx.saved_tensors
        num_pred = grad_out.size(1)
        w = weight.view(num_pred, -1, h.size(1))
        grad_h = torch.zeros_like(h) if ctx.needs_input_grad[0] else None
        grad_b = weight.new_zeros(weight.size(0))
        grad_b_slots = grad_b.view(num_pred, -1)
        # per slot: the pre-activation gradient [r_p, F] of the rows using it (None if none do)
        slot_grads = []
        for p, r in enumerate(ctx.rows):
            if not r.numel():
                slot_grads.append(None)
                continue
            y = out[r, p]
            g = grad_out[r, p] * (1 - y * y)
            grad_b_slots[p] = g.sum(0)
            if grad_h is not None:
                grad_h.index_add_(0, r, g @ w[p])
            slot_grads.append(g)
        if ctx.optimizer is None:
            grad_w = _WEIGHT_GRADIENTS.empty(tuple(weight.shape), weight.dtype, weight.device)
            for p, (r, g) in enumerate(zip(ctx.rows, slot_grads)):
                if g is None:
                    grad_w.view_as(w)[p].zero_()
                else:
                    torch.mm(g.t(), h[r], out=grad_w.view_as(w)[p])
            return grad_h, grad_w, grad_b, None, None
        ctx.optimizer.step_tiles(weight, _weight_gradient_tiles(h, ctx.rows, slot_grads, w.size(1)))
        return grad_h, None, grad_b, None, None


def _weight_gradient_tiles(h: Tensor, rows: list[Tensor], slot_grads: list[Tensor | None], num_features: int):
    """Yield ``(rows of W, gradient)`` tiles of :class:`SlotLinear`'s weight gradient in row order,
    ``TILE_ROWS`` rows of one slot at a time (zeros for a slot no row uses), each in one reused buffer:
    the caller is done with a tile when it asks for the next. ``h [r, H]``; ``rows[p]`` and
    ``slot_grads[p] [r_p, F]`` slot p's rows and pre-activation gradient."""
    buffer = h.new_empty(min(TILE_ROWS, num_features), h.size(1))
    zeros = torch.zeros_like(buffer)
    for p, (r, g) in enumerate(zip(rows, slot_grads)):
        h_rows = h[r] if g is not None else None
        for start in range(0, num_features, TILE_ROWS):
            stop = min(num_features, start + TILE_ROWS)
            tile = slice(p * num_features + start, p * num_features + stop)
            if g is None:
                yield tile, zeros[: stop - start]
            else:
                yield tile, torch.mm(g.t()[start:stop], h_rows, out=buffer[: stop - start])


class _Dropout(nn.Module):
    """:func:`fglrepro.models.dropout` as a module (``nn.Dropout`` with the fast masks when on)."""

    def __init__(self, p: float) -> None:
        super().__init__()
        self.p = p

    def forward(self, x: Tensor) -> Tensor:
        return dropout(x, self.p, self.training)


class NeighGen(nn.Module):
    """Missing-neighbour generator: a 2-layer GCN encoder to ``latent`` dims, dGen
    (``ReLU(Linear(latent, 1))``, the number of missing neighbours) and fGen (Gaussian
    noise added to the encoding, then ``latent -> 256 -> 2048 -> P*F`` with ReLU, dropout
    before the last layer and tanh output: features of up to P neighbours).

    fGen's last layer (``2048 x P*F``) dominates the cost; since a node only ever uses
    its first ``min(P, count)`` slots, :meth:`generate` can evaluate it at chosen (row,
    slot) pairs only (:class:`SlotLinear`), with the same noise and dropout draws.

    The authors encode with GraphSAGE; the GCN of this study's model zoo is used here.
    """

    def __init__(self, in_channels: int, hidden: int, latent: int, num_pred: int, dropout: float) -> None:
        super().__init__()
        self.num_pred, self.in_channels = num_pred, in_channels
        self.encoder = GCN(in_channels, hidden, latent, layers=2, dropout=dropout)
        self.dgen = nn.Linear(latent, 1)
        self.fgen = nn.Sequential(
            nn.Linear(latent, FGEN_WIDTHS[0]), nn.ReLU(),
            nn.Linear(FGEN_WIDTHS[0], FGEN_WIDTHS[1]), nn.ReLU(), _Dropout(dropout),
            nn.Linear(FGEN_WIDTHS[1], num_pred * in_channels), nn.Tanh(),
        )

    def encode(self, x: Tensor, adj: Tensor) -> tuple[Tensor, Tensor]:
        """``x [n, F]``, ``adj [n, n]`` -> encodings ``[n, latent]`` and predicted counts
        ``[n]`` (>= 0, real-valued)."""
        z = self.encoder(x, adj)
        return z, F.relu(self.dgen(z)).squeeze(-1)

    def generate(self, z: Tensor, used: Tensor | None = None, optimizer: KernelOptimizer | None = None) -> Tensor:
        """Encodings ``[r, latent]`` -> generated features ``[r, P, F]``, computed only at
        the (row, slot) pairs of the mask ``used [r, P]`` (0 elsewhere) unless it is None; with
        ``used``, an ``optimizer`` given steps the output layer's weight in the backward pass
        (:class:`SlotLinear`)."""
        h = self.fgen[:-2](z + torch.randn_like(z))
        output, tanh = self.fgen[-2], self.fgen[-1]
        if used is None or self.num_pred == 0:
            return tanh(output(h)).view(z.size(0), self.num_pred, self.in_channels)
        return SlotLinear.apply(h, output.weight, output.bias, used, optimizer)

    def forward(self, x: Tensor, adj: Tensor, nodes: Tensor | None = None,
                only_used: bool = False) -> tuple[Tensor, Tensor]:
        """Predicted counts ``[n]`` and generated features ``[r, P, F]`` of the ``r`` rows
        ``nodes`` (all by default); with ``only_used`` the features are computed only at
        each row's used slots (:func:`used_slots` of its count) and are 0 after them."""
        z, count = self.encode(x, adj)
        if nodes is not None:
            z = z[nodes]
        used = used_slots(count if nodes is None else count[nodes], self.num_pred) if only_used else None
        return count, self.generate(z, used)


def greedy_feature_loss(pred_feat: Tensor, true_feat: Tensor, pred_count: Tensor, true_count: Tensor) -> Tensor:
    """Greedy matching loss of the authors' code (OpenFGL ``greedy_loss``).

    Each generated slot ``p < min(P, floor(pred_count))`` of a node with ``true_count > 0``
    costs the smallest feature-mean squared error to one of the node's first
    ``min(P, true_count)`` true neighbours; the sum is divided by ``n * P``:

    ``L = 1/(n P) * sum_i sum_{p < pred_i} min_{q < true_i} mean_f (pred_feat[i, p, f] - true_feat[i, q, f])^2``
    (``pred_i = min(P, floor(pred_count_i))``, ``true_i = min(P, true_count_i)``, nodes with
    ``true_count_i = 0`` excluded).

    The distances are computed only for these (node, slot, true neighbour) triples, not for
    all ``n * P * P`` (the same numbers: each is a mean over one row of ``F`` features).

    Args:
        pred_feat: ``[n, P, F]`` generated features.
        true_feat: ``[n, P, F]`` true neighbour features.
        pred_count: ``[n]`` predicted counts (not differentiated through).
        true_count: ``[n]`` true counts.
    """
    n, num_pred = pred_feat.shape[:2]
    if n * num_pred == 0:
        return pred_feat.sum()
    slots = torch.arange(num_pred, device=pred_feat.device)
    true_count = true_count.clamp(max=num_pred)
    pred_count = pred_count.detach().long().clamp(0, num_pred)
    active = (slots < pred_count[:, None]) & (true_count[:, None] > 0)
    node, slot, neighbor = (active[:, :, None] & (slots < true_count[:, None])[:, None, :]).nonzero().unbind(1)
    pair_dist = (pred_feat[node, slot] - true_feat[node, neighbor]).pow(2).mean(-1)
    dist = pred_feat.new_full((n, num_pred, num_pred), float("inf")).index_put((node, slot, neighbor), pair_dist)
    best = dist.min(-1).values
    return torch.where(active, best, torch.zeros_like(best)).sum() / (n * num_pred)


class NeighborSampler:
    """Neighbour feature sets of random nodes of one graph (OpenFGL's targets of the
    cross-client fGen loss), with the graph's sorted adjacency lists built once.

    Args:
        client: the graph whose nodes and features are drawn.
    """

    def __init__(self, client: ClientData) -> None:
        src, dst = client.edge_index
        self.x, self.degree = client.x, torch.bincount(src, minlength=client.num_nodes)
        #: ``[m]`` nodes with at least one neighbour
        self.with_neighbors = (self.degree > 0).nonzero().flatten()
        #: ``[E]`` neighbours grouped by node (ascending), node i's from ``start[i]``
        self.neighbors = dst[torch.argsort(src * client.num_nodes + dst)]
        self.start = self.degree.cumsum(0) - self.degree

    def draw(self, num_rows: int, num_pred: int, generator: torch.Generator) -> Tensor | None:
        """``[num_rows, P]`` node ids: for each row a uniformly drawn node with at least one
        neighbour and P of its neighbours drawn with replacement; None (nothing drawn) when the
        graph has no edge."""
        if self.with_neighbors.numel() == 0:
            return None
        device = self.neighbors.device
        rows = self.with_neighbors[
            torch.randint(self.with_neighbors.numel(), (num_rows,), generator=generator).to(device)]
        offsets = (torch.rand(num_rows, num_pred, generator=generator).to(device) * self.degree[rows, None]).long()
        return self.neighbors[self.start[rows, None] + offsets]

    def features(self, ids: Tensor) -> Tensor:
        """``[num_rows, P, F]``: the features of the drawn node ids ``[num_rows, P]``."""
        return self.x[ids]


def mend_graph(x: Tensor, edge_index: Tensor, count: Tensor, feat: Tensor,
               rows: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """Attach ``min(P, count_i)`` generated neighbours to every node i.

    Args:
        x: ``[n, F]`` features; edge_index: ``[2, E]``.
        count: ``[n]`` integer counts; feat: ``[n, P, F]`` generated features
            (gradients flow into the ones used), or ``[r, P, F]`` those of the nodes
            ``rows [r]`` (ascending) only: the other nodes' generated neighbours get zero features.

    Returns:
        ``x' [n + S, F]`` (original rows first, then node i's generated neighbours in
        slot order, nodes in id order) and ``edge_index' [2, E + 2S]`` (original edges
        first, then one undirected edge from each new node to its owner).
    """
    n, num_pred = x.size(0), feat.size(1)
    owner, slot = used_slots(count, num_pred).nonzero().unbind(1)
    new = torch.arange(n, n + owner.numel(), device=x.device)
    edges = torch.cat([edge_index, torch.stack([owner, new]), torch.stack([new, owner])], dim=1)
    if rows is None:
        return torch.cat([x, feat[owner, slot]]), edges
    position = torch.full((n,), -1, dtype=torch.long, device=x.device)
    position[rows] = torch.arange(rows.numel(), device=x.device)
    at = position[owner]
    inside = (at >= 0).nonzero().flatten()
    generated = feat.new_zeros(owner.numel(), feat.size(2)).index_put((inside,), feat[at[inside], slot[inside]])
    return torch.cat([x, generated]), edges


def mended_client(client: ClientData, count: Tensor, feat: Tensor) -> ClientData:
    """``client`` with generated neighbours attached (:func:`mend_graph`). Generated nodes
    have label and global id -1 and are in no train/val/test mask, so training and
    evaluation only ever select the client's original nodes."""
    x, edge_index = mend_graph(client.x, client.edge_index, count, feat.detach())
    extra = x.size(0) - client.num_nodes

    def pad(t: Tensor, value) -> Tensor:
        return torch.cat([t, t.new_full((extra,), value)])

    return ClientData(
        x=x, y=pad(client.y, -1), edge_index=edge_index, adj=normalized_adjacency(edge_index, x.size(0)),
        train_mask=pad(client.train_mask, False), val_mask=pad(client.val_mask, False),
        test_mask=pad(client.test_mask, False), global_ids=pad(client.global_ids, -1),
        num_classes=client.num_classes, graphless=client.graphless,
    )
