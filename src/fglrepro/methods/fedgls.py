"""FedGLS (Fu et al., TMLR 2024): federated graph learning with graphless clients.

Every client holds the GNN ``θ = {θ_z, θ_c}`` (the study's model with its readout: ``θ_z``
gives the embeddings ``Z``, ``θ_c`` is the readout) and an MLP feature encoder ``φ`` (``H =
σ(X W1) W2``, eq. 20, the width of ``Z``); graphless clients also hold a graph learner ``ω``
(:class:`~fglrepro.components.graph_learning.GraphLearner`) that is never uploaded. A client's round
(Alg. 1):

1. take the global ``θ`` and ``φ``;
2. graphless clients only: one Adam step on ``ω`` (lr γ) minimising the contrastive loss of
   eqs. 8-9 between ``Z = f(X, S(ω); θ)`` and ``H = h(X; φ)`` (``θ`` and ``φ`` fixed), then
   train on the learned graph ``S``; clients with edges train on theirs;
3. ``E`` epochs, each one step on ``θ`` minimising the cross-entropy on the training nodes
   (eq. 10, the study's optimiser) and one step on ``φ`` (lr β) minimising eq. 11,
   ``sum_i KL(f(z_i; θ_c) ‖ f(h_i; θ_c))`` over all nodes with the teacher detached and
   ``θ_c`` frozen;
4. upload ``θ`` and ``φ``; the server averages each with weights n_k / N (eq. 12).

Graphless clients are tested on their learned graph. Choices the paper leaves open are named
in :class:`FedGLSHparams`.

Fast path (``train.engine`` not ``sequential``): with GCN models, step 3 runs for all
participants at once, each epoch one batched step on every client's ``θ`` (a
:class:`~fglrepro.fl.engine.StackedGCN` over the disjoint union of their graphs, learned graphs
as sparse matrices) and one on every ``φ`` (the MLP as a StackedGCN on the identity operator,
read out through each client's frozen ``θ_c``), with stacked optimiser states kept across
rounds; graph learners on sparse features compute their similarities from the non-zero entries
(:class:`~fglrepro.components.graph_learning.GraphLearner` ``sparse``). Step 2 stays one client at a
time: each graph learner builds a dense ``[n_k, n_k]`` similarity of its own size and takes a
single step per round, so there is no loop of small steps to batch.
"""

from __future__ import annotations

import copy
from contextlib import contextmanager
from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fglrepro.components.graph_learning import GraphLearner, graphless_contrastive_loss
from fglrepro.config import ConfigError
from fglrepro.fl.aggregation import load_parameters, parameters_of
from fglrepro.fl.communication import module_bytes
from fglrepro.fl.engine import ClientBatch, StackedGCN, StackedOptimizer, VectorisedEngine, block_diagonal
from fglrepro.fl.kernel_optimizer import KernelOptimizer
from fglrepro.fl.losses import kl_divergence
from fglrepro.fl.method import Federation, ParameterAveraging, RunSetup, Upload
from fglrepro.fl.training import check_finite, cross_entropy_loss, make_optimizer, train_steps
from fglrepro.methods import register
from fglrepro.models import GCN, MLP

#: Upload names of the feature encoder's parameters (the GNN's keep their own names).
ENCODER = "encoder."
#: Fast path: graph learners read features of lower density through their non-zeros.
SPARSE_BELOW = 0.1


@dataclass(frozen=True)
class FedGLSHparams:
    """FedGLS settings (paper Sec. 5.1.3 unless marked).

    k: neighbours per node of the learned graph (top-(k+1) with the node itself; not stated
        in the paper: SUBLIME's 30 on Cora, 20 on CiteSeer in the studies).
    learner_layers: layers of the attentive encoder (2).
    lr_learner: γ, Adam on ω (0.001), without weight decay (not stated).
    lr_encoder: β, the study's optimiser on φ (0.01) with the study's weight decay (not stated).
    temperature: τ of eq. 8 (0.2).
    Not stated either: the teacher ``Z`` of eq. 11 is computed in evaluation mode after the
    epoch's step on θ; ``Z`` and ``H`` of eq. 8 in evaluation mode (no dropout).
    """

    k: int = 20
    learner_layers: int = 2
    lr_learner: float = 0.001
    lr_encoder: float = 0.01
    temperature: float = 0.2

    def __post_init__(self) -> None:
        if self.k < 1 or self.learner_layers < 1:
            raise ConfigError(f"fedgls needs k >= 1 and learner_layers >= 1; got {self.k}, {self.learner_layers}")


@contextmanager
def frozen(*modules: nn.Module):
    """Parameters of ``modules`` without gradient inside the block, in evaluation mode."""
    flags = [[p.requires_grad for p in m.parameters()] for m in modules]
    for module in modules:
        module.eval().requires_grad_(False)
    try:
        yield
    finally:
        for module, module_flags in zip(modules, flags):
            for p, flag in zip(module.parameters(), module_flags):
                p.requires_grad_(flag)


def distillation_loss(model: nn.Module, encoder: nn.Module, x: Tensor, adj: Tensor) -> Tensor:
    """Eq. 11: ``sum_i KL(f(z_i; θ_c) ‖ f(h_i; θ_c))`` over all nodes, the teacher ``z`` of
    ``model`` (evaluation mode, no gradient) and the student ``h = encoder(x)``, both through
    ``model.readout`` (``θ_c``) without gradient to it."""
    with torch.no_grad():
        teacher = model.eval()(x, adj)
    head = model.readout
    student = F.linear(encoder(x), head.weight.detach(), None if head.bias is None else head.bias.detach())
    return kl_divergence(teacher, student, reduction="sum")


def identity_operator(n: int, device: torch.device) -> Tensor:
    """The ``[n, n]`` identity as a sparse CSR matrix."""
    index = torch.arange(n + 1, device=device)
    return torch.sparse_csr_tensor(index, index[:-1], torch.ones(n, device=device), (n, n))


class StackedEncoders:
    """The clients' MLP encoders ``φ`` as one :class:`~fglrepro.fl.engine.StackedGCN` pass: an
    MLP is the GCN of the same widths on the identity operator (``tests/test_graphless.py``).

    Args:
        encoder: an encoder of the federation (:class:`~fglrepro.models.MLP` without readout).
    """

    def __init__(self, encoder: MLP) -> None:
        with torch.device("meta"):  # the architecture only: no parameters, no random numbers
            twin = GCN(encoder.lins[0].in_features, encoder.hidden, encoder.lins[-1].out_features,
                       layers=len(encoder.lins), dropout=encoder.dropout)
        self.model = StackedGCN(twin)

    @staticmethod
    def _as_gcn(encoder: MLP) -> dict[str, Tensor]:
        return {name: p for i, lin in enumerate(encoder.lins)
                for name, p in ((f"convs.{i}.lin.weight", lin.weight), (f"convs.{i}.bias", lin.bias))}

    def gather(self, encoders: list[MLP]) -> list[Tensor]:
        """Stacked parameters ``[m, ...]`` of ``encoders`` (engine layout)."""
        return self.model.gather([self._as_gcn(e) for e in encoders])

    @torch.no_grad()
    def scatter(self, stacks: list[Tensor], encoders: list[MLP]) -> None:
        """Copy row i of ``stacks`` into ``encoders[i]``."""
        for i, encoder in enumerate(encoders):
            params = self._as_gcn(encoder)
            for j, name in enumerate(self.model.names):
                params[name].copy_(stacks[j][i].t() if name.endswith("weight") else stacks[j][i])

    def forward(self, params: list[Tensor], batch: ClientBatch, training: bool) -> Tensor:
        """``[N, d]`` embeddings ``H`` of the batch's nodes (``batch.adj`` the identity)."""
        return self.model.forward(params, batch, training).logits


@register("fedgls")
class FedGLS(ParameterAveraging):
    """See the module docstring."""

    label = "FedGLS"
    Hparams = FedGLSHparams

    @classmethod
    def check_protocol(cls, hparams: FedGLSHparams, setup: RunSetup) -> None:
        if not setup.model.readout:
            raise ConfigError("fedgls needs model.readout: true (the readout is the predictor θ_c of eq. 11)")

    def __init__(self, federation: Federation, hparams: FedGLSHparams) -> None:
        super().__init__(federation, hparams)
        model = federation.model
        if getattr(model, "readout", None) is None:
            raise ConfigError(f"fedgls needs a model with a readout; {type(model).__name__} has none")
        num_features = self.clients[0].x.size(1)
        #: the global feature encoder φ: an MLP of the GNN's depth and embedding width (eq. 20)
        self.global_encoder = MLP(num_features, model.hidden, model.hidden, layers=model.layers,
                                  dropout=model.dropout).to(
            self.clients[0].x.device)
        self.encoder_optimizers: dict[int, KernelOptimizer] = {}
        self.learner_optimizers: dict[int, KernelOptimizer] = {}
        #: fast path with homogeneous GCNs: the local epochs of all participants at once
        self.batched = (self.fast and federation.client_models is None and type(model) is GCN
                        and model.jk is None)
        self.gnn = StackedGCN(model) if self.batched else None
        self.encoders = StackedEncoders(self.global_encoder) if self.batched else None
        #: the stacked optimiser states of every client's θ and φ (batched local epochs)
        self.stacked_optimizers: tuple[StackedOptimizer, StackedOptimizer] | None = None
        self._batches: dict[tuple[int, ...], ClientBatch] = {}
        for k, (state, client) in enumerate(zip(self.states, self.clients)):
            state.modules["encoder"] = copy.deepcopy(self.global_encoder)
            if client.graphless:
                sparse = self.fast and bool(client.x.count_nonzero() < SPARSE_BELOW * client.x.numel())
                state.modules["learner"] = GraphLearner(num_features, hparams.k, hparams.learner_layers,
                                                        sparse).to(client.x.device)
                self.use_learned_graph(k)

    @property
    def fast(self) -> bool:
        """Whether the fast path runs (``train.engine`` is not ``sequential``)."""
        return self.federation.train.engine != "sequential"

    def use_learned_graph(self, k: int) -> None:
        """Client ``k`` trains and is tested on the graph its learner gives now."""
        with torch.no_grad():
            adj = self.states[k].modules["learner"](self.clients[k].x)
        self.clients[k] = replace(self.clients[k], adj=adj)

    def receive(self, k: int, round_: int) -> None:
        super().receive(k, round_)
        load_parameters(self.states[k].modules["encoder"], dict(self.global_encoder.named_parameters()))

    def learner_step(self, k: int) -> float:
        """One step of γ on ω minimising eqs. 8-9 (θ and φ fixed); returns the loss."""
        state, client = self.states[k], self.clients[k]
        learner = state.modules["learner"]
        if k not in self.learner_optimizers:
            self.learner_optimizers[k] = KernelOptimizer(learner.parameters(), lr=self.hparams.lr_learner)
        optimizer = self.learner_optimizers[k]
        learner.train()
        with frozen(state.model, state.modules["encoder"]):
            with torch.no_grad():
                h = state.modules["encoder"](client.x)
            optimizer.zero_grad(set_to_none=True)
            z = state.model(client.x, learner(client.x), return_hidden=True)[0]
            loss = graphless_contrastive_loss(z, h, self.hparams.temperature)
            loss.backward()
            optimizer.step()
        return loss.item()

    def client_update(self, k: int, round_: int) -> Upload:
        """Alg. 1 lines 4-18 for client ``k``; the recorded loss is the last cross-entropy."""
        self.receive(k, round_)
        state, train = self.states[k], self.federation.train
        if self.clients[k].graphless:
            self.learner_step(k)
            self.use_learned_graph(k)
        client, model, encoder = self.clients[k], state.model, state.modules["encoder"]
        if state.optimizer is None:
            state.optimizer = make_optimizer(model, train)
            self.encoder_optimizers[k] = make_optimizer(encoder, replace(train, lr=self.hparams.lr_encoder))
        loss = float("nan")
        for _ in range(train.local_epochs):
            loss = train_steps(state.optimizer, [model], 1, lambda: cross_entropy_loss(model, client))
            train_steps(self.encoder_optimizers[k], [encoder], 1,
                        lambda: distillation_loss(model, encoder, client.x, client.adj))
        return self.upload(k, round_, loss)

    def client_updates(self, ks: list[int], round_: int) -> dict[int, Upload]:
        """Each participant's :meth:`client_update`; on the fast path (homogeneous GCNs) step 3
        of all of them at once (module docstring)."""
        if not self.batched:
            return super().client_updates(ks, round_)
        for k in ks:
            self.receive(k, round_)
            if self.clients[k].graphless:
                self.learner_step(k)
                self.use_learned_graph(k)
        losses = self.batched_epochs(ks)
        return {k: self.upload(k, round_, loss) for k, loss in zip(ks, losses)}

    def batch(self, ks: list[int]) -> tuple[ClientBatch, ClientBatch]:
        """The union of clients ``ks`` on their current graphs (learned ones as sparse
        matrices), and the same nodes on the identity operator (for the encoders)."""
        key = tuple(ks)
        clients = [self.clients[k] for k in ks]
        adjs = [c.adj if c.adj.layout == torch.sparse_csr else c.adj.to_sparse_csr() for c in clients]
        if key not in self._batches:
            if len(self._batches) > 64:
                self._batches.clear()
            self._batches[key] = ClientBatch.of([replace(c, adj=a) for c, a in zip(clients, adjs)], ks)
        features = self._batches[key]
        n = features.batch.numel()
        return (replace(features, adj=block_diagonal(adjs)),
                replace(features, adj=identity_operator(n, features.batch.device)))

    def batched_epochs(self, ks: list[int]) -> list[float]:
        """Step 3 for the participants ``ks`` at once, from their current ``θ`` and ``φ``, which
        end holding the trained parameters; returns each client's last cross-entropy."""
        train = self.federation.train
        if self.stacked_optimizers is None:
            num_clients = len(self.clients)
            self.stacked_optimizers = (
                StackedOptimizer(self.gnn.gather([self.global_model]), num_clients, train),
                StackedOptimizer(self.encoders.gather([self.global_encoder]), num_clients,
                                 replace(train, lr=self.hparams.lr_encoder)),
            )
        theta_optimizer, phi_optimizer = self.stacked_optimizers
        models = [self.states[k].model for k in ks]
        encoders = [self.states[k].modules["encoder"] for k in ks]
        theta = [p.requires_grad_(True) for p in self.gnn.gather(models)]
        phi = [p.requires_grad_(True) for p in self.encoders.gather(encoders)]
        batch, nodes = self.batch(ks)
        head_weight, head_bias = self.gnn.layers[-1]
        losses = torch.full((len(ks),), float("nan"))
        for _ in range(train.local_epochs):
            per_client = VectorisedEngine.cross_entropy(self.gnn.forward(theta, batch, training=True))
            theta_optimizer.step(ks, theta, torch.autograd.grad(per_client.sum(), theta))
            losses = per_client.detach()
            with torch.no_grad():
                teacher = self.gnn.forward(theta, batch, training=False).logits
            h = batch.pad(self.encoders.forward(phi, nodes, training=True))
            student = batch.unpad(torch.bmm(h, theta[head_weight].detach())) + theta[head_bias].detach()[batch.batch]
            distillation = kl_divergence(teacher, student, reduction="sum")
            phi_optimizer.step(ks, phi, torch.autograd.grad(distillation, phi))
        self.gnn.scatter(theta, models)
        self.encoders.scatter(phi, encoders)
        return [check_finite(value) for value in losses.tolist()]

    def upload(self, k: int, round_: int, loss: float) -> Upload:
        """θ under its own parameter names and φ under ``encoder.<name>``."""
        upload = super().upload(k, round_, loss)
        upload.params.update({ENCODER + n: p for n, p in parameters_of(self.states[k].modules["encoder"]).items()})
        return upload

    def server_update(self, round_: int, uploads: dict[int, Upload]) -> None:
        """Eq. 12: FedAvg of θ and of φ."""
        average = self.aggregate(uploads)
        load_parameters(self.global_model, average)
        load_parameters(self.global_encoder,
                        {n[len(ENCODER):]: p for n, p in average.items() if n.startswith(ENCODER)})

    def download_bytes(self, k: int) -> int:
        return module_bytes(self.global_model) + module_bytes(self.global_encoder)
