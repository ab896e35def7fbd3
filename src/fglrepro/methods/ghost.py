"""GHOST (Qian et al., ICML 2025): one-shot federated graph learning with proxy models and
topology-consistent knowledge retention.

The paper is not in ``../shared/papers``; this follows the O-pFGL paper's description (App. I: "Each
client constructs a pseudo graph and trains a proxy model by aligning the pseudo graph and the real
local graph. Each client then uploads the proxy model. The server generates the pseudo-graph with each
uploaded proxy model and trains a global model with crucial parameters stabilized to alleviate
catastrophic forgetting. For better performance, we perform additional fine-tuning") and, for the
details, the authors' public code (JiaruQian/GHOST: ``algorithm/GHOST.py``, ``utils/utils.py``,
``args.py``, whose defaults are the ones here).

Client k trains a proxy, a class-conditional generator ``G_k(z, y)`` of node features (the shared
:class:`~fglrepro.components.generator.ConditionalGenerator`, with dropout after each Tanh as in the code), for
``proxy_epochs`` Adam steps; each step draws fresh noise ``z`` for its ``n_L`` labelled nodes,
generates ``X^ = G_k(z, y_L)`` (row i stands for labelled node i) and minimises

    lambda_d KL(softmax(X_L) || softmax(X^)) + (1 - mean_i cos(X^_i, X_L,i)) + lambda_f FGW(A_L, A^, X_L, X^)

with the fused Gromov-Wasserstein distance (uniform weights, trade-off ``fgw_alpha``; the real graph's
block ``A_L`` of labelled nodes, binary, and ``A^`` per ``proxy_structure``). It uploads ``G_k``.

The server trains the global model (the study's, from its initial weights) through the proxies in a
random order, ``stages`` times each; a stage s generates ``n_k`` nodes (client k's node count, classes
balanced), links them by their kNN graph on cosine similarity (FedTAD's pseudo graph), computes the
topology-consistency criterion on the model as it is,

    Omega_s = | d/dtheta sum_{(i, j) in E} e_ij^2 |,   e_ij = <h_i W, tanh(h_j W)>,  h = relu(conv_1(X^, A^))

(``W [H, F]`` the first convolution's weight; E the pseudo graph's edges, both directions and self-loops),
then takes ``stage_steps`` Adam steps on

    CE(f(X^, A^), y) + lambda_r sum_{s' < s} sum_theta Omega_s' (theta - theta*_s')^2

and keeps ``theta*_s`` (the parameters after the stage). Every client receives the global model; the
paper's ``GHOST+ft`` wraps this method in ``finetune``. One round only (``train.rounds = 1``): GHOST has
no multi-round form and O-pFGL runs it in the one-shot tables only (not in Tables 8-9).

Details the code settles differently or leaves open, and the choice made here:

- FGW solver: the code imports a ``GW_utils`` module that its repository lacks. Here: conditional
  gradient (POT's algorithm for the square loss) from the product plan, exact line search, the linear
  step an assignment problem (``scipy.optimize.linear_sum_assignment``: both graphs have ``n_L`` nodes
  with uniform weights), at most ``fgw_iterations`` steps or until the objective changes by less than
  1e-9 relatively; the loss's gradient is the envelope gradient through the feature cost at the optimal
  plan (the plan held fixed), as the code's ``set_gradients`` does.
- ``A^`` (``proxy_structure``): in the code the pseudo graph's dense adjacency has 2 on the diagonal
  (self-loops added twice) and 1 elsewhere, and it is integer-divided by 2, so ``A^`` is the identity
  (``"code"``, the default); ``"knn"`` uses the binary kNN graph (with self-loops) of the generated
  nodes, what the text describes.
- The code generates all n_k local nodes with their labels (test labels included) and uses only the
  labelled rows in every loss; here only labelled nodes are generated (the same losses under ``"code"``,
  no test labels read).
- ``lambda_n`` (the code adds ``lambda_n`` times the criterion's gradient norms, Python floats, to the
  loss) changes no gradient and is left out. The code's criterion is read from ``.grad`` after earlier
  training steps left theirs there (so stale task gradients enter it); here it is the criterion's own
  gradient (zero for parameters it does not reach, e.g. the last layer).
- ``lambda_r`` is the code's product ``lambda_r * r_scale`` = 1 x 1e-11.
- The code's pseudo graph on the server counts self-loops twice in the GCN normalisation; here once.
  Its balanced labels are shuffled; here in class order (full-batch training does not see the order).
- The proxies generate in training mode on the server (dropout on), as in the code.
- Global model: the study's (O-pFGL: GCN, hidden 64; the code: hidden 128, dropout 0.3). The server's
  Adam (lr 0.01, weight decay 4e-4) is the code's, kept across all stages.

The criterion reads the first convolution's ``lin.weight`` (GCN and GAT; O-pFGL reports GHOST with GAT
but not with GraphSAGE or SGC). All of it is vectorised over nodes and edges; clients train their
proxies one after another (each FGW plan is its own assignment problem), with the fast path's dropout
masks and fused Adam; the criterion's edge products are H-wide on the fast path
(:func:`topology_criterion`). Cost: each proxy step generates dense ``[n_L, F]`` features (a ``256 x F``
head) and an ``n_L x n_L x F`` feature cost, which FedAvg's sparse first layer never pays: on Cora-10
(seed 0, ``benchmarks/method_costs.py``, whole process) a run is ~9.8 CPU s, ~3.7x FedAvg+ft (~7.5x its
training loop alone), three quarters of it the proxies' 100 steps x 10 clients of those products. With
ogbn-arxiv's ~10^4 labelled nodes per client the dense ``n_L x n_L`` plans and assignments are
impractical on CPU (O-pFGL reports OC/OM on ogbn-products).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, replace

import numpy as np
import torch
import torch.nn.functional as F
from scipy.optimize import linear_sum_assignment
from torch import Tensor, nn

from fglrepro.components.generator import ConditionalGenerator, balanced_labels, knn_pseudo_graph, seeded_generator
from fglrepro.config import ConfigError, choice
from fglrepro.fl.clients import ClientData
from fglrepro.fl.communication import module_bytes
from fglrepro.fl.method import FederatedMethod, Federation, RunSetup, Upload
from fglrepro.fl.training import check_finite, make_optimizer
from fglrepro.methods import register
from fglrepro.models import GCN, dropout, fast_kernels_enabled

STRUCTURES = ("code", "knn")
#: architectures whose first convolution has the ``lin.weight [H, F]`` the criterion reads
CRITERION_ARCHS = ("gcn", "gat")


@dataclass(frozen=True)
class GHOSTHparams:
    """Defaults of the authors' ``args.py`` unless noted.

    Attributes:
        proxy_epochs: T_L, Adam steps of each client's proxy (100).
        proxy_lr, proxy_weight_decay: the proxy's Adam (0.005, 4e-4).
        noise_dim, proxy_dropout: the generator's noise size and dropout after each Tanh (64, 0.2).
        lambda_d: weight of the feature KL in the proxy's loss (0.05).
        lambda_f: weight of the FGW distance in the proxy's loss (0.1); 0 leaves the local graph unread.
        fgw_alpha: FGW trade-off, 0 the feature transport alone, 1 the structure alone (0.5).
        fgw_iterations: most conditional-gradient steps of the FGW solver (not in the code; see above).
        proxy_structure: ``A^`` in the FGW term, ``"code"`` (identity) or ``"knn"``; see above.
        stages, stage_steps: M pseudo graphs per proxy on the server, T_G Adam steps on each (3, 5).
        knn: k of the pseudo graphs' kNN (5).
        server_lr, server_weight_decay: the server's Adam (0.01, 4e-4).
        lambda_r: weight of the retention term (the code's 1 x r_scale 1e-11); 0: plain sequential
            training on the pseudo graphs.
    """

    proxy_epochs: int = 100
    proxy_lr: float = 0.005
    proxy_weight_decay: float = 4e-4
    noise_dim: int = 64
    proxy_dropout: float = 0.2
    lambda_d: float = 0.05
    lambda_f: float = 0.1
    fgw_alpha: float = 0.5
    fgw_iterations: int = 100
    proxy_structure: str = "code"
    stages: int = 3
    stage_steps: int = 5
    knn: int = 5
    server_lr: float = 0.01
    server_weight_decay: float = 4e-4
    lambda_r: float = 1e-11

    def __post_init__(self) -> None:
        choice(self.proxy_structure, STRUCTURES, "hparams.proxy_structure")
        if not 0.0 <= self.fgw_alpha <= 1.0:
            raise ConfigError(f"hparams.fgw_alpha must be in [0, 1], got {self.fgw_alpha}")
        if not 0.0 <= self.proxy_dropout < 1.0:
            raise ConfigError(f"hparams.proxy_dropout must be in [0, 1), got {self.proxy_dropout}")
        counts = {"proxy_epochs": self.proxy_epochs, "stages": self.stages, "stage_steps": self.stage_steps,
                  "knn": self.knn, "fgw_iterations": self.fgw_iterations, "noise_dim": self.noise_dim}
        low = {name: value for name, value in counts.items() if value < 1}
        if low:
            raise ConfigError(f"hparams {sorted(low)} of ghost must be >= 1, got {low}")
        if min(self.lambda_d, self.lambda_f, self.lambda_r) < 0:
            raise ConfigError(f"hparams.lambda_d, lambda_f, lambda_r must be >= 0, got "
                              f"{self.lambda_d}, {self.lambda_f}, {self.lambda_r}")


class Dropout(nn.Module):
    """Dropout with probability ``p`` through :func:`fglrepro.models.dropout` (fast masks on the fast path)."""

    def __init__(self, p: float) -> None:
        super().__init__()
        self.p = p

    def forward(self, x: Tensor) -> Tensor:
        return dropout(x, self.p, self.training)


def proxy_generator(num_classes: int, feat_dim: int, hparams: GHOSTHparams, rng: torch.Generator,
                    device: torch.device) -> ConditionalGenerator:
    """A seeded :class:`ConditionalGenerator` with ``hparams.noise_dim`` noise and dropout after
    each Tanh (the code's ``Generator``)."""
    generator = seeded_generator(num_classes, feat_dim, hparams.noise_dim, rng, device)
    if hparams.proxy_dropout > 0:
        layers = []
        for layer in generator.body:
            layers += [layer, Dropout(hparams.proxy_dropout)] if isinstance(layer, nn.Tanh) else [layer]
        generator.body = nn.Sequential(*layers)
    return generator


def squared_distances(a: Tensor, b: Tensor) -> Tensor:
    """``[n, m]`` squared Euclidean distances of the rows of ``a [n, F]`` and ``b [m, F]``
    (differentiable at coinciding rows, unlike ``cdist``'s square)."""
    return (a.pow(2).sum(1, keepdim=True) + b.pow(2).sum(1).unsqueeze(0) - 2 * a @ b.t()).clamp_min(0)


def _structure_product(c1, plan, c2):
    """``C1 plan C2`` (``c2 = None``: the identity), for tensors or numpy arrays alike."""
    left = c1 @ plan
    return left if c2 is None else left @ c2


def gw_term(c1, c2, plan):
    """``sum_ijkl (C1_ik - C2_jl)^2 T_ij T_kl`` for symmetric ``C1 [n, n]``, ``C2 [m, m]`` (``None``: the
    identity) and a plan ``T [n, m]``, as ``<c_1 1^T + 1 c_2^T, T> - 2 <C1 T C2, T>`` (``c_1 = C1^2 T 1``,
    ``c_2 = C2^2 T^T 1``); tensors or numpy arrays alike."""
    rows, cols = plan.sum(1), plan.sum(0)
    c2_cols = cols if c2 is None else (c2 ** 2) @ cols
    constant = ((c1 ** 2) @ rows)[:, None] + c2_cols[None, :]
    return (constant * plan).sum() - 2 * (_structure_product(c1, plan, c2) * plan).sum()


def fgw_objective(cost, c1, c2, plan, alpha: float):
    """``(1 - alpha) <M, T> + alpha`` :func:`gw_term` for the feature cost ``M [n, m]``."""
    return (1 - alpha) * (cost * plan).sum() + alpha * gw_term(c1, c2, plan)


def fgw_plan(cost: Tensor, c1: Tensor, c2: Tensor | None, alpha: float, iterations: int,
             tolerance: float = 1e-9) -> Tensor:
    """The FGW transport plan ``[n, n]`` between two graphs of ``n`` nodes with uniform weights, by
    conditional gradient from the product plan (a local optimum: the GW term is not convex), in float64
    numpy (small dense matrices; the assignment solver is scipy's).

    ``cost [n, n]`` is the feature cost, ``c1``, ``c2`` the symmetric structures (``c2 = None``: the
    identity). Each step's direction is the permutation plan minimising the linearised objective (its
    gradient ``(1 - alpha) M - 4 alpha C1 T C2`` up to terms constant on the plans), the step length the
    exact minimiser of the quadratic along it in [0, 1]; the objective moves by that quadratic's value,
    and the steps stop when it moves by less than ``tolerance`` relatively.
    """
    def array(t: Tensor | None) -> np.ndarray | None:
        return None if t is None else t.detach().cpu().double().numpy()

    m, s1, s2 = array(cost), array(c1), array(c2)
    n = m.shape[0]
    plan = np.full((n, n), 1.0 / (n * n))
    value = fgw_objective(m, s1, s2, plan, alpha)
    rows = np.arange(n)
    for _ in range(iterations):
        gradient = (1 - alpha) * m - 4 * alpha * _structure_product(s1, plan, s2)
        vertex = np.zeros((n, n))
        vertex[rows, linear_sum_assignment(gradient)[1]] = 1.0 / n
        direction = vertex - plan
        slope = (gradient * direction).sum()
        curvature = -2 * alpha * (_structure_product(s1, direction, s2) * direction).sum()
        if curvature > 0:
            step = min(1.0, max(0.0, -slope / (2 * curvature)))
        else:
            step = 1.0 if curvature + slope < 0 else 0.0
        if step == 0.0:
            break
        plan = plan + step * direction
        change = slope * step + curvature * step * step
        value += change
        if abs(change) <= tolerance * max(abs(value), 1e-12):
            break
    return torch.as_tensor(plan, dtype=cost.dtype, device=cost.device)


def fgw_loss(x_real: Tensor, x_fake: Tensor, c1: Tensor, c2: Tensor | None, alpha: float, iterations: int
             ) -> Tensor:
    """The FGW distance between ``(C1, X_real [n, F])`` and ``(C2, X_fake [n, F])`` with the squared
    Euclidean feature cost, differentiable in ``x_fake`` through the cost at the optimal plan."""
    cost = squared_distances(x_real, x_fake)
    plan = fgw_plan(cost, c1, c2, alpha, iterations)
    return fgw_objective(cost, c1, c2, plan, alpha)


def labelled_adjacency(client: ClientData) -> Tensor:
    """Binary symmetric adjacency ``[n_L, n_L]`` of the client's labelled nodes (their induced edges)."""
    train = client.train_mask
    position = torch.cumsum(train.long(), 0) - 1
    source, target = client.edge_index
    keep = train[source] & train[target]
    count = int(train.sum())
    adj = torch.zeros(count, count, device=client.x.device)
    adj[position[source[keep]], position[target[keep]]] = 1.0
    return torch.maximum(adj, adj.t())


def knn_structure(x: Tensor, k: int) -> Tensor:
    """Binary symmetric kNN adjacency ``[n, n]`` on cosine similarity, self-loops included (the
    code's pseudo graph before its second self-loop)."""
    unit = F.normalize(x, dim=1)
    neighbours = (unit @ unit.t()).topk(min(k, x.size(0)), dim=1).indices
    linked = torch.zeros(x.size(0), x.size(0), device=x.device).scatter_(1, neighbours, 1.0)
    return torch.maximum(linked, linked.t()).fill_diagonal_(1.0)


@dataclass
class ProxyTarget:
    """What a client's proxy is aligned with, computed once: its labelled nodes' features ``x [n_L, F]``,
    labels ``y [n_L]``, feature distributions ``softmax(x)`` and their mean negative entropy (the
    constant part of the KL), the structure ``c1`` (:func:`labelled_adjacency`) and the rows of ``x``
    scaled to unit norm ``unit [n_L, F]`` (:func:`unit_rows`)."""

    x: Tensor
    y: Tensor
    probabilities: Tensor
    negative_entropy: Tensor
    c1: Tensor
    unit: Tensor

    @classmethod
    def of(cls, client: ClientData) -> "ProxyTarget":
        x = client.x[client.train_mask]
        log_p = F.log_softmax(x, dim=1)
        probabilities = log_p.exp()
        return cls(x=x, y=client.y[client.train_mask], probabilities=probabilities,
                   negative_entropy=(probabilities * log_p).sum() / x.size(0), c1=labelled_adjacency(client),
                   unit=unit_rows(x))


def unit_rows(x: Tensor, eps: float = 1e-8) -> Tensor:
    """``x [n, F]`` with each row divided by its norm (at least ``eps``): ``(unit_rows(a) * unit_rows(b)).sum(1)``
    is ``F.cosine_similarity(a, b)`` bit for bit, values and gradients (its own operations, with one side
    computed once)."""
    return x / torch.linalg.vector_norm(x, dim=-1, keepdim=True).clamp_min(eps)


def proxy_loss(generator: ConditionalGenerator, target: ProxyTarget, hparams: GHOSTHparams, noise: Tensor
               ) -> Tensor:
    """One step's loss of a proxy with ``noise [n_L, noise_dim]`` (see the module docstring); the
    KL is ``KL(softmax(X_L) || softmax(X^))`` (batch mean) written as negative entropy minus cross term."""
    x_fake = generator(noise, target.y)
    cross = (target.probabilities * F.log_softmax(x_fake, dim=1)).sum() / x_fake.size(0)
    loss = hparams.lambda_d * (target.negative_entropy - cross)
    loss = loss + 1 - (unit_rows(x_fake) * target.unit).sum(dim=-1).mean()
    if hparams.lambda_f > 0:
        c2 = None if hparams.proxy_structure == "code" else knn_structure(x_fake.detach(), hparams.knn)
        loss = loss + hparams.lambda_f * fgw_loss(target.x, x_fake, target.c1, c2, hparams.fgw_alpha,
                                                  hparams.fgw_iterations)
    return loss


def train_proxy(generator: ConditionalGenerator, client: ClientData, hparams: GHOSTHparams,
                optimizer, rng: torch.Generator) -> float:
    """``proxy_epochs`` steps of ``optimizer`` on :func:`proxy_loss`, fresh noise from ``rng`` each
    step; returns the last loss."""
    target = ProxyTarget.of(client)
    count = target.x.size(0)
    generator.train()
    value = float("nan")
    for _ in range(hparams.proxy_epochs):
        noise = torch.randn(count, hparams.noise_dim, generator=rng).to(client.x.device)
        optimizer.zero_grad(set_to_none=True)
        loss = proxy_loss(generator, target, hparams, noise)
        loss.backward()
        optimizer.step()
        value = check_finite(loss.item())
    return value


def pseudo_edges(adj: Tensor) -> Tensor:
    """``[2, E]`` edges (both directions, self-loops included) of a pseudo-graph operator ``[n, n]``."""
    dense = adj.to_dense() if adj.layout != torch.strided else adj
    return dense.nonzero().t()


def topology_criterion(model: nn.Module, x: Tensor, adj: Tensor) -> list[Tensor]:
    """Per parameter of ``model`` (in order) ``|d/dtheta sum_{(i, j)} e_ij^2|`` with
    ``e_ij = <h_i W, tanh(h_j W)>``, ``h = relu(conv_1(x [n, F], adj))`` ``[n, H]``, ``W`` the first
    convolution's ``lin.weight [H, F]`` and ``(i, j)`` the edges of ``adj`` (:func:`pseudo_edges`);
    zero where it does not reach. No dropout (the code's ``compute_criterion``). With the fast kernels
    (:func:`~fglrepro.models.fast_kernels_enabled`) as ``e_ij = <h_i, q_j>``, ``q = tanh(h W) W^T [n, H]``:
    per edge an H-wide product instead of an F-wide one, the same value up to float rounding."""
    weight = model.convs[0].lin.weight
    hidden = F.relu(model.convolve(0, x, model.graph(adj)))
    source, target = pseudo_edges(adj)
    if fast_kernels_enabled():
        pulled_back = torch.tanh(hidden @ weight) @ weight.t()
        energy = (hidden[source] * pulled_back[target]).sum(1).pow(2).sum()
    else:
        projected = hidden @ weight
        energy = (projected[source] * torch.tanh(projected)[target]).sum(1).pow(2).sum()
    params = list(model.parameters())
    grads = torch.autograd.grad(energy, params, allow_unused=True)
    return [torch.zeros_like(p) if g is None else g.abs() for p, g in zip(params, grads)]


class Retention:
    """``sum_s sum_theta Omega_s (theta - theta*_s)^2`` over the stages added so far, kept as three
    running sums per parameter (``sum Omega``, ``sum Omega theta*``, ``sum Omega theta*^2``), so each
    step costs one pass over the parameters whatever the number of stages."""

    def __init__(self, params: list[Tensor]) -> None:
        self.weight = [torch.zeros_like(p) for p in params]
        self.first = [torch.zeros_like(p) for p in params]
        self.second = [torch.zeros_like(p) for p in params]

    @torch.no_grad()
    def add(self, importance: list[Tensor], anchor: list[Tensor]) -> None:
        """Add a stage: its criterion ``Omega`` and the parameters ``theta*`` it ended with."""
        for w, a, b, omega, theta in zip(self.weight, self.first, self.second, importance, anchor):
            w.add_(omega)
            a.add_(omega * theta)
            b.add_(omega * theta * theta)

    def penalty(self, params: list[Tensor]) -> Tensor:
        """The retention term at ``params`` (differentiable)."""
        terms = zip(self.weight, self.first, self.second, params)
        return sum((w * p * p - 2 * a * p + b).sum() for w, a, b, p in terms)


def integrate(model: nn.Module, optimizer, graphs, hparams: GHOSTHparams) -> None:
    """The server's training of ``model`` in place through the stages ``graphs`` (an iterable of
    ``(x [n, F], adj, y [n])``, one per stage, drawn when the previous stage ends)."""
    params = list(model.parameters())
    retention = Retention(params)
    model.train()
    for x, adj, y in graphs:
        importance = topology_criterion(model, x, adj)
        for _ in range(hparams.stage_steps):
            optimizer.zero_grad(set_to_none=True)
            loss = F.cross_entropy(model(x, adj), y)
            if hparams.lambda_r > 0:
                loss = loss + hparams.lambda_r * retention.penalty(params)
            loss.backward()
            optimizer.step()
            check_finite(loss.item())
        retention.add(importance, [p.detach() for p in params])


@register("ghost")
class GHOST(FederatedMethod):
    """One round: clients train and upload proxy generators, the server trains the global model
    through them with topology-consistent retention, every client holds it (``eval_model`` at
    ``global``). Requires ``train.rounds = 1``; wrap it in ``finetune`` for the paper's ``GHOST+ft``."""

    label = "GHOST"
    Hparams = GHOSTHparams
    one_shot = True
    has_server_models = True

    def __init__(self, federation: Federation, hparams: GHOSTHparams) -> None:
        super().__init__(federation, hparams)
        self.global_model = copy.deepcopy(federation.model)
        self.rng = torch.Generator().manual_seed(federation.generator.initial_seed() + 5)
        self.device = self.clients[0].x.device
        self.num_classes, self.feat_dim = self.clients[0].num_classes, self.clients[0].x.size(1)
        #: the server's client order of the last round
        self.order: list[int] = []

    @classmethod
    def check_protocol(cls, hparams: GHOSTHparams, setup: RunSetup) -> None:
        if setup.model.arch not in CRITERION_ARCHS:
            raise ConfigError(f"method 'ghost' reads the first convolution's weight in its topology criterion: "
                              f"model.arch must be one of {list(CRITERION_ARCHS)}, got {setup.model.arch!r}")

    def new_proxy(self) -> ConditionalGenerator:
        return proxy_generator(self.num_classes, self.feat_dim, self.hparams, self.rng, self.device)

    def client_update(self, k: int, round_: int) -> Upload:
        hp = self.hparams
        proxy = self.new_proxy()
        config = replace(self.federation.train, optimizer="adam", lr=hp.proxy_lr, weight_decay=hp.proxy_weight_decay)
        loss = train_proxy(proxy, self.clients[k], hp, make_optimizer(proxy, config), self.rng)
        params = {name: p.detach().clone() for name, p in proxy.named_parameters()}
        return Upload(params={}, extras=params, weight=float(self.clients[k].num_nodes), loss=loss)

    def stage_graphs(self, uploads: dict[int, Upload]):
        """The stages' pseudo graphs ``(x, adj, y)``: ``stages`` per proxy, proxies in a random order."""
        hp = self.hparams
        dense = isinstance(self.global_model, GCN)
        clients = list(uploads)
        self.order = [clients[i] for i in torch.randperm(len(clients), generator=self.rng).tolist()]
        for k in self.order:
            proxy = self.new_proxy()
            proxy.load_state_dict(uploads[k].extras)
            proxy.train()
            count = int(uploads[k].weight)
            labels = balanced_labels(count, self.num_classes, self.device)
            for _ in range(hp.stages):
                with torch.no_grad():
                    noise = torch.randn(count, hp.noise_dim, generator=self.rng).to(self.device)
                    x = proxy(noise, labels)
                yield x, knn_pseudo_graph(x, hp.knn, dense), labels

    def server_update(self, round_: int, uploads: dict[int, Upload]) -> None:
        hp = self.hparams
        config = replace(self.federation.train, optimizer="adam", lr=hp.server_lr, weight_decay=hp.server_weight_decay)
        integrate(self.global_model, make_optimizer(self.global_model, config), self.stage_graphs(uploads), hp)
        for k in uploads:
            self.states[k].received = self.global_model

    def download_bytes(self, k: int) -> int:
        return module_bytes(self.global_model)

    def server_models(self) -> list[nn.Module]:
        return [self.global_model]

