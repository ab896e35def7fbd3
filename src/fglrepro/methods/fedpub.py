"""Fed-PUB (Baek et al., ICML 2023, "Personalized Subgraph Federated Learning").

The server draws one random proxy graph. After local training each client uploads its
weights and its *functional embedding* (the mean output of its last graph layer on the proxy
graph); the server sends client i the average of the uploads weighted by
``exp(tau * cos(e_i, e_j))`` (times n_j). Clients train a GNN whose weights are multiplied
element-wise by learnable personalised masks that never leave the client: the paper's GCN
(:class:`MaskedGCN`), or any architecture of the zoo with graph layers (GraphSAGE, GAT, GIN, SGC:
:func:`masked_copy`, for O-pFGL's Tables 19-20, on the per-client path). The paper adds an L1
sparsity penalty on the masks and a proximal term to the received weights; the authors' code
(``models/fedpub/client.py``) and OpenFGL's copy compute both on ``model.state_dict()``, whose
tensors are detached, so the terms change the logged loss and never a gradient. By default
(``penalty_gradients: false``) training follows the code: cross-entropy only, the masks
still pruned below ``l1`` at evaluation; ``penalty_gradients: true`` trains with both terms.

On the vectorised engine (``train.engine`` other than ``sequential``) the clients' local
steps, masks included, run as one batched computation (:class:`StackedMaskedGCN` on the
engine's client union), the functional embeddings of all uploaders are one pass over the
proxy graph, and the masked models are tested as plain GCNs with their masked weights, all
clients in one batched pass.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.utils import parametrize

from fglrepro.config import ConfigError
from fglrepro.fl.aggregation import load_parameters, parameters_of, personalized_average, weighted_average
from fglrepro.fl.clients import normalized_adjacency
from fglrepro.fl.communication import module_bytes
from fglrepro.fl.engine import StackedGCN, StackedOptimizer, train_rows
from fglrepro.fl.method import ExtraLoss, FederatedMethod, Federation, RunSetup, Upload
from fglrepro.fl.training import make_optimizer
from fglrepro.methods import register
from fglrepro.models import GCN, dropout


@dataclass(frozen=True)
class FedPubHparams:
    """Defaults of the authors' code (JinheonBaek/FED-PUB ``parser.py``; the same in
    OpenFGL's ``fedpub_config.py``).

    tau: similarity scale ``norm_scale`` of ``exp(tau * sim)`` (code default 10; the
        authors' Cora script passes 3).
    l1: weight of the L1 norm of the masks; masks with ``|m| < l1`` count as pruned (zero)
        at evaluation, as in the code's ``prune``.
    loc_l2: weight of the proximal term ``sum_l ||theta_l - theta_l^received||_2`` (not
        squared, per weight and bias tensor, from the second round on, as in the code).
    n_proxy, proxy_block_size, proxy_p_in: the proxy graph, ``n_proxy`` blocks of
        ``proxy_block_size`` nodes, edge probability ``proxy_p_in`` inside a block and 0
        across (code: ``random_partition_graph([100] * 5, 0.1, 0)``), features ~ N(0, 1).
    weight_by_size: multiply the similarity weights by the client node counts n_j, so that
        identical embeddings give FedAvg's n_j / N (the authors' code weights by similarity
        only: set False for that).
    penalty_gradients: train with the L1 and proximal terms (the paper's objective); False,
        as in the code, leaves them out of the gradient (they only changed the code's logged
        loss) and out of the reported loss.
    """

    tau: float = 10.0
    l1: float = 1e-3
    loc_l2: float = 1e-3
    n_proxy: int = 5
    proxy_block_size: int = 100
    proxy_p_in: float = 0.1
    weight_by_size: bool = True
    penalty_gradients: bool = False

    def __post_init__(self) -> None:
        for key in ("l1", "loc_l2"):
            if getattr(self, key) < 0:
                raise ConfigError(f"hparams.{key} must be >= 0, got {getattr(self, key)}")
        for key in ("n_proxy", "proxy_block_size"):
            if getattr(self, key) < 1:
                raise ConfigError(f"hparams.{key} must be >= 1, got {getattr(self, key)}")
        if not 0.0 <= self.proxy_p_in <= 1.0:
            raise ConfigError(f"hparams.proxy_p_in must be in [0, 1], got {self.proxy_p_in}")


def apply_mask(weight: Tensor, mask: Tensor, prune_below: float | None = None) -> Tensor:
    """``weight * mask`` (any shape, the same for both); with ``prune_below`` mask entries of smaller
    magnitude count as zero (the code's ``prune``, in evaluation mode)."""
    if prune_below is not None:
        mask = mask.masked_fill(mask.abs() < prune_below, 0.0)
    return weight * mask


class MaskedLinear(nn.Module):
    """``x (W * M)^T (+ b)`` with a learnable mask ``M`` of W's shape, initialised to ones.

    In evaluation mode mask entries with ``|m| < prune_below`` count as zero (the code's
    pruning). Parameters: ``weight [out, in]``, ``mask [out, in]``, optional ``bias [out]``.
    """

    def __init__(self, in_channels: int, out_channels: int, prune_below: float, bias: bool = True) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(out_channels, in_channels))
        self.mask = nn.Parameter(torch.ones(out_channels, in_channels))
        self.bias = nn.Parameter(torch.zeros(out_channels)) if bias else None
        self.prune_below = prune_below

    def forward(self, x: Tensor) -> Tensor:
        return F.linear(x, self.masked_weight(pruned=not self.training), self.bias)

    def masked_weight(self, pruned: bool) -> Tensor:
        """``W * M`` ``[out, in]``, with ``pruned`` the mask entries below ``prune_below`` zero."""
        return apply_mask(self.weight, self.mask, self.prune_below if pruned else None)


class MaskedGCNLayer(nn.Module):
    """GCN layer ``adj (x (W * M)^T) + b`` on a normalised sparse ``adj [n, n]``;
    parameters ``lin.weight``, ``lin.mask``, ``bias`` (the unmasked names are those of
    :class:`torch_geometric.nn.GCNConv`)."""

    def __init__(self, in_channels: int, out_channels: int, prune_below: float) -> None:
        super().__init__()
        self.lin = MaskedLinear(in_channels, out_channels, prune_below, bias=False)
        self.bias = nn.Parameter(torch.zeros(out_channels))

    def forward(self, x: Tensor, adj: Tensor) -> Tensor:
        return torch.sparse.mm(adj, self.lin(x)) + self.bias


class MaskedGCN(nn.Module):
    """:class:`fglrepro.models.GCN` with a personalised mask on every weight matrix.

    Built from a GCN (same layers, dropout, readout, initial weights; masks = 1), so
    its unmasked parameters have the GCN's names and load into it both ways.
    """

    def __init__(self, gcn: GCN, prune_below: float) -> None:
        super().__init__()
        self.convs = nn.ModuleList(
            MaskedGCNLayer(conv.in_channels, conv.out_channels, prune_below) for conv in gcn.convs
        )
        self.readout = None
        if gcn.readout is not None:
            self.readout = MaskedLinear(gcn.readout.in_features, gcn.readout.out_features, prune_below)
        self.dropout = gcn.dropout
        self.to(next(gcn.parameters()).device)
        load_parameters(self, parameters_of(gcn))

    def forward(self, x: Tensor, adj: Tensor, return_hidden: bool = False) -> Tensor | tuple[Tensor, Tensor]:
        """``x [n, F]``, ``adj [n, n]`` -> logits ``[n, C]`` (and the hidden input of the
        last layer with ``return_hidden``), as :meth:`fglrepro.models.GCN.forward`."""
        hidden = x
        for i, conv in enumerate(self.convs):
            if i > 0:
                x = dropout(F.relu(x), self.dropout, self.training)
            hidden = x
            x = conv(x, adj)
        if self.readout is not None:
            hidden = dropout(F.relu(x), self.dropout, self.training)
            x = self.readout(hidden)
        return (hidden, x) if return_hidden else x

    @torch.no_grad()
    def pruned_gcn_parameters(self) -> dict[str, Tensor]:
        """The parameters (named as in :class:`~fglrepro.models.GCN`) of the GCN that computes
        this model's evaluation-mode outputs: every weight times its pruned mask."""
        params = shared_parameters(self)
        for name, module in self.named_modules():
            if isinstance(module, MaskedLinear):
                params[f"{name}.weight"] = module.masked_weight(pruned=True)
        return params


class WeightMask(nn.Module):
    """Parametrisation ``W -> W * M`` of a weight with a learnable mask ``M`` of its shape,
    initialised to ones; in evaluation mode entries with ``|m| < prune_below`` count as zero
    (as :class:`MaskedLinear`)."""

    def __init__(self, weight: Tensor, prune_below: float) -> None:
        super().__init__()
        self.mask = nn.Parameter(torch.ones_like(weight))
        self.prune_below = prune_below

    def forward(self, weight: Tensor) -> Tensor:
        return apply_mask(weight, self.mask, None if self.training else self.prune_below)


def masked_copy(model: nn.Module, prune_below: float) -> nn.Module:
    """A copy of ``model`` (any architecture of the zoo) whose every weight matrix (a parameter
    named ``weight`` with two or more dimensions) reads ``W * M`` (:class:`WeightMask`, through
    :mod:`torch.nn.utils.parametrize`); biases and attention vectors stay unmasked, as in FED-PUB's
    masked layers. Its parameter names, read through :func:`shared_name`, are ``model``'s."""
    masked = copy.deepcopy(model)
    for module in list(masked.modules()):
        weight = module._parameters.get("weight")
        if weight is not None and weight.dim() >= 2:
            parametrize.register_parametrization(module, "weight", WeightMask(weight, prune_below))
    return masked


def is_mask(name: str) -> bool:
    """Whether parameter ``name`` is a personalised mask."""
    return name.split(".")[-1] == "mask"


def shared_name(name: str) -> str:
    """The plain model's name of a masked model's (not mask) parameter: a parametrised weight
    ``<module>.parametrizations.weight.original`` is ``<module>.weight``."""
    return name.replace(".parametrizations.weight.original", ".weight")


def shared_parameters(model: nn.Module) -> dict[str, Tensor]:
    """Detached copy of a masked model's communicated parameters (all but the masks), under
    the plain model's names."""
    return {shared_name(name): p.detach().clone() for name, p in model.named_parameters() if not is_mask(name)}


def masks_of(model: nn.Module) -> list[Tensor]:
    """The mask parameters of a masked model (they stay on the client)."""
    return [p for name, p in model.named_parameters() if is_mask(name)]


@torch.no_grad()
def load_shared(model: nn.Module, params: dict[str, Tensor]) -> None:
    """Copy a plain model's ``params`` into the masked ``model`` in place (masks kept)."""
    for name, p in model.named_parameters():
        if not is_mask(name) and shared_name(name) in params:
            p.copy_(params[shared_name(name)])


#: architectures Fed-PUB masks and embeds (:func:`masked_copy`; SGC without READOUT, see
#: :meth:`FedPub.functional_embedding`).
MASKED_ARCHS = ("gcn", "gat", "sage", "gin", "sgc")


def proxy_graph(num_features: int, hparams: FedPubHparams, generator: torch.Generator,
                device: torch.device) -> tuple[Tensor, Tensor]:
    """The server's random proxy graph: features ``[P, F]`` ~ N(0, 1) and its normalised
    adjacency ``[P, P]``, ``P = n_proxy * proxy_block_size``, drawn from ``generator``."""
    seed = int(torch.randint(2**62, (1,), generator=generator))
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        edge_index = block_model_edges(hparams.n_proxy, hparams.proxy_block_size, hparams.proxy_p_in)
    num_nodes = hparams.n_proxy * hparams.proxy_block_size
    x = torch.randn(num_nodes, num_features, generator=generator)
    return x.to(device), normalized_adjacency(edge_index, num_nodes).to(device)


def block_model_edges(num_blocks: int, block_size: int, p_in: float) -> Tensor:
    """``edge_index [2, E]`` of an undirected stochastic block model: ``num_blocks`` blocks of
    ``block_size`` nodes, each pair inside a block linked with probability ``p_in``, no pair
    across; both directions, sorted by (row, column). The edges of PyG's
    ``stochastic_blockmodel_graph([block_size] * num_blocks, eye * p_in)`` (the authors' proxy
    graph) from the same draws of torch's global generator, without importing PyG (seconds
    per training process)."""
    num_nodes = num_blocks * block_size
    block = torch.arange(num_blocks).repeat_interleave(block_size)
    probs = torch.eye(num_blocks) * p_in
    row, col = torch.combinations(torch.arange(num_nodes), r=2).t()
    linked = torch.bernoulli(probs[block[row], block[col]]).to(torch.bool)
    row, col = row[linked], col[linked]
    edge_index = torch.stack([torch.cat([row, col]), torch.cat([col, row])])
    return edge_index[:, torch.argsort(edge_index[0] * num_nodes + edge_index[1])]


class StackedMaskedGCN(StackedGCN):
    """:class:`MaskedGCN` over client-stacked parameters: the engine's
    :class:`~fglrepro.fl.engine.StackedGCN` of the GCN inside it, each mask stacked in the
    layout of its weight (``[m, in, out]``). Its forward pass reads the weights of
    :meth:`masked` parameters."""

    def __init__(self, template: MaskedGCN) -> None:
        super().__init__(template)
        #: positions in ``names`` of the masks and of the shared (communicated) parameters
        self.mask_positions = [j for j, name in enumerate(self.names) if is_mask(name)]
        self.shared_positions = [j for j, name in enumerate(self.names) if not is_mask(name)]
        #: position of each layer's mask, in forward order (as ``layers``)
        self.layer_masks = [self.names.index(self.names[w].removesuffix("weight") + "mask") for w, _ in self.layers]

    @staticmethod
    def _to_engine(name: str, value: Tensor) -> Tensor:
        """Weights and masks transposed to ``[in, out]`` (the engine transposes weights only)."""
        return value.transpose(-1, -2) if is_mask(name) or name.endswith("weight") else value

    def masked(self, params: list[Tensor], prune_below: float | None = None) -> list[Tensor]:
        """``params`` with every weight replaced by weight * mask (``[m, in, out]``); with
        ``prune_below`` mask entries of smaller magnitude count as zero (evaluation mode)."""
        out = list(params)
        for (w, _), j in zip(self.layers, self.layer_masks):
            out[w] = apply_mask(params[w], params[j], prune_below)
        return out


def personalized_weights(embeddings: Tensor, sizes: Tensor, tau: float, weight_by_size: bool) -> Tensor:
    """Row-stochastic ``[m, m]`` matrix ``a_ij ∝ exp(tau * cos(e_i, e_j)) (* n_j)``.

    Args:
        embeddings: ``[m, D]`` functional embeddings of the m uploading clients.
        sizes: ``[m]`` client node counts n_j.
    """
    unit = F.normalize(embeddings.double(), dim=1)
    scores = torch.exp(tau * (unit @ unit.T))
    if weight_by_size:
        scores = scores * sizes.double().to(scores.device).view(1, -1)
    return scores / scores.sum(dim=1, keepdim=True)


@register("fedpub")
class FedPub(FederatedMethod):
    """Fed-PUB on the shared round loop.

    Client state: ``model`` is the client's masked model (:class:`MaskedGCN`, else
    :func:`masked_copy`; masks included, tested at both evaluation stages), ``received`` the
    server's personalised (plain) model for the client
    (``None`` until the client first uploads). The server also keeps ``global_model``
    (FedAvg of the last uploads), which clients without a personalised model receive, as
    in the authors' code.
    """

    label = "Fed-PUB"
    Hparams = FedPubHparams
    has_server_models = True
    vectorised = True

    def __init__(self, federation: Federation, hparams: FedPubHparams) -> None:
        super().__init__(federation, hparams)
        self.global_model = copy.deepcopy(federation.model)
        masked = MaskedGCN if isinstance(federation.model, GCN) else masked_copy
        for state in self.states:
            state.model = masked(federation.model, hparams.l1)
        device = self.clients[0].x.device
        self.proxy_x, self.proxy_adj = proxy_graph(
            self.clients[0].x.size(1), hparams, federation.generator, device
        )
        models = [state.model for state in self.states]
        if self.batched:
            self.stacked = StackedMaskedGCN(models[0])
            #: the clients' masked models stacked ``[K, ...]``; ``states[k].model`` holds views of row k
            self.stacks = self.stacked.gather(models)
            self.stacked.bind(self.stacks, models)
            self.optimizer = StackedOptimizer(self.stacks, len(models), federation.train)
            #: per client, the plain GCN tested in place of its masked model
            self.pruned_models = [copy.deepcopy(federation.model) for _ in models]
        else:
            for state in self.states:
                state.optimizer = make_optimizer(state.model, federation.train)

    @property
    def batched(self) -> bool:
        """Whether rounds run batched over clients: on the vectorised engine, unless
        ``train.engine`` is ``sequential``."""
        return self.federation.engine is not None and self.federation.train.engine != "sequential"

    @classmethod
    def check_protocol(cls, hparams: FedPubHparams, setup: RunSetup) -> None:
        model = setup.model
        if model.arch not in MASKED_ARCHS or model.jk is not None or (model.arch == "sgc" and model.readout):
            raise ConfigError(f"fedpub masks the weights of a model.arch in {list(MASKED_ARCHS)} without "
                              f"model.jk (sgc also without model.readout); got arch {model.arch!r}, "
                              f"jk {model.jk!r}, readout {model.readout}")

    def received_model(self, k: int) -> nn.Module:
        """The server model client ``k`` receives: its personalised one, else the global one."""
        personal = self.states[k].received
        return self.global_model if personal is None else personal

    def receive(self, k: int, round_: int) -> None:
        """Load the received weights into client ``k``'s model (masks kept)."""
        load_shared(self.states[k].model, parameters_of(self.received_model(k)))

    def extra_loss(self, k: int, round_: int) -> ExtraLoss | None:
        """``l1 * sum ||M||_1 + loc_l2 * sum_l ||theta_l - received_l||_2`` (no proximal
        term in the first round, as in the code) with ``penalty_gradients``, else none."""
        if not self.hparams.penalty_gradients:
            return None
        l1, loc_l2 = self.hparams.l1, self.hparams.loc_l2
        proximal = loc_l2 > 0 and round_ > 1
        received = parameters_of(self.received_model(k))

        def loss(model: nn.Module) -> Tensor:
            total = l1 * sum(m.abs().sum() for m in masks_of(model))
            if proximal:
                total = total + loc_l2 * sum(
                    torch.linalg.vector_norm(p - received[shared_name(name)])
                    for name, p in model.named_parameters() if not is_mask(name)
                )
            return total

        return loss

    def client_updates(self, ks: list[int], round_: int) -> dict[int, Upload]:
        """Every participant's :meth:`~FederatedMethod.client_update` in turn, or with
        :attr:`batched` :meth:`batched_client_updates`."""
        if self.batched:
            return self.batched_client_updates(ks, round_)
        return {k: self.client_update(k, round_) for k in ks}

    def batched_client_updates(self, ks: list[int], round_: int) -> dict[int, Upload]:
        """The participants' rounds as one computation: every :meth:`receive`,
        ``train.local_epochs`` steps of all their masked GCNs on the engine's union of their
        graphs (each client's loss its own: cross-entropy, plus :meth:`batched_penalties` with
        ``penalty_gradients``; one stacked Adam step), then :meth:`functional_embeddings` and
        the uploads."""
        engine = self.federation.engine
        for k in ks:
            self.receive(k, round_)
        batch = engine.batch(ks)
        penalties = self.batched_penalties(ks, round_) if self.hparams.penalty_gradients else None

        def loss(params: list[Tensor], _epoch: int) -> Tensor:
            out = self.stacked.forward(self.stacked.masked(params), batch, training=True)
            cross_entropy = engine.cross_entropy(out)
            return cross_entropy if penalties is None else cross_entropy + penalties(params)

        losses, _ = train_rows(self.stacks, ks, self.federation.train.local_epochs, loss, self.optimizer)
        embeddings = self.functional_embeddings(ks)
        return {k: self.make_upload(k, loss, embedding)
                for k, loss, embedding in zip(ks, losses.tolist(), embeddings)}

    def batched_penalties(self, ks: list[int], round_: int) -> Callable[[list[Tensor]], Tensor]:
        """:meth:`extra_loss` of the participants ``ks``: stacked parameters -> ``[m]``."""
        l1, loc_l2 = self.hparams.l1, self.hparams.loc_l2
        proximal = loc_l2 > 0 and round_ > 1
        engine = self.federation.engine
        anchors = {}
        if proximal:
            anchors = dict(zip(engine.model.names, engine.model.gather([self.received_model(k) for k in ks])))

        def penalties(params: list[Tensor]) -> Tensor:
            total = l1 * sum(params[j].abs().flatten(1).sum(dim=1) for j in self.stacked.mask_positions)
            if proximal:
                total = total + loc_l2 * sum(
                    torch.linalg.vector_norm((params[j] - anchors[self.stacked.names[j]]).flatten(1), dim=1)
                    for j in self.stacked.shared_positions
                )
            return total

        return penalties

    @torch.no_grad()
    def functional_embedding(self, model: nn.Module) -> Tensor:
        """Mean over proxy nodes ``[D]`` of the last graph layer's output before its activation
        (FED-PUB's ``is_proxy`` output; eval mode): the logits of a model without READOUT, else
        the output of its last convolution (``convs[-1]``)."""
        model.eval()
        if model.readout is None:
            return model(self.proxy_x, self.proxy_adj).mean(dim=0)
        outputs = []
        hook = model.convs[-1].register_forward_hook(lambda _module, _inputs, out: outputs.append(out))
        try:
            model(self.proxy_x, self.proxy_adj)
        finally:
            hook.remove()
        return outputs[0].mean(dim=0)

    @torch.no_grad()
    def functional_embeddings(self, ks: list[int]) -> Tensor:
        """:meth:`functional_embedding` of clients ``ks``, ``[m, D]``: the proxy graph's P
        nodes go through all m clients' GCN layers at once (node-major ``[P, m, H]``, the
        first layer one product with the clients' weights side by side)."""
        rows = torch.tensor(ks, device=self.stacks[0].device)
        params = self.stacked.masked([s.index_select(0, rows) for s in self.stacks], self.hparams.l1)
        num_nodes, m = self.proxy_x.size(0), len(ks)
        h = self.proxy_x
        for i, (w, b) in enumerate(self.stacked.layers[: self.stacked.num_convs]):
            weight, bias = params[w], params[b]
            if i == 0:
                h = h @ weight.transpose(0, 1).reshape(weight.size(1), -1)
            else:
                h = torch.bmm(F.relu(h).transpose(0, 1), weight).transpose(0, 1).reshape(num_nodes, -1)
            h = torch.sparse.mm(self.proxy_adj, h).view(num_nodes, m, -1) + bias
        return h.mean(dim=0)

    def upload(self, k: int, round_: int, loss: float) -> Upload:
        """The shared (unmasked) parameters and the functional embedding."""
        return self.make_upload(k, loss, self.functional_embedding(self.states[k].model))

    def make_upload(self, k: int, loss: float, embedding: Tensor) -> Upload:
        """Client ``k``'s upload: its shared parameters and functional ``embedding [D]``."""
        return Upload(params=shared_parameters(self.states[k].model), extras={"embedding": embedding},
                      weight=float(self.clients[k].num_nodes), loss=loss)

    def server_update(self, round_: int, uploads: dict[int, Upload]) -> None:
        ids = sorted(uploads)
        states = [uploads[k].params for k in ids]
        sizes = torch.tensor([uploads[k].weight for k in ids])
        load_parameters(self.global_model, weighted_average(states, sizes.tolist()))
        embeddings = torch.stack([uploads[k].extras["embedding"] for k in ids])
        weights = personalized_weights(embeddings, sizes, self.hparams.tau, self.hparams.weight_by_size)
        for k, state in zip(ids, personalized_average(states, weights)):
            if self.states[k].received is None:
                self.states[k].received = copy.deepcopy(self.global_model)
            load_parameters(self.states[k].received, state)

    def on_download(self, k: int, round_: int) -> None:
        self.receive(k, round_)

    def download_bytes(self, k: int) -> int:
        return module_bytes(self.received_model(k))

    def eval_model(self, k: int, stage: str) -> nn.Module:
        """Client ``k``'s masked model; with :attr:`batched` the plain GCN with its pruned
        masked weights (the same outputs), which the batched evaluator tests with the others."""
        if not self.batched:
            return self.states[k].model
        load_parameters(self.pruned_models[k], self.states[k].model.pruned_gcn_parameters())
        return self.pruned_models[k]

    def server_models(self) -> list[nn.Module]:
        personal = [s.received for s in self.states if s.received is not None]
        return personal if len(personal) == len(self.clients) else personal + [self.global_model]
