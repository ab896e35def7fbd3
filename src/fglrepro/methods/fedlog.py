"""FedLoG (Kim et al., ICLR 2025): global synthetic data from clients' synthetic nodes for local generalisation.

The paper is not in ``../shared/papers``; this follows the O-pFGL paper's description (App. I: "Each
client pretrains a prompt generator and synthesizes nodes. The server aggregates the model and
synthesized nodes and generates global synthetic data. Then, each client trains its model on local
graph data and global synthetic data ... we limit the upload-download communication round to one
round") and, for the details, the authors' public code (sung-won-kim/FedLoG: ``model/client.py``,
``model/server.py``, ``embedder/*.py``, ``argument.py``).

Client k keeps an embedder ``E`` (``[F] -> [d]``), two learnable synthetic node sets, head ``X^h`` and
tail ``X^t`` (``[C P, F]`` each: P nodes per class, no edges), one LayerNorm per branch and a neighbour
("prompt") generator ``g`` (MLP ``F -> 256 -> 512 -> F``, tanh). A node v is classified by its distance
to the class prototypes (mean embedding of the P synthetic nodes of a class) of both branches:

    p_b(v) = softmax_c(-|| LN_b(E(x)_v) - mean_p E(X^b_{c,p}) ||^2),  alpha_v = sigmoid(deg_v - (tau + 1)),
    p(v) = alpha_v p_h(v) + (1 - alpha_v) p_t(v)

so high-degree ("head", reliable) nodes train the head branch. First round only: ``g`` is pretrained
(``generator_epochs``) to predict the mean neighbour features of each labelled node (MSE) and to make
the 2-node graph (node, generated neighbour) give a random GCN the gradients the real graph gives
(mean over ``matching_draws`` GCNs per epoch); then ``E`` with a linear head is pretrained by
cross-entropy (best local validation accuracy, patience ``pretrain_patience``). Every round the client
trains ``train.local_epochs`` epochs of minibatches (``batch_size``) of its labelled nodes on

    L = NLL(alpha log p_h + (1 - alpha) log p_t) + (||X^h|| + ||X^t||) / 2 [+ L_global],

with ``L_global`` once it holds global synthetic data ``G`` (labels ``y_G``): each row is moved
towards the mean row by its class's scaler ``s_c`` (``G + s_c (mean(G) - G)``), gets a neighbour from
its class's generator, and the 2-node graphs' embeddings are classified with the half-half branch
mixture (NLL); ``s_c`` rises by ``scaler_step`` while the client classifies class c of ``G`` with
accuracy > ``scaler_accuracy``, else falls (clipped to [0, 1]). The client uploads ``E``, the head,
the LayerNorms, ``X^h``, ``X^t``, its class shares ``q_k`` and (first round) ``g``.

The server averages the modules uniformly (the code's ``average_parameters``), builds the global
synthetic data from the head synthetic nodes only: ``G_{c,p} = sum_k w_k^c X^h_k[c, pi_k(p)]`` with
``w_k^c = q_k^c / sum_k' q_k'^c`` (``1/K`` for a class no client has) and a random permutation
``pi_k`` of each client's P slots, and (first round) one generator per class, the client generators
averaged with weights ``w_k^c``. A client receiving them loads the averaged modules (keeping its own
synthetic nodes and scalers) and trains as above. ``on_run_end``: after the last download every
client trains once more with the global data (the code's next round), so with ``train.rounds = 1``
this is O-pFGL's one-round FedLoG: upload, download, local training. ``eval_model`` is the client's
own model (the code tests each client's trained model); studies use ``evaluation.model: local``.

Unstated details and the choices made here (code = the authors' repository):
  * backbone: the code's 2-layer GraphSAGE (128 hidden, 64 out, dropout 0.5) is the study's model
    (:data:`BACKBONES`: GCN, GraphSAGE, GAT or GIN; its hidden width, depth and dropout) with output width
    ``embed_dim`` (code: 64). The generator's matching draws random GCNs whatever the backbone (below;
    the code draws random copies of its GraphSAGE).
  * optimiser: the study's optimiser and learning rate for the modules (code: Adam, lr 0.001, weight
    decay 5e-4); Adam with ``synthetic_lr`` (``None``: the study's lr) for the synthetic features,
    ``generator_lr`` 0.01 for the generator (code); new optimisers at every training call (code).
  * task adaptation: the code's ``clsf`` modules add a message-passing update that the code
    aggregates onto the synthetic-node rows and so never reaches the query embeddings (``trans[N_s:]``
    is zero); their effective map is their LayerNorm, which is what is kept (no MLP parameters).
  * generator pretraining: the code divides the accumulated matching loss by the number of draws
    inside the loop (geometric down-weighting of earlier draws); here the mean over draws. Matching
    is on the random GCN's parameters (not its random linear head), without dropout (the study's GCN
    has none). The 2-node graph with GCN normalisation averages both rows, so the centre's embedding
    is the GCN's layers applied to ``(x_v + g(x_v)) / 2`` (checked against the GCN in the tests).
    Labelled nodes without neighbours are left out of the MSE (the code takes the mean of an empty
    set: NaN). No early stop (the code's patience never grows).
  * pretraining is selected by local validation accuracy (the code selects by test accuracy).
  * class generators: the code builds them on the server but its clients use freshly initialised
    ones (never loaded); here clients use the server's, in eval mode (no dropout).
  * unused computations of the code left out: the clients' weighted global prototypes (computed,
    never used) and the class balancing of ``G`` (a no-op for P >= 3).
  * ``q_k``: class shares of the client's labelled nodes (code); degrees count the client's local edges.
  * minibatches: ``max(1, floor(m / B))`` batches of B labelled nodes drawn without replacement per
    epoch, the remainder unused that epoch (code); every step embeds the whole local graph (code).
  * prediction: training uses the mixture of log-probabilities (code's loss), the tested output is
    the log of the mixture of probabilities (code's evaluation).
  * random GCNs of the matching: Glorot-uniform weights and zero biases (the GCN's initialisation),
    linear head uniform in ``+-1/sqrt(C)`` (the code's ``Linear``).
  * the post-download training of the last round (``on_run_end``) runs ``train.local_epochs`` epochs,
    like every round's; the class scalers stay on the client (the code sends them to the server and
    back to the same client); the tail synthetic nodes are uploaded (code) but unused by the server.

Cost: not on the vectorised engine (the local step is not a GCN's cross-entropy: prototype distances,
synthetic nodes, global data); within a client the random GCNs of an epoch run as one batched
computation, the first layer's gradient distance is computed without forming the ``[F, h]`` gradients
(:func:`matching_loss`; its real-graph term, constant in the generator, by sparse products), and a
class's generated neighbours are recomputed only when its scaler moved. Optimisers are
:class:`~fglrepro.fl.kernel_optimizer.KernelOptimizer` (torch's Adam kernel bit for bit, without the
second of CPU that constructing a ``torch.optim.Adam`` costs). Every change keeps the numbers bit for bit:
the local training is chaotic (generators 1e-5 apart, from such rounding, end ~0.15 apart in the
trained weights after the download), so faster forms that only round differently (sparse first layers of
the generator and the 2-node graphs, fused Adam) are not used. Measured on Cora, Louvain+ 10 clients,
seed 0 (``benchmarks/method_costs.py``, whole process): ~77 CPU s, ~29x FedAvg+ft (~85x its training
loop alone), most of it in the generator pretraining (per client 100 epochs x 20 fresh random GCNs with
``F x 64`` first layers: 1.8M random numbers per epoch, dense products with the generated features
forward and in the double backward) and in the post-download training (class generators rerun on the
global rows each step). The paper's hyperparameters fix that work, so the 3x budget of issue 29 is out
of reach here.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fglrepro.config import ConfigError
from fglrepro.fl.clients import ClientData
from fglrepro.fl.communication import tensor_bytes
from fglrepro.fl.kernel_optimizer import KernelOptimizer
from fglrepro.fl.method import FederatedMethod, Federation, RunSetup, Upload
from fglrepro.fl.ticker import Ticker
from fglrepro.fl.training import make_optimizer
from fglrepro.methods import register
from fglrepro.models import GCN, SPARSE_BELOW, ConvStack, PyGNet
from fglrepro.sparse import SparseRows, sparse_matmul

#: parameters of :class:`FedLoGModel` that are averaged by the server (the synthetic nodes are not)
SHARED = ("embedder.", "classifier.", "norm_head.", "norm_tail.")
#: study architectures the embedder can be (:func:`backbone`)
BACKBONES = ("gcn", "sage", "gat", "gin")


@dataclass(frozen=True)
class FedLoGHparams:
    """Defaults of the authors' ``argument.py`` and code unless noted.

    Attributes:
        num_proto: P, synthetic nodes per class in each branch (20).
        embed_dim: d, the embedder's output width (64).
        head_degree: tau, the tail-degree threshold of ``alpha = sigmoid(deg - (tau + 1))`` (3).
        pretrain_epochs, pretrain_patience: embedder pretraining (100, 10).
        generator_epochs, matching_draws: generator pretraining epochs and random GCNs per epoch (100, 20).
        generator_lr: Adam learning rate of the generator (0.01).
        batch_size: labelled nodes per local step (64).
        synthetic_lr: Adam learning rate of the synthetic features (``None``: the study's ``train.lr``).
        norm_weight, global_weight: weights of the feature-norm term and of ``L_global`` (1, 1).
        scaler_step, scaler_accuracy: the class scalers' step and accuracy threshold (0.001, 0.8).
    """

    num_proto: int = 20
    embed_dim: int = 64
    head_degree: int = 3
    pretrain_epochs: int = 100
    pretrain_patience: int = 10
    generator_epochs: int = 100
    matching_draws: int = 20
    generator_lr: float = 0.01
    batch_size: int = 64
    synthetic_lr: float | None = None
    norm_weight: float = 1.0
    global_weight: float = 1.0
    scaler_step: float = 0.001
    scaler_accuracy: float = 0.8

    def __post_init__(self) -> None:
        for name in ("num_proto", "embed_dim", "batch_size", "matching_draws"):
            if getattr(self, name) < 1:
                raise ConfigError(f"hparams of fedlog.{name} must be >= 1, got {getattr(self, name)}")
        if self.norm_weight < 0 or self.global_weight < 0:
            raise ConfigError(f"hparams of fedlog.norm_weight and global_weight must be >= 0, got "
                              f"{self.norm_weight}, {self.global_weight}")


def node_degrees(adj: Tensor) -> Tensor:
    """``[n]`` neighbours of each node (stored entries of the CSR row, the self-loop not counted)."""
    rows = adj.crow_indices()
    cols = adj.col_indices()
    counts = (rows[1:] - rows[:-1]).to(torch.float32)
    row_of = torch.repeat_interleave(torch.arange(adj.size(0), device=cols.device), rows[1:] - rows[:-1])
    loops = torch.zeros(adj.size(0), device=cols.device).index_add_(0, row_of, (row_of == cols).float())
    return counts - loops


def identity_adjacency(n: int, device: torch.device) -> Tensor:
    """``[n, n]`` sparse CSR identity (graph of nodes without edges)."""
    index = torch.arange(n, device=device)
    return torch.sparse_coo_tensor(torch.stack([index, index]), torch.ones(n, device=device), (n, n)).to_sparse_csr()


def pair_adjacency(m: int, device: torch.device) -> Tensor:
    """``[2m, 2m]`` GCN-normalised operator of m 2-node graphs (node i and node m + i, one edge each,
    self-loops): every entry 1/2."""
    index = torch.arange(m, device=device)
    rows = torch.cat([index, index, index + m, index + m])
    cols = torch.cat([index, index + m, index, index + m])
    values = torch.full((4 * m,), 0.5, device=device)
    return torch.sparse_coo_tensor(torch.stack([rows, cols]), values, (2 * m, 2 * m)).coalesce().to_sparse_csr()


class NeighbourGenerator(nn.Module):
    """The prompt generator: ``[m, F] -> [m, F]`` generated neighbour features (tanh)."""

    def __init__(self, num_features: int) -> None:
        super().__init__()
        self.fc1 = nn.Linear(num_features, 256)
        self.fc2 = nn.Linear(256, 512)
        self.fc3 = nn.Linear(512, num_features)

    def forward(self, x: Tensor) -> Tensor:
        h = F.relu(self.fc2(F.relu(self.fc1(x))))
        return torch.tanh(self.fc3(F.dropout(h, 0.5, self.training)))


def class_generator_forward(weights: list[Tensor], x: Tensor) -> Tensor:
    """Per-class generators (``weights``: the generator's parameters stacked over C classes,
    ``[C, out, in]`` / ``[C, out]``, eval mode) on ``x [C, P, F]`` -> ``[C, P, F]``."""
    w1, b1, w2, b2, w3, b3 = weights
    h = F.relu(torch.baddbmm(b1.unsqueeze(1), x, w1.transpose(1, 2)))
    h = F.relu(torch.baddbmm(b2.unsqueeze(1), h, w2.transpose(1, 2)))
    return torch.tanh(torch.baddbmm(b3.unsqueeze(1), h, w3.transpose(1, 2)))


class FedLoGModel(nn.Module):
    """A client's classifier: embedder, pretraining head, branch LayerNorms and synthetic nodes
    ``syn_head``, ``syn_tail [C P, F]`` (labels ``c`` in rows ``c P .. c P + P - 1``). ``forward(x, adj)``
    returns ``[n, C]`` log of the degree-weighted branch mixture of probabilities."""

    def __init__(self, embedder: nn.Module, num_features: int, num_classes: int, embed_dim: int, num_proto: int,
                 head_degree: int, generator: torch.Generator) -> None:
        super().__init__()
        self.embedder = embedder
        self.classifier = nn.Linear(embed_dim, num_classes)
        self.norm_head = nn.LayerNorm(embed_dim)
        self.norm_tail = nn.LayerNorm(embed_dim)
        rows = num_classes * num_proto
        bound = math.sqrt(6.0 / (rows + num_features))
        self.syn_head = nn.Parameter((torch.rand(rows, num_features, generator=generator) * 2 - 1) * bound)
        self.syn_tail = nn.Parameter((torch.rand(rows, num_features, generator=generator) * 2 - 1) * bound)
        self.num_classes, self.num_proto, self.head_degree = num_classes, num_proto, head_degree

    def prototypes(self) -> tuple[Tensor, Tensor]:
        """``[C, d]`` mean embedding of each class's synthetic nodes, head and tail branch."""
        rows = torch.cat([self.syn_head, self.syn_tail])
        both = self.embedder(rows, identity_adjacency(rows.size(0), rows.device))
        return tuple(part.view(self.num_classes, self.num_proto, -1).mean(dim=1) for part in both.chunk(2))

    def branch_log_probs(self, h: Tensor, prototypes: tuple[Tensor, Tensor]) -> tuple[Tensor, Tensor]:
        """``[m, C]`` log-probabilities of embeddings ``h [m, d]`` in the head and the tail branch."""
        head = -torch.cdist(self.norm_head(h), prototypes[0]).pow(2)
        tail = -torch.cdist(self.norm_tail(h), prototypes[1]).pow(2)
        return F.log_softmax(head, dim=-1), F.log_softmax(tail, dim=-1)

    def head_weight(self, adj: Tensor) -> Tensor:
        """``[n, 1]`` alpha of each node of the graph ``adj``."""
        return torch.sigmoid(node_degrees(adj) - (self.head_degree + 1)).unsqueeze(1)

    def forward(self, x: Tensor, adj: Tensor) -> Tensor:
        head, tail = self.branch_log_probs(self.embedder(x, adj), self.prototypes())
        alpha = self.head_weight(adj)
        return torch.logaddexp(alpha.log() + head, torch.log1p(-alpha) + tail)


def global_synthetic(heads: Tensor, shares: Tensor, generator: torch.Generator) -> Tensor:
    """``[C, P, F]`` global synthetic features from the clients' head synthetic nodes ``heads [K, C, P, F]``
    and class shares ``shares [K, C]``: each client's P slots permuted (one permutation per client), then
    ``G_c = sum_k w_k^c X_k[c]`` with ``w_k^c = q_k^c / sum_k' q_k'^c`` (``1/K`` for a class no client has)."""
    num = heads.size(0)
    perms = [torch.randperm(heads.size(2), generator=generator) for _ in range(num)]
    permuted = torch.stack([heads[k][:, perms[k].to(heads.device)] for k in range(num)])
    return (class_weights(shares)[:, :, None, None] * permuted).sum(dim=0)


def class_weights(shares: Tensor) -> Tensor:
    """``[K, C]`` ``w_k^c = q_k^c / sum_k' q_k'^c``, ``1/K`` in a column that sums to 0."""
    totals = shares.sum(dim=0, keepdim=True)
    return torch.where(totals > 0, shares / totals.clamp_min(1e-12), torch.full_like(shares, 1.0 / shares.size(0)))


def mean_neighbour_features(client: ClientData, nodes: Tensor) -> tuple[Tensor, Tensor]:
    """``[m, F]`` mean features of the neighbours (self excluded) of ``nodes`` and ``[m]`` whether a node
    has any."""
    edges = client.edge_index
    keep = edges[0] != edges[1]
    rows, cols = edges[0][keep], edges[1][keep]
    n = client.num_nodes
    sums = client.x.new_zeros(n, client.x.size(1)).index_add_(0, rows, client.x[cols])
    counts = torch.bincount(rows, minlength=n).to(client.x.dtype)
    return sums[nodes] / counts[nodes].clamp_min(1).unsqueeze(1), counts[nodes] > 0


def backbone(template: ConvStack, num_features: int, embed_dim: int) -> ConvStack:
    """A fresh embedder ``[n, F] -> [n, embed_dim]`` of the study model's architecture, hidden width, depth
    and dropout (``template``: a :class:`~fglrepro.models.GCN` or :class:`~fglrepro.models.PyGNet`)."""
    if isinstance(template, GCN):
        return GCN(num_features, template.hidden, embed_dim, layers=template.layers, dropout=template.dropout)
    return PyGNet(template.arch, num_features, template.hidden, embed_dim, layers=template.layers,
                  dropout=template.dropout)


def random_gcn_weights(widths: list[int], draws: int, generator: torch.Generator, device) -> list[Tensor]:
    """``draws`` Glorot-initialised GCNs with widths ``[F, ..., d]``: per layer ``W [D, in, out]`` and
    zero ``b [D, out]`` (all but the first layer's ``W`` requiring gradient)."""
    out = []
    for i, (a, b) in enumerate(zip(widths[:-1], widths[1:])):
        bound = math.sqrt(6.0 / (a + b))
        weight = torch.empty(draws, a, b).uniform_(-bound, bound, generator=generator)
        out.append(weight.to(device).requires_grad_(i > 0))
        out.append(torch.zeros(draws, b, device=device, requires_grad=True))
    return out


def side_by_side(weight: Tensor) -> Tensor:
    """``[in, D out]``: the D first-layer weights ``weight [D, in, out]`` side by side."""
    return torch.cat(weight.unbind(0), dim=1)


def first_layer(weights: list[Tensor], x: Tensor | SparseRows, adj: Tensor | None, flat: Tensor | None = None
                ) -> Tensor:
    """``[n, D, h]`` first-layer pre-activations ``A x W_1 + b_1`` of D GCNs (``adj`` ``None``: no propagation);
    ``flat``: :func:`side_by_side` of ``W_1`` when already built."""
    w = weights[0]
    flat = side_by_side(w) if flat is None else flat
    h = sparse_matmul(x, flat) if isinstance(x, SparseRows) else x @ flat
    if adj is not None:
        h = torch.sparse.mm(adj, h)
    return h.view(h.size(0), w.size(0), -1) + weights[1]


def later_layers(weights: list[Tensor], pre: Tensor, adj: Tensor | None) -> Tensor:
    """``[n, D, d]`` outputs of D GCNs from their first-layer pre-activations ``pre [n, D, h]``."""
    h = pre
    for i in range(1, len(weights) // 2):
        h = torch.einsum("ndh,dhk->ndk", F.relu(h), weights[2 * i])
        if adj is not None:
            h = torch.sparse.mm(adj, h.reshape(h.size(0), -1)).view_as(h)
        h = h + weights[2 * i + 1]
    return h


def batched_gcn(weights: list[Tensor], x: Tensor | SparseRows, adj: Tensor | None) -> Tensor:
    """``[n, D, d]`` outputs of D GCNs (``weights`` from :func:`random_gcn_weights`) on ``x [n, F]``; with
    ``adj`` ``None`` every layer is dense (the graph of nodes whose neighbours carry the same row)."""
    return later_layers(weights, first_layer(weights, x, adj), adj)


@dataclass
class RealGraph:
    """A client's graph as the gradient matching reads it: ``features`` ``x [n, F]`` (dense, or
    :class:`~fglrepro.sparse.SparseRows` below :data:`~fglrepro.models.SPARSE_BELOW` non-zeros),
    ``propagated`` ``P = A x [n, F]`` and the operator ``adj`` (sparse CSR ``[n, n]``); for
    :meth:`real_norm`, with sparse features ``adj_t`` ``= A^T`` and ``features_t`` (sparse CSR
    ``[F', n]``: ``x^T`` without its empty rows), else ``gram`` ``= P P^T [n, n]``."""

    features: Tensor | SparseRows
    propagated: Tensor
    adj: Tensor
    adj_t: Tensor | None = None
    features_t: Tensor | None = None
    gram: Tensor | None = None

    @classmethod
    def of(cls, client: ClientData) -> "RealGraph":
        x, adj = client.x, client.adj
        propagated = torch.sparse.mm(adj, x)
        if x.count_nonzero() < SPARSE_BELOW * x.numel():
            used = x.ne(0).any(dim=0)
            return cls(SparseRows.of(x), propagated, adj, adj_t=adj.t().to_sparse_csr(),
                       features_t=x[:, used].t().to_sparse_csr())
        return cls(x, propagated, adj, gram=propagated @ propagated.t())

    @torch.no_grad()
    def real_norm(self, delta: Tensor) -> Tensor:
        """``||P^T delta||^2`` for ``delta [n, D h]``: the squared norm of the real graph's first-layer
        weight gradients, as ``||x^T (A^T delta)||^2`` (sparse products) or ``<delta, P P^T delta>``."""
        if self.gram is None:
            product = torch.mm(self.features_t, torch.sparse.mm(self.adj_t, delta)).view(-1)
            return torch.dot(product, product)
        return (delta * (self.gram @ delta)).sum()


def matching_loss(weights: list[Tensor], head: Tensor, real: RealGraph, train: Tensor, labels: Tensor,
                  centre: Tensor) -> Tensor:
    """Mean over the D GCNs and the parameters of the mean squared difference between the gradient of
    the cross-entropy (random linear ``head [D, d, C]``) on the real graph (``train`` nodes) and on the
    2-node graphs with centres ``centre [m, F]``.

    The first layer's weight gradient is ``x^T Delta`` (``Delta``: the gradient of the pre-activations),
    so its squared distance is taken as ``<Ds, Z Z^T Ds> - 2 <Ds, Z P^T Dr> + ||P^T Dr||^2`` (``P = A x``)
    without forming the synthetic ``[F, h]`` gradients (the same value; checked in the tests). The last
    term does not depend on the generator (:meth:`RealGraph.real_norm`): it sets the loss value only."""
    draws = head.size(0)

    def loss_of(embeddings: Tensor, nodes_labels: Tensor) -> Tensor:
        logits = torch.einsum("ndk,dkc->ndc", embeddings, head)
        per_node = F.cross_entropy(logits.permute(0, 2, 1), nodes_labels.unsqueeze(1).expand(-1, draws),
                                   reduction="none")
        return per_node.mean(dim=0).sum()

    rest = weights[1:2] + weights[2:]
    flat = side_by_side(weights[0])
    pre_real = first_layer(weights, real.features, real.adj, flat)
    real_grads = torch.autograd.grad(loss_of(later_layers(weights, pre_real, real.adj)[train], labels),
                                     [pre_real, *rest])
    pre_syn = first_layer(weights, centre, None, flat)
    syn = torch.autograd.grad(loss_of(later_layers(weights, pre_syn, None), labels), [pre_syn, *rest],
                              create_graph=True)
    delta_r = real_grads[0].reshape(real_grads[0].size(0), -1)
    delta_s = syn[0].reshape(syn[0].size(0), -1)
    first = ((delta_s * ((centre @ centre.t()) @ delta_s)).sum()
             - 2 * (delta_s * ((centre @ real.propagated.t()) @ delta_r)).sum()
             + real.real_norm(delta_r))
    total = first / weights[0].numel()
    return total + sum(((s - r) ** 2).mean() for s, r in zip(syn[1:], real_grads[1:]))


def pretrain_generator(gen: NeighbourGenerator, client: ClientData, widths: list[int], hparams: FedLoGHparams,
                       generator: torch.Generator) -> float:
    """``generator_epochs`` Adam steps of ``MSE(g(x_v), mean neighbour of v) + matching`` over the
    labelled nodes (module docstring); returns the last loss."""
    train = client.train_mask.nonzero().flatten()
    target, has_neighbours = mean_neighbour_features(client, train)
    labels, x_train = client.y[train], client.x[train]
    real = RealGraph.of(client)
    optimizer = KernelOptimizer(gen.parameters(), lr=hparams.generator_lr)
    draws, num_classes = hparams.matching_draws, client.num_classes
    any_neighbours = bool(has_neighbours.any())
    gen.train()
    loss_value = float("nan")
    for _ in range(hparams.generator_epochs):
        generated = gen(x_train)
        loss = F.mse_loss(generated[has_neighbours], target[has_neighbours]) if any_neighbours else 0.0
        weights = random_gcn_weights(widths, draws, generator, client.x.device)
        bound = 1.0 / math.sqrt(num_classes)
        head = ((torch.rand(draws, widths[-1], num_classes, generator=generator) * 2 - 1) * bound).to(client.x.device)
        centre = (x_train + generated) / 2
        loss = loss + matching_loss(weights, head, real, train, labels, centre)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        loss_value = loss.item()
    gen.eval()
    return loss_value


@dataclass
class GlobalData:
    """What the server sends besides the modules: ``x [C P, F]``, ``y [C P]``, and the class generators'
    parameters stacked over classes (``None`` until built)."""

    x: Tensor
    y: Tensor
    generators: list[Tensor]


@register("fedlog")
class FedLoG(FederatedMethod):
    """Clients with synthetic-node prototype classifiers; the server averages the modules and builds
    global synthetic data and class generators; ``eval_model`` is the client's own model."""

    label = "FedLoG"
    Hparams = FedLoGHparams
    has_global_model = False

    @classmethod
    def check_protocol(cls, hparams: FedLoGHparams, setup: RunSetup) -> None:
        model = setup.model
        if model.arch not in BACKBONES or model.readout or model.jk is not None:
            raise ConfigError(f"method 'fedlog' builds its embedder from the study's model: model.arch must be one "
                              f"of {list(BACKBONES)} without readout or jk, got arch {model.arch!r}, "
                              f"readout {model.readout}, jk {model.jk!r}")

    def __init__(self, federation: Federation, hparams: FedLoGHparams) -> None:
        super().__init__(federation, hparams)
        template, first = federation.model, self.clients[0]
        num_features, num_classes = first.x.size(1), first.num_classes
        self.widths = [num_features] + [template.hidden] * (template.layers - 1) + [hparams.embed_dim]
        for k, state in enumerate(self.states):
            embedder = backbone(template, num_features, hparams.embed_dim).to(first.x.device)
            state.model = FedLoGModel(embedder, num_features, num_classes, hparams.embed_dim, hparams.num_proto,
                                      hparams.head_degree, federation.generator).to(first.x.device)
            state.modules["generator"] = NeighbourGenerator(num_features).to(first.x.device)
        #: clients that pretrained (their first round) and uploaded their generator
        self.pretrained: set[int] = set()
        self.scalers = [first.x.new_zeros(num_classes) for _ in self.clients]
        self.shared: dict[str, Tensor] | None = None
        self.global_data: GlobalData | None = None
        #: per client: (the global data, its scalers, the generated neighbours) of its last global step
        self.prompt_cache: dict[int, tuple[GlobalData, Tensor, Tensor]] = {}

    # ---- client side -------------------------------------------------------------------------

    def client_update(self, k: int, round_: int) -> Upload:
        client, state = self.clients[k], self.states[k]
        uploads_generator = k not in self.pretrained
        if uploads_generator:
            pretrain_generator(state.modules["generator"], client, self.widths, self.hparams, self.federation.generator)
            self.pretrain_embedder(k)
            self.pretrained.add(k)
        else:
            self.receive(k, round_)
        loss = self.train_local(k)
        model = state.model
        labels = client.y[client.train_mask]
        counts = torch.bincount(labels, minlength=client.num_classes).to(client.x.dtype)
        extras = {"syn_head": model.syn_head.detach().clone(), "syn_tail": model.syn_tail.detach().clone(),
                  "class_share": counts / counts.sum().clamp_min(1)}
        if uploads_generator:
            extras.update({f"generator.{n}": p.detach().clone()
                           for n, p in state.modules["generator"].named_parameters()})
        params = {n: p.detach().clone() for n, p in model.named_parameters() if n.startswith(SHARED)}
        return Upload(params=params, extras=extras, weight=float(client.num_nodes), loss=loss)

    def receive(self, k: int, round_: int) -> None:
        """Load the averaged modules into client ``k``'s model (its synthetic nodes stay its own)."""
        if self.shared is None:
            return
        with torch.no_grad():
            for name, param in self.states[k].model.named_parameters():
                if name in self.shared:
                    param.copy_(self.shared[name])

    def pretrain_embedder(self, k: int) -> None:
        """Cross-entropy of the embedder with the linear head, minibatches of labelled nodes, keeping the
        epoch with the best local validation accuracy (patience ``pretrain_patience``)."""
        client, model, hp = self.clients[k], self.states[k].model, self.hparams
        modules = nn.ModuleList([model.embedder, model.classifier])
        optimizer = make_optimizer(modules, self.federation.train)
        train = client.train_mask.nonzero().flatten()
        best, best_state, waited = -1.0, None, 0
        for _ in range(hp.pretrain_epochs):
            modules.train()
            for batch in self.batches(train):
                optimizer.zero_grad(set_to_none=True)
                logits = model.classifier(model.embedder(client.x, client.adj)[batch])
                F.cross_entropy(logits, client.y[batch]).backward()
                optimizer.step()
            modules.eval()
            with torch.no_grad():
                pred = model.classifier(model.embedder(client.x, client.adj)).argmax(dim=1)
            val = client.val_mask
            accuracy = float((pred[val] == client.y[val]).float().mean()) if bool(val.any()) else 0.0
            if accuracy >= best:
                best, waited = accuracy, 0
                best_state = copy.deepcopy(modules.state_dict())
            else:
                waited += 1
                if waited == hp.pretrain_patience:
                    break
        modules.load_state_dict(best_state)

    def batches(self, nodes: Tensor) -> list[Tensor]:
        """One epoch's minibatches: ``max(1, floor(m / B))`` batches of ``B`` nodes drawn without
        replacement (all of them when fewer than B)."""
        order = nodes[torch.randperm(nodes.numel(), generator=self.federation.generator).to(nodes.device)]
        size = self.hparams.batch_size
        return [order[i * size:(i + 1) * size] for i in range(max(1, nodes.numel() // size))]

    def train_local(self, k: int) -> float:
        """``train.local_epochs`` epochs of the local loss (with ``L_global`` once global data arrived)."""
        client, model, hp = self.clients[k], self.states[k].model, self.hparams
        modules = nn.ModuleList([model.embedder, model.norm_head, model.norm_tail])
        optimizer = make_optimizer(modules, self.federation.train)
        lr = self.federation.train.lr if hp.synthetic_lr is None else hp.synthetic_lr
        synthetic_optimizer = KernelOptimizer([model.syn_head, model.syn_tail], lr=lr)
        alpha = model.head_weight(client.adj)
        train = client.train_mask.nonzero().flatten()
        pairs = None if self.global_data is None else pair_adjacency(self.global_data.y.numel(), client.x.device)
        loss_value = float("nan")
        modules.train()
        for _ in range(self.federation.train.local_epochs):
            for batch in self.batches(train):
                optimizer.zero_grad(set_to_none=True)
                synthetic_optimizer.zero_grad(set_to_none=True)
                prototypes = model.prototypes()
                head, tail = model.branch_log_probs(model.embedder(client.x, client.adj)[batch], prototypes)
                mixed = alpha[batch] * head + (1 - alpha[batch]) * tail
                loss = F.nll_loss(mixed, client.y[batch])
                loss = loss + hp.norm_weight * 0.5 * (model.syn_head.norm() + model.syn_tail.norm())
                if pairs is not None:
                    loss = loss + hp.global_weight * self.global_loss(k, prototypes, pairs)
                loss.backward()
                optimizer.step()
                synthetic_optimizer.step()
                loss_value = loss.item()
        modules.eval()
        return loss_value

    def global_loss(self, k: int, prototypes: tuple[Tensor, Tensor], pairs: Tensor) -> Tensor:
        """``L_global`` of client ``k`` on the scaled global synthetic data with generated neighbours;
        updates its class scalers."""
        data, model, scaler = self.global_data, self.states[k].model, self.scalers[k]
        x = data.x + scaler[data.y].unsqueeze(1) * (data.x.mean(dim=0, keepdim=True) - data.x)
        m = data.y.numel()
        h = model.embedder(torch.cat([x, self.prompts(k, x).reshape(m, -1)]), pairs)[:m]
        head, tail = model.branch_log_probs(h, prototypes)
        mixed = 0.5 * head + 0.5 * tail
        with torch.no_grad():
            correct = (mixed.argmax(dim=1) == data.y).to(scaler.dtype)
            per_class = torch.zeros_like(scaler).index_add_(0, data.y, correct) / torch.bincount(
                data.y, minlength=scaler.numel()).clamp_min(1)
            step = torch.where(per_class > self.hparams.scaler_accuracy, 1.0, -1.0) * self.hparams.scaler_step
            scaler.add_(step).clamp_(0.0, 1.0)
        return F.nll_loss(mixed, data.y)

    def prompts(self, k: int, x: Tensor) -> Tensor:
        """``[C, P, F]`` generated neighbours of the scaled global rows ``x [C P, F]`` of client ``k``; a
        class's are regenerated only when its scaler moved (same values, less work)."""
        data, scaler = self.global_data, self.scalers[k]
        cached = self.prompt_cache.get(k)
        if cached is not None and cached[0] is not data:
            cached = None
        rows = x.detach().view(scaler.numel(), -1, x.size(1))
        with torch.no_grad():
            if cached is None:
                out = class_generator_forward(data.generators, rows)
            else:
                out = cached[2].clone()
                for c in (cached[1] != scaler).nonzero().flatten().tolist():
                    out[c:c + 1] = class_generator_forward([w[c:c + 1] for w in data.generators], rows[c:c + 1])
        self.prompt_cache[k] = (data, scaler.clone(), out)
        return out

    def on_run_end(self, last_round: int) -> bool:
        """Every client trains once more with what it downloaded in the last round."""
        ticker = Ticker("final local training, clients done", len(self.clients))
        for k in range(len(self.clients)):
            self.receive(k, last_round + 1)
            self.train_local(k)
            ticker.tick()
        return True

    # ---- server side -------------------------------------------------------------------------

    def server_update(self, round_: int, uploads: dict[int, Upload]) -> None:
        ups = list(uploads.values())
        self.shared = {n: torch.stack([u.params[n] for u in ups]).mean(dim=0) for n in ups[0].params}
        model = self.states[0].model
        shares = torch.stack([u.extras["class_share"] for u in ups])
        heads = torch.stack([u.extras["syn_head"].view(model.num_classes, model.num_proto, -1) for u in ups])
        x = global_synthetic(heads, shares, self.federation.generator).reshape(-1, heads.size(-1))
        y = torch.arange(model.num_classes, device=x.device).repeat_interleave(model.num_proto)
        generators = self.global_data.generators if self.global_data is not None else None
        if "generator.fc1.weight" in ups[0].extras:
            weights = class_weights(shares)  # [K, C]
            names = [f"generator.{n}" for n, _ in NeighbourGenerator(1).named_parameters()]
            generators = [torch.einsum("kc,k...->c...", weights, torch.stack([u.extras[n] for u in ups]))
                          for n in names]
        self.global_data = GlobalData(x=x, y=y, generators=generators)

    def download_bytes(self, k: int) -> int:
        """The averaged modules, the global synthetic data and the class generators."""
        data = self.global_data
        return tensor_bytes([*self.shared.values(), data.x, *data.generators])
