"""FedGKD (Pan et al., NeurIPS 2023 GLFrontiers, "FedGKD: Unleashing the Power of
Collaboration in Federated Graph Neural Networks"), Algorithms 1-2.

Round t: client i starts from its personalised model W̄_i, trains on
``CE + lambda ||W - W̄_i||^2``, distils its data with the just-trained W_i into a small graph
grown from the server's broadcast ``(X0, y0)`` and uploads W_i with the task feature
``M_i = [X_s || H_s]`` (eq. 7). The server relates the tasks by feature-wise Pearson
correlation (eq. 10), kernelises the collaboration network (eq. 11) and sends client i
``W̄_i = sum_j q_ij W_j`` (eq. 8-9, not weighted by client size).

Its own parts: :mod:`.graph_distillation` (the clients' graph distillation) and
:mod:`.task_relator` (the server's task relatedness and collaboration weights).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from fglrepro.config import ConfigError, choice
from fglrepro.fl.aggregation import load_parameters, parameters_of, personalized_average
from fglrepro.fl.communication import module_bytes, tensor_bytes
from fglrepro.fl.engine import BatchedTerms, VectorisedEngine
from fglrepro.fl.losses import proximal_term, stacked_proximal_term
from fglrepro.fl.method import ExtraLoss, FederatedMethod, Federation, Upload
from fglrepro.fl.training import cross_entropy_loss, make_optimizer, train_steps
from fglrepro.methods import register
from fglrepro.methods.fedgkd.graph_distillation import (
    DistilledGraph,
    DistillSettings,
    broadcast_graph,
    distill_graph,
    distill_graphs,
)
from fglrepro.methods.fedgkd.task_relator import KERNELS, effective_collaborators, relator_weights

log = logging.getLogger(__name__)

#: Task features of Figure 9: X_s, H_s, [X_s || H_s] (eq. 7, the default) or the soft labels y_s.
TASK_FEATURES = ("x", "h", "xh", "labels")
#: Figure 10: distil every round with the current model (dynamic) or once before training (static).
EXTRACTORS = ("dynamic", "static")


@dataclass(frozen=True)
class FedGKDHparams:
    """Stated in the paper: tau_g = 1 (6.2), gamma's best value 0.75 (F.2) and the grids of
    App. D.3 (gamma, tau_s, tau, lambda, lr, local epochs). Not stated in paper: m, E_d, the
    distillation optimiser and learning rate, which tau / tau_s / lambda are best; defaults
    here are mid-grid values to be tuned by a study's ``grid``; m = 5, E_d = 5 keep the
    distillation cheap ("a few steps of gradient updates suffice", 5.2.3), and the learning rate
    0.2 lets Adam move each entry of X_s by about 1 = the std of X0 in E_d steps (with 0.01 X_s
    stays within 0.05 of the common X0 and eq. 10 relates every pair of clients at ~0.95).

    lambda_prox: weight of ``||W - W̄_i||^2`` (squared norm, no 1/2; grid {1e-5, 1e-3}).
    gamma: edge sparsity of eq. 5 (grid {0.001, 0.75, 1.5, 2.5, 5}).
    tau_g: Gumbel-softmax temperature of eq. 6.
    tau: temperature of the matrix exponential (grid {0.05, 0.1, 0.25, 0.5, 0.75, 1}).
    tau_s: temperature of the element-wise exponential (grid {1, 3, 5, 7, 9}).
    kernel: S of eq. 11: ``global`` (e^{tau R}), ``local`` (R) or ``square`` (R^2) (Figure 5).
    series_start: eq. 11's series starts at kappa = 1 as printed (e^{tau R} - I; tau -> 0 gives
        FedAvg) or at 0 (e^{tau R}, the kernel of Proposition G.1).
    nodes_per_class: m, distilled nodes per class (graph of m * C nodes).
    distill_steps: E_d, distillation steps per round.
    distill_lr: Adam learning rate of X_s and y_s.
    task_feature: ``xh`` = [X_s || H_s] (eq. 7), ``x``, ``h`` or ``labels`` (Figure 9).
    extractor: ``dynamic`` (every round, the paper's method) or ``static`` (Figure 10; a
        stand-in, see :meth:`FedGKD.static_feature`).
    static_epochs: local training steps of the static stand-in's pre-trained model.
    """

    lambda_prox: float = 1e-3
    gamma: float = 0.75
    tau_g: float = 1.0
    tau: float = 0.5
    tau_s: float = 5.0
    kernel: str = "global"
    series_start: int = 1
    nodes_per_class: int = 5
    distill_steps: int = 5
    distill_lr: float = 0.2
    task_feature: str = "xh"
    extractor: str = "dynamic"
    static_epochs: int = 100

    def __post_init__(self) -> None:
        choice(self.kernel, KERNELS, "hparams.kernel")
        choice(self.task_feature, TASK_FEATURES, "hparams.task_feature")
        choice(self.extractor, EXTRACTORS, "hparams.extractor")
        if self.series_start not in (0, 1):
            raise ConfigError(f"hparams.series_start = {self.series_start!r} is not valid; choose one of [0, 1]")
        for key in ("lambda_prox", "gamma", "tau", "tau_s", "distill_lr"):
            if getattr(self, key) < 0:
                raise ConfigError(f"hparams.{key} must be >= 0, got {getattr(self, key)}")
        if self.tau_g <= 0:
            raise ConfigError(f"hparams.tau_g must be > 0, got {self.tau_g}")
        for key in ("nodes_per_class", "distill_steps", "static_epochs"):
            if getattr(self, key) < 1:
                raise ConfigError(f"hparams.{key} must be >= 1, got {getattr(self, key)}")


@register("fedgkd")
class FedGKD(FederatedMethod):
    """Client state: ``model`` = W_i (trained locally, tested at ``evaluation.model: local``),
    ``received`` = W̄_i, the personalised model from the server (initially the common initial
    model). ``weights`` holds the last round's ``q [n, n]`` over the sorted uploading clients.

    On the vectorised engine (unless ``train.engine`` is ``sequential``) the round is batched
    over clients: local steps on the engine, the participants' distillations as one problem
    (:func:`distill_graphs`), and the W̄_i kept stacked (``received_stacks``, ``[K, ...]``
    in the engine layout, the ``received`` models views of their rows) so that receiving and
    the proximal anchors take one operation per parameter.
    The static extractor's one-off pre-training and distillation stay per client.
    """

    label = "FedGKD"
    Hparams = FedGKDHparams
    has_server_models = True
    vectorised = True

    def __init__(self, federation: Federation, hparams: FedGKDHparams) -> None:
        super().__init__(federation, hparams)
        for k, state in enumerate(self.states):
            state.received = federation.client_model(k)
        self.distill = DistillSettings(hparams.distill_steps, hparams.distill_lr, hparams.gamma, hparams.tau_g)
        self.broadcast: tuple[Tensor, Tensor] | None = None
        self.received_broadcast: set[int] = set()
        self.features: dict[int, Tensor] = {}
        self.weights: Tensor | None = None
        self.received_stacks: list[Tensor] | None = None
        if self.batched:
            received = [state.received for state in self.states]
            self.received_stacks = federation.engine.model.gather(received)
            federation.engine.model.bind(self.received_stacks, received)

    @property
    def batched(self) -> bool:
        """Whether rounds run batched over clients: on the vectorised engine, unless
        ``train.engine`` is ``sequential``."""
        return self.federation.engine is not None and self.federation.train.engine != "sequential"

    @property
    def batched_distillation(self) -> bool:
        """Whether the participants distil as one batched problem (:func:`distill_graphs`):
        :attr:`batched` with the dynamic extractor."""
        return self.batched and self.hparams.extractor == "dynamic"

    def client_updates(self, ks: list[int], round_: int) -> dict[int, Upload]:
        """Draw the broadcast ``(X0, y0)`` from the run's seeded generator (dynamic: every round;
        static: once, in the first round), then the clients' rounds; with
        :attr:`batched_distillation` the uploaders' task features are distilled together."""
        self.received_broadcast = set()
        if self.hparams.extractor == "dynamic" or self.broadcast is None:
            client = self.clients[0]
            x0, y0 = broadcast_graph(self.hparams.nodes_per_class, client.num_classes, client.x.size(1),
                                     self.federation.generator)
            self.broadcast = (x0.to(client.x.device), y0.to(client.x.device))
        uploads = super().client_updates(ks, round_)
        if self.batched_distillation and uploads:
            engine = self.federation.engine
            ids = list(uploads)
            x0, y0 = self.broadcast
            graphs = distill_graphs(engine.model, engine.stacked([self.states[k].model for k in ids]), x0, y0,
                                    self.clients[0].num_classes, self.distill, self.federation.generator)
            for k, feature in zip(ids, self.selected_feature(graphs)):
                uploads[k].extras["task_feature"] = feature
            self.received_broadcast.update(ids)
        return uploads

    def receive(self, k: int, round_: int) -> None:
        """Start from W̄_k."""
        load_parameters(self.states[k].model, parameters_of(self.states[k].received))

    def batched_receive(self, ks: list[int], round_: int, engine: VectorisedEngine) -> None:
        """:meth:`receive` for all participants with one copy per parameter."""
        rows = torch.tensor(ks, device=engine.stacks[0].device)
        with torch.no_grad():
            for stack, received in zip(engine.stacks, self.received_rows(ks)):
                stack.index_copy_(0, rows, received)

    def received_rows(self, ks: list[int]) -> list[Tensor]:
        """The W̄_k of clients ``ks`` from :attr:`received_stacks`, ``[m, ...]`` each (the stacks
        themselves when ``ks`` are all clients)."""
        if ks == list(range(len(self.clients))):
            return self.received_stacks
        rows = torch.tensor(ks, device=self.received_stacks[0].device)
        return [stack.index_select(0, rows) for stack in self.received_stacks]

    def extra_loss(self, k: int, round_: int) -> ExtraLoss | None:
        """``lambda ||W - W̄_k||^2`` (Algorithm 1, line 19)."""
        lam = self.hparams.lambda_prox
        if lam == 0:
            return None
        reference = parameters_of(self.states[k].received)
        return lambda model: lam * proximal_term(model, reference)

    def batched_extra_loss(self, ks: list[int], round_: int, engine: VectorisedEngine) -> BatchedTerms | None:
        """:meth:`extra_loss` of the participants ``ks`` as one ``[m]`` tensor."""
        lam = self.hparams.lambda_prox
        if lam == 0:
            return None
        anchors = self.received_rows(ks)
        return lambda out, params: lam * stacked_proximal_term(params, anchors)

    def task_feature(self, model: nn.Module) -> Tensor:
        """Distil with ``model`` from this round's broadcast; the feature of ``hparams.task_feature``
        (``xh``: ``[X_s || H_s]``, ``[mC, D + d]``)."""
        x0, y0 = self.broadcast
        return self.selected_feature(
            distill_graph(model, x0, y0, self.clients[0].num_classes, self.distill, self.federation.generator))

    def selected_feature(self, graph: DistilledGraph) -> Tensor:
        """The distilled graph's feature named by ``hparams.task_feature`` (along the last
        dimension: ``xh`` = ``[X_s || H_s]``), rounded from the distillation's float64 to the
        broadcast's dtype (float32) for the upload."""
        feature = {"x": graph.x, "h": graph.hidden, "labels": graph.labels,
                   "xh": torch.cat([graph.x, graph.hidden], dim=-1)}[self.hparams.task_feature]
        return feature.to(self.broadcast[0].dtype)

    def static_feature(self, k: int) -> Tensor:
        """Figure 10's static extractor, a stand-in: the paper distils each client's data once
        before federated training with the one-step gradient-matching condensation of Jin et
        al. (KDD 2022). Here client k trains a copy of its initial model alone for
        ``static_epochs`` full-batch steps and runs this module's distillation once with it; the
        feature is then kept for the whole run. The same size and alignment (common X0) as the
        dynamic feature, not the gradient-matching algorithm."""
        model = self.federation.client_model(k)
        optimizer = make_optimizer(model, self.federation.train)
        client = self.clients[k]
        train_steps(optimizer, [model], self.hparams.static_epochs, lambda: cross_entropy_loss(model, client))
        return self.task_feature(model)

    def upload(self, k: int, round_: int, loss: float) -> Upload:
        """W_k and the task feature (static extractor: only the first time k takes part; with
        :attr:`batched_distillation` :meth:`client_updates` adds it)."""
        upload = super().upload(k, round_, loss)
        if self.batched_distillation:
            return upload
        if self.hparams.extractor == "dynamic":
            upload.extras["task_feature"] = self.task_feature(self.states[k].model)
        elif k not in self.features:
            upload.extras["task_feature"] = self.static_feature(k)
        if upload.extras:
            self.received_broadcast.add(k)
        return upload

    def server_update(self, round_: int, uploads: dict[int, Upload]) -> None:
        """``q`` from the uploaders' task features (eq. 9-11), then ``W̄_i = sum_j q_ij W_j``."""
        ids = sorted(uploads)
        for k in ids:
            if "task_feature" in uploads[k].extras:
                self.features[k] = uploads[k].extras["task_feature"]
        features = torch.stack([self.features[k] for k in ids])
        h = self.hparams
        self.weights = relator_weights(features, h.kernel, h.tau, h.tau_s, h.series_start)
        if round_ == 1:
            self.report_spread()
        for k, params in zip(ids, personalized_average([uploads[k].params for k in ids], self.weights)):
            load_parameters(self.states[k].received, params)

    def report_spread(self) -> None:
        """Log how many clients the first round's ``q`` spreads each personalised model over (the median
        of :func:`~.task_relator.effective_collaborators`), as a warning when it is below 1.5: the kernel's
        entries grow like ``e^{tau n r}`` with the number of clients, so a ``tau`` that suits 10 clients can
        make the softmax of eq. 9 one-hot at 30-50, and every client then receives one client's model."""
        spread = float(effective_collaborators(self.weights).median())
        h, count = self.hparams, self.weights.size(0)
        message = (f"FedGKD round 1: the personalised weights q spread each model over {spread:.2f} of {count} "
                   f"clients (median 1 / sum_j q_ij^2; kernel {h.kernel}, tau {h.tau}, tau_s {h.tau_s})")
        if spread < 1.5:
            log.warning("%s: each client receives about one client's model; a smaller hparams.tau or tau_s "
                        "spreads q", message)
        else:
            log.info("%s", message)

    def download_bytes(self, k: int) -> int:
        """W̄_k and, when k distilled this round, the broadcast ``(X0, y0)``."""
        broadcast = tensor_bytes(self.broadcast) if k in self.received_broadcast else 0
        return module_bytes(self.states[k].received) + broadcast

    def server_models(self) -> list[nn.Module]:
        return [state.received for state in self.states]
