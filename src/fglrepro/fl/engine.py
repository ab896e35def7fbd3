"""The vectorised engine: the local steps of all participants as one batched computation.

The sequential path (:meth:`fglrepro.fl.method.FederatedMethod.client_update` per client)
pays torch's per-operation overhead once per client and step; here the participants of a
round train together. Their subgraphs form one disjoint union (a block-diagonal normalised
adjacency), each GCN parameter is stacked over clients (``[m, ...]``), the first layer reads
the bag-of-words features as a gather-sum (:func:`torch.nn.functional.embedding_bag`), later
layers multiply each client's nodes by its own weights in one padded ``bmm``, and one
(fused) Adam step updates every client's parameters with its own step count. Each client's
loss is its own (cross-entropy mean over its training nodes plus the method's terms), and
their sum is differentiated, so every client's gradient is the one it would compute alone.

A method opts in by declaring ``vectorised = True``; its per-client ``receive`` and
``upload`` hooks run unchanged around the batched steps, and a method whose local loss has
more than cross-entropy gives the batched form of its terms in ``batched_extra_loss``
(FedProx, SCAFFOLD, FedDC, MOON). The engine runs homogeneous :class:`~fglrepro.models.GCN`
models; :func:`~fglrepro.fl.method.vectorised_obstacle` says when it cannot.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.optim.adam import adam

from fglrepro.config import TrainConfig
from fglrepro.fl.clients import ClientData
from fglrepro.fl.evaluation import EvaluateEach
from fglrepro.fl.method import FederatedMethod, Federation, Upload
from fglrepro.fl.training import check_finite
from fglrepro.models import GCN, bernoulli_dropout
from fglrepro.sparse import SparseRows, is_symmetric, sparse_matmul, symmetric_propagation

#: A method's batched local-loss terms: ``(forward pass, stacked parameters) -> [m]``, one
#: value per participant, added to its cross-entropy.
BatchedTerms = Callable[["StackedForward", list[Tensor]], Tensor]


@dataclass
class Remade:
    """Base of dataclasses that pickle as the call that made them: a constructor sets
    ``_recipe = (function, args)``, so that a checkpoint stores its inputs rather than a copy of the
    tensors derived from them, and a load makes the same tensors again (and shares them as the
    saved run did); an instance made otherwise (e.g. by ``dataclasses.replace``) pickles whole."""

    _recipe: tuple | None = field(default=None, init=False, repr=False, compare=False)

    def __reduce_ex__(self, protocol):
        return super().__reduce_ex__(protocol) if self._recipe is None else self._recipe


@dataclass
class ClientBatch(Remade):
    """The disjoint union of ``m`` client graphs, nodes ordered client by client.

    Attributes:
        clients: positions (in the federation) of the m clients.
        sizes: ``[m]`` node counts; ``batch [N]`` the position in 0..m-1 of each node.
        adj: ``[N, N]`` block-diagonal sparse CSR of the clients' normalised adjacencies.
        y, train_mask, val_mask, test_mask: ``[N]``.
        flat: ``[N]`` row of each node in the padded ``[m * n_max, .]`` layout.
        n_max: largest client.
        stacked, shared: the features as :class:`~fglrepro.sparse.SparseRows` for
            client-stacked weights (``[N, m * F]``: client i's features in columns
            ``i*F .. i*F+F-1``, times ``[m * F, H]``) and for shared ones (``[N, F]``); ``None``
            with dense features, kept in ``x_pad``.
        x_pad: ``[m, n_max, F]`` dense padded features (when not sparse).
        sources: the clients whose features :attr:`x` concatenates.

    A batch made by :meth:`of` pickles as that call (:class:`Remade`).
    """

    clients: list[int]
    sizes: Tensor
    batch: Tensor
    adj: Tensor
    y: Tensor
    train_mask: Tensor
    val_mask: Tensor
    test_mask: Tensor
    flat: Tensor
    n_max: int
    stacked: SparseRows | None
    shared: SparseRows | None
    x_pad: Tensor | None
    sources: list[ClientData] = field(repr=False, compare=False)
    _x: Tensor | None = field(default=None, repr=False, compare=False)

    @property
    def x(self) -> Tensor:
        """``[N, F]`` the union's features, concatenated on first read and kept: the engines read
        :attr:`stacked` / :attr:`shared` or :attr:`x_pad`, so most runs never hold this copy."""
        if self._x is None:
            self._x = torch.cat([c.x for c in self.sources])
        return self._x

    @property
    def num_clients(self) -> int:
        return len(self.clients)

    @classmethod
    def of(cls, clients: list[ClientData], positions: list[int], sparse_below: float = 0.1) -> "ClientBatch":
        """Union of ``clients`` (the federation's ``positions``); features with a density
        below ``sparse_below`` are read as sparse bags."""
        device = clients[0].x.device
        sizes = torch.tensor([c.num_nodes for c in clients], device=device)
        m, n_max = len(clients), int(sizes.max())
        batch = torch.repeat_interleave(torch.arange(m, device=device), sizes)
        starts = torch.cumsum(sizes, 0) - sizes
        flat = batch * n_max + torch.arange(batch.numel(), device=device) - starts[batch]
        num_nodes, num_features = batch.numel(), clients[0].x.size(1)
        stacked = shared = x_pad = None
        if sum(int(c.x.count_nonzero()) for c in clients) < sparse_below * num_nodes * num_features:
            shared = SparseRows.concatenated([c.x for c in clients])
            stacked_columns = shared.columns + batch[shared.rows] * num_features
            stacked = SparseRows.entries(shared.rows, stacked_columns, shared.values, (num_nodes, m * num_features))
        else:
            x_pad = clients[0].x.new_zeros(m, n_max, num_features)
            for k, c in enumerate(clients):
                x_pad[k, :c.num_nodes] = c.x
        made = cls(
            clients=list(positions), sizes=sizes, batch=batch, adj=block_diagonal([c.adj for c in clients]),
            y=torch.cat([c.y for c in clients]), train_mask=torch.cat([c.train_mask for c in clients]),
            val_mask=torch.cat([c.val_mask for c in clients]), test_mask=torch.cat([c.test_mask for c in clients]),
            flat=flat, n_max=n_max, stacked=stacked, shared=shared, x_pad=x_pad, sources=list(clients),
        )
        made._recipe = (cls.of, (made.sources, made.clients, sparse_below))
        return made

    def pad(self, h: Tensor) -> Tensor:
        """``[N, D]`` -> ``[m, n_max, D]`` (zero rows after each client's nodes)."""
        out = h.new_zeros(self.num_clients * self.n_max, h.size(1)).index_copy(0, self.flat, h)
        return out.view(self.num_clients, self.n_max, h.size(1))

    def unpad(self, h: Tensor) -> Tensor:
        """Inverse of :meth:`pad`: ``[m, n_max, D]`` -> ``[N, D]``."""
        return h.reshape(-1, h.size(-1)).index_select(0, self.flat)

    def per_client_sum(self, values: Tensor, nodes: Tensor | None = None) -> Tensor:
        """``[m]`` sums of per-node ``values`` over each client's nodes (or the ``nodes`` mask)."""
        index = self.batch if nodes is None else self.batch[nodes]
        return values.new_zeros(self.num_clients).index_add(0, index, values)


def block_diagonal(blocks: list[Tensor]) -> Tensor:
    """Block-diagonal sparse CSR of square sparse CSR ``blocks``."""
    crows, cols, values, node_offset, nnz_offset = [blocks[0].crow_indices()[:1]], [], [], 0, 0
    for block in blocks:
        crows.append(block.crow_indices()[1:] + nnz_offset)
        cols.append(block.col_indices() + node_offset)
        values.append(block.values())
        node_offset += block.size(0)
        nnz_offset += block.values().numel()
    return torch.sparse_csr_tensor(torch.cat(crows), torch.cat(cols), torch.cat(values), (node_offset, node_offset))


@dataclass
class StackedForward:
    """One batched forward pass: ``logits [N, C]`` and ``hidden [N, H]`` (the input of the
    last layer, as :meth:`fglrepro.models.GCN.forward` returns with ``return_hidden``)."""

    logits: Tensor
    hidden: Tensor
    batch: ClientBatch


class StackedGCN:
    """The functional GCN of :class:`~fglrepro.models.GCN` over client-stacked parameters.

    Parameters are kept in the engine layout: every weight transposed to ``[in, out]``
    (``[m, in, out]`` stacked), biases ``[m, out]``; :meth:`gather` and :meth:`scatter` move
    them between models and stacks.
    """

    def __init__(self, template: GCN) -> None:
        self.names = [name for name, _ in template.named_parameters()]
        self.dropout = template.dropout
        self.num_convs = len(template.convs)
        self.readout = template.readout is not None
        layers = [(f"convs.{i}.lin.weight", f"convs.{i}.bias") for i in range(self.num_convs)]
        if self.readout:
            layers.append(("readout.weight", "readout.bias"))
        #: positions in :attr:`names` of each layer's (weight, bias), in forward order
        self.layers = [(self.names.index(w), self.names.index(b)) for w, b in layers]

    @staticmethod
    def _to_engine(name: str, value: Tensor) -> Tensor:
        return value.transpose(-1, -2) if name.endswith("weight") else value

    def gather(self, params: list[dict[str, Tensor]] | list[nn.Module]) -> list[Tensor]:
        """Stacks ``[m, ...]`` (engine layout, contiguous) of ``params`` (dicts or models)."""
        dicts = [dict(p.named_parameters()) if isinstance(p, nn.Module) else p for p in params]
        with torch.no_grad():
            return [torch.stack([self._to_engine(n, d[n]) for d in dicts]).contiguous() for n in self.names]

    def single(self, params: dict[str, Tensor] | nn.Module) -> list[Tensor]:
        """Shared parameters (engine layout, no client dimension) of one model or dict."""
        values = dict(params.named_parameters()) if isinstance(params, nn.Module) else params
        return [self._to_engine(n, values[n].detach()).contiguous() for n in self.names]

    @torch.no_grad()
    def scatter(self, stacks: list[Tensor], models: list[nn.Module]) -> None:
        """Copy row i of ``stacks`` into ``models[i]``'s parameters."""
        for i, model in enumerate(models):
            for j, (name, param) in enumerate(model.named_parameters()):
                param.copy_(self._to_engine(name, stacks[j][i]))

    def bind(self, stacks: list[Tensor], models: list[nn.Module], attribute: str = "data") -> None:
        """Point each parameter's ``attribute`` (``data`` or ``grad``) of ``models[i]`` at
        (a view of) row i of ``stacks``: no copy, later writes to either side are shared."""
        for i, model in enumerate(models):
            for j, (name, param) in enumerate(model.named_parameters()):
                setattr(param, attribute, self._to_engine(name, stacks[j].detach()[i]))

    def forward(
        self, params: list[Tensor], batch: ClientBatch, training: bool, masks: list[Tensor] | None = None,
    ) -> StackedForward:
        """Batched forward; ``params`` stacked ``[m, ...]`` (each client its own) or shared
        (no client dimension). Dropout draws one mask per layer for the whole batch, or takes
        the given ``masks`` (``[N, width]`` each, already scaled by ``1 / (1 - p)``)."""
        shared = params[self.layers[0][0]].dim() == 2
        h, hidden, layer = None, None, 0
        for i in range(self.num_convs):
            weight, bias = (params[j] for j in self.layers[i])
            hidden = h if i > 0 else batch.x
            h = self._first(weight, batch, shared) if i == 0 else self._linear(h, weight, batch, shared)
            h = symmetric_propagation(batch.adj, h) + (bias if shared else bias[batch.batch])
            if i < self.num_convs - 1 or self.readout:
                h = self._dropout(F.relu(h), training, masks, layer)
                layer += 1
        if self.readout:
            hidden = h
            weight, bias = (params[j] for j in self.layers[-1])
            h = self._linear(h, weight, batch, shared) + (bias if shared else bias[batch.batch])
        return StackedForward(logits=h, hidden=hidden, batch=batch)

    def _first(self, weight: Tensor, batch: ClientBatch, shared: bool) -> Tensor:
        if batch.x_pad is not None:
            return batch.x @ weight if shared else batch.unpad(torch.bmm(batch.x_pad, weight))
        return sparse_matmul(batch.shared if shared else batch.stacked, weight.reshape(-1, weight.size(-1)))

    @staticmethod
    def _linear(h: Tensor, weight: Tensor, batch: ClientBatch, shared: bool) -> Tensor:
        return h @ weight if shared else batch.unpad(torch.bmm(batch.pad(h), weight))

    def _dropout(self, h: Tensor, training: bool, masks: list[Tensor] | None, layer: int) -> Tensor:
        if not training or self.dropout == 0:
            return h
        if masks is None:
            return bernoulli_dropout(h, self.dropout)
        return h * masks[layer]

    def dropout_widths(self, params: list[Tensor]) -> list[int]:
        """Widths of the dropout layers, in forward order."""
        count = self.num_convs - 1 + int(self.readout)
        return [params[self.layers[i][1]].size(-1) for i in range(count)]


class StackedOptimizer:
    """The study's optimiser (Adam, AdamW or SGD, with weight decay as in torch) for K clients at
    once: state stacked over all clients, each client with its own step count, updated for
    the rows of a round's participants only (torch's fused Adam kernel, one tensor per
    client and parameter)."""

    def __init__(self, template: list[Tensor], num_clients: int, config: TrainConfig) -> None:
        self.config = config
        shapes = [t.shape[1:] for t in template]
        device = template[0].device
        self.exp_avg = [torch.zeros(num_clients, *s, device=device) for s in shapes]
        self.exp_avg_sq = [torch.zeros(num_clients, *s, device=device) for s in shapes]
        #: per parameter and client, as torch keeps one step tensor per parameter
        self.step_counts = [[torch.zeros((), device=device) for _ in range(num_clients)] for _ in shapes]
        #: per parameter, the K row views of the moments (made once: a view per client and step costs)
        self._exp_avg_rows = [t.unbind(0) for t in self.exp_avg]
        self._exp_avg_sq_rows = [t.unbind(0) for t in self.exp_avg_sq]

    def step(self, clients: list[int], params: list[Tensor], grads: list[Tensor]) -> None:
        """One step for ``clients`` whose rows ``0..m-1`` of ``params``/``grads`` (in place)."""
        cfg = self.config
        if cfg.optimizer == "sgd":
            with torch.no_grad():
                for p, g in zip(params, grads):
                    p.sub_(cfg.lr * (g + cfg.weight_decay * p) if cfg.weight_decay else cfg.lr * g)
            return
        flat_p, flat_g, flat_m, flat_v, flat_s = [], [], [], [], []
        for j, (p, g) in enumerate(zip(params, grads)):
            flat_p.extend(p.unbind(0))
            flat_g.extend(g.unbind(0))
            flat_m.extend(self._exp_avg_rows[j][k] for k in clients)
            flat_v.extend(self._exp_avg_sq_rows[j][k] for k in clients)
            flat_s.extend(self.step_counts[j][k] for k in clients)
        adam(
            flat_p, flat_g, flat_m, flat_v, [], flat_s, fused=True, amsgrad=False, beta1=0.9, beta2=0.999,
            lr=cfg.lr, weight_decay=cfg.weight_decay, eps=1e-8, maximize=False,
            decoupled_weight_decay=cfg.optimizer == "adamw",
        )


def train_rows(stacks: list[Tensor], ks: list[int], epochs: int, loss: Callable[[list[Tensor], int], Tensor],
               optimizer: StackedOptimizer) -> tuple[Tensor, tuple[Tensor, ...] | None]:
    """``epochs`` steps of the participants ``ks`` on their rows of the stacked parameters
    ``stacks`` (``[K, ...]`` each, updated in place): ``loss(params, epoch)`` gives each
    participant's loss ``[m]`` from its rows ``params`` (``[m, ...]``), their sum is
    differentiated and ``optimizer`` steps every participant. Returns the last step's losses
    ``[m]`` (NaN without steps; a non-finite one raises :class:`~fglrepro.fl.training.Diverged`)
    and gradients (None without steps)."""
    everyone = len(ks) == stacks[0].size(0)
    rows = torch.tensor(ks, device=stacks[0].device)
    params = [(s if everyone else s.index_select(0, rows)).detach().requires_grad_(True) for s in stacks]
    losses, grads = torch.full((len(ks),), float("nan"), device=rows.device), None
    for epoch in range(epochs):
        per_client = loss(params, epoch)
        grads = torch.autograd.grad(per_client.sum(), params)
        optimizer.step(ks, params, grads)
        losses = per_client.detach()
    if epochs:
        for value in losses.tolist():
            check_finite(value)
    if not everyone:
        with torch.no_grad():
            for stack, p in zip(stacks, params):
                stack.index_copy_(0, rows, p)
    return losses, grads


class VectorisedEngine:
    """Batched local training and evaluation for one federation (see the module docstring).

    Attributes:
        model: the stacked functional form of the federation's GCN.
        optimizer: the stacked optimiser state of all clients' local models, kept across
            rounds as each client's own optimiser is on the sequential path.
        mask_order: ``"batched"`` draws one dropout mask per layer for all participants;
            ``"sequential"`` draws each client's masks in the order the sequential path
            would (client by client, epoch by epoch), so both paths see the same random
            numbers (used to check the engine against the reference).
    """

    def __init__(self, federation: Federation, mask_order: str = "batched") -> None:
        if not all(is_symmetric(c.adj) for c in federation.clients):
            raise ValueError("the vectorised engine needs symmetric client adjacencies")
        self.federation = federation
        self.clients = federation.clients
        self.model = StackedGCN(federation.model)
        self.mask_order = mask_order
        self.optimizer = StackedOptimizer(self.model.gather([federation.model]), len(self.clients), federation.train)
        self._batches: dict[tuple[int, ...], ClientBatch] = {}
        #: the clients' local models stacked ``[K, ...]`` (engine layout); each client's
        #: ``states[k].model`` holds views of its rows (see :meth:`bind`)
        self.stacks: list[Tensor] = []
        self._bound: list[nn.Module] = []

    def bind(self, models: list[nn.Module]) -> None:
        """Make the clients' local ``models`` views of the rows of :attr:`stacks`, so the
        method's own per-client hooks (``receive``, ``upload``) read and write the stacks
        without copies. Models replaced since the last call are bound again."""
        if len(self._bound) == len(models) and all(a is b for a, b in zip(self._bound, models)):
            return
        self.stacks = self.model.gather(models)
        self.model.bind(self.stacks, models)
        self._bound = list(models)

    @torch.no_grad()
    def load_rows(self, ks: list[int], models: list[nn.Module]) -> None:
        """Load ``models[i]`` into bound client ``ks[i]``'s local model (its stack rows), with
        one copy per parameter (a broadcast one when all of them are the same model)."""
        rows = torch.tensor(ks, device=self.stacks[0].device)
        if all(m is models[0] for m in models):
            for stack, value in zip(self.stacks, self.model.single(models[0])):
                stack.index_put_((rows,), value)
            return
        for stack, source in zip(self.stacks, self.model.gather(models)):
            stack.index_copy_(0, rows, source)

    def stacked(self, models: list[nn.Module]) -> list[Tensor]:
        """``models``' parameters stacked: the bound stacks themselves when ``models`` are the
        clients' bound local models, else a copy."""
        if len(models) == len(self._bound) and all(a is b for a, b in zip(models, self._bound)):
            return [stack.detach() for stack in self.stacks]
        return self.model.gather(models)

    def batch(self, ks: list[int]) -> ClientBatch:
        """The union of clients ``ks`` (cached per participant set)."""
        key = tuple(ks)
        if key not in self._batches:
            if len(self._batches) > 64:
                self._batches.clear()
            self._batches[key] = ClientBatch.of([self.clients[k] for k in ks], ks)
        return self._batches[key]

    def client_updates(self, method: FederatedMethod, ks: list[int], round_: int) -> dict[int, Upload]:
        """:meth:`~fglrepro.fl.method.FederatedMethod.client_update` for all of ``ks`` at once:
        every ``receive``, ``train.local_epochs`` batched steps, every ``upload``."""
        type(method).check_batched_terms()
        self.bind([s.model for s in method.states])
        method.batched_receive(ks, round_, self)
        batch = self.batch(ks)
        terms = method.batched_extra_loss(ks, round_, self)
        epochs = self.federation.train.local_epochs
        masks = self._sequential_masks(batch, self.stacks, epochs) if self.mask_order == "sequential" else None

        def loss(params: list[Tensor], epoch: int) -> Tensor:
            out = self.model.forward(params, batch, training=True, masks=None if masks is None else masks[epoch])
            per_client = self.cross_entropy(out)
            return per_client if terms is None else per_client + terms(out, params)

        losses, grads = train_rows(self.stacks, ks, epochs, loss, self.optimizer)
        if grads is not None:
            self.model.bind(grads, [method.states[k].model for k in ks], attribute="grad")
        uploads = {k: method.upload(k, round_, value) for k, value in zip(ks, losses.tolist())}
        return {k: u for k, u in uploads.items() if u is not None}

    @staticmethod
    def cross_entropy(out: StackedForward) -> Tensor:
        """``[m]`` each client's mean cross-entropy over its training nodes."""
        batch, train = out.batch, out.batch.train_mask
        per_node = F.cross_entropy(out.logits[train], batch.y[train], reduction="none")
        counts = torch.bincount(batch.batch[train], minlength=batch.num_clients).clamp_min(1)
        return batch.per_client_sum(per_node, train) / counts

    def _sequential_masks(self, batch: ClientBatch, params: list[Tensor], epochs: int) -> list[list[Tensor]]:
        """Dropout masks ``[epoch][layer] -> [N, width]`` drawn client by client, epoch by
        epoch, layer by layer, as the sequential path draws them."""
        widths, p = self.model.dropout_widths(params), self.model.dropout
        if p == 0:
            return [None] * epochs
        drawn = [[[F.dropout(params[0].new_ones(int(n), w), p, True) for w in widths] for _ in range(epochs)]
                 for n in batch.sizes.tolist()]
        return [[torch.cat([drawn[i][e][layer] for i in range(batch.num_clients)]) for layer in range(len(widths))]
                for e in range(epochs)]

    def stack(self, params: list[dict[str, Tensor]]) -> list[Tensor]:
        """Named parameter dicts (one per participant) in the engine layout ``[m, ...]``."""
        return self.model.gather(params)

    def train_best_validation(self, models: list[nn.Module], train: TrainConfig, steps: int, patience: int) -> None:
        """:func:`~fglrepro.fl.training.train_best_validation` with ``start_is_candidate`` for
        every client at once, in place: client k trains ``models[k]`` with a fresh optimiser
        and stops after ``patience`` steps without a better validation accuracy; each model
        ends holding its best state."""
        ks = list(range(len(models)))
        batch = self.batch(ks)
        params = self.model.gather(models)
        for p in params:
            p.requires_grad_(True)
        optimizer = StackedOptimizer(params, len(ks), train)
        tracker = BestValidation(len(ks), patience, params[0].device)
        tracker.start(validation_accuracy(self.model, params, batch), params)
        rows = torch.arange(len(ks), device=params[0].device)
        for _ in range(steps):
            out = self.model.forward(params, batch, training=True)
            grads = torch.autograd.grad(self.cross_entropy(out).sum(), params)
            before = [p.detach().clone() for p in params]
            optimizer.step(ks, params, grads)
            with torch.no_grad():
                for p, old in zip(params, before):
                    keep = ~tracker.active.view(-1, *([1] * (p.dim() - 1)))
                    p.copy_(torch.where(keep, old, p))
            if not tracker.check(validation_accuracy(self.model, params, batch), params, rows).any():
                break
        self.model.scatter(tracker.result(params), models)


class BestValidation:
    """The early stopping of :func:`~fglrepro.fl.training.train_best_validation` for ``m``
    clients checked together: each keeps the state of its best validation accuracy and stops
    after ``patience`` checks without a new best (:meth:`start` makes the starting state the
    first candidate, as ``start_is_candidate``).

    Attributes:
        active: ``[m]`` clients still training.
        best: the best checked states, stacked ``[m, ...]`` (``None`` before the first check).
    """

    def __init__(self, num_clients: int, patience: int, device: torch.device) -> None:
        self.patience = patience
        self.best_acc = torch.full((num_clients,), -1.0, dtype=torch.float64, device=device)
        self.stale = torch.zeros(num_clients, dtype=torch.long, device=device)
        self.active = torch.ones(num_clients, dtype=torch.bool, device=device)
        self.best: list[Tensor] | None = None

    @torch.no_grad()
    def start(self, accuracy: Tensor, params: list[Tensor]) -> None:
        """The starting states ``params`` (stacked ``[m, ...]``) of all clients, with validation
        ``accuracy [m]``, as their best so far (no check counted, every client active)."""
        self.best_acc = accuracy.clone()
        self.best = [p.detach().clone() for p in params]

    @torch.no_grad()
    def check(self, accuracy: Tensor, params: list[Tensor], rows: Tensor) -> Tensor:
        """Record a check of clients ``rows [m']`` (all ``m`` at the first check; those
        stopped already are left as they are) with states ``params`` (stacked ``[m', ...]``)
        and validation ``accuracy [m']``; returns which of them go on (``[m']`` boolean)."""
        if self.best is None:
            self.best = [p.new_zeros(self.active.numel(), *p.shape[1:]) for p in params]
        active = self.active[rows]
        better = active & (accuracy > self.best_acc[rows])
        for best, p in zip(self.best, params):
            best[rows[better]] = p[better]
        self.best_acc[rows[better]] = accuracy[better]
        self.stale[rows] = torch.where(better, 0, self.stale[rows] + active.long())
        self.active[rows] = active & (self.stale[rows] < self.patience)
        return self.active[rows]

    def result(self, params: list[Tensor]) -> list[Tensor]:
        """The best checked states, or ``params`` (the last, of all ``m`` clients) if no
        check happened."""
        return self.best if self.best is not None else [p.detach() for p in params]


@torch.no_grad()
def validation_accuracy(model: StackedGCN, params: list[Tensor], batch: ClientBatch) -> Tensor:
    """``[m]`` validation accuracy of each client's model (``params`` stacked ``[m, ...]``, or
    shared: one model for all)."""
    pred = model.forward(params, batch, training=False).logits.argmax(dim=-1)
    return client_accuracy(pred, batch, batch.val_mask)


def client_accuracy(pred: Tensor, batch: ClientBatch, mask: Tensor) -> Tensor:
    """``[m]`` accuracy of ``pred [N]`` on each client's ``mask`` nodes (0 without any), float64."""
    correct = batch.per_client_sum((pred[mask] == batch.y[mask]).double(), mask)
    counts = torch.bincount(batch.batch[mask], minlength=batch.num_clients).double()
    return torch.where(counts > 0, correct / counts.clamp_min(1), torch.zeros_like(correct))


def client_macro_f1(pred: Tensor, batch: ClientBatch, mask: Tensor, num_classes: int, all_classes: bool = False,
                    ) -> Tensor:
    """``[m]`` macro-F1 of each client over the classes present in its labels or predictions
    on its ``mask`` nodes, or over all classes (as :func:`fglrepro.metrics.macro_f1`), float64."""
    m = batch.num_clients
    client, target, guess = batch.batch[mask], batch.y[mask], pred[mask]
    size = m * num_classes
    tp = torch.bincount(client[guess == target] * num_classes + target[guess == target], minlength=size)
    n_pred = torch.bincount(client * num_classes + guess, minlength=size)
    n_true = torch.bincount(client * num_classes + target, minlength=size)
    tp, n_pred, n_true = (t.view(m, num_classes).double() for t in (tp, n_pred, n_true))
    present = (n_pred + n_true) > 0 if not all_classes else torch.ones_like(tp, dtype=torch.bool)
    f1 = 2 * tp / (n_pred + n_true).clamp(min=1)
    count = present.sum(dim=1)
    mean = (f1 * present).sum(dim=1) / count.clamp_min(1)
    return torch.where(count > 0, mean, torch.zeros_like(mean))


class BatchedEvaluator:
    """Tests one model per client in one batched pass when every model is a GCN of the
    engine's architecture and the clients are the federation's (else per client); ``dropout``
    and ``all_classes`` as :class:`~fglrepro.fl.evaluation.EvaluateEach`."""

    def __init__(self, engine: VectorisedEngine, dropout: bool = False, all_classes: bool = False) -> None:
        self.engine = engine
        self.fallback = EvaluateEach(dropout, all_classes)

    def __call__(self, models: list[nn.Module], clients: list[ClientData]) -> list[dict[str, float]]:
        engine = self.engine
        same_clients = len(clients) == len(engine.clients) and all(a is b for a, b in zip(clients, engine.clients))
        if not same_clients or not all(type(m) is GCN for m in models):
            return self.fallback(models, clients)
        batch = engine.batch(list(range(len(clients))))
        with torch.no_grad():
            if all(m is models[0] for m in models):
                params = engine.model.single(models[0])
            else:
                params = engine.stacked(models)
            pred = engine.model.forward(params, batch, training=self.fallback.dropout).logits.argmax(dim=-1)
            num_classes = clients[0].num_classes
            columns = {}
            for split, mask in (("val", batch.val_mask), ("test", batch.test_mask)):
                columns[f"{split}_acc"] = client_accuracy(pred, batch, mask).tolist()
                columns[f"{split}_f1_macro"] = client_macro_f1(
                    pred, batch, mask, num_classes, self.fallback.all_classes).tolist()
        order = ("val_acc", "val_f1_macro", "test_acc", "test_f1_macro")
        return [{key: columns[key][i] for key in order} for i in range(len(clients))]
