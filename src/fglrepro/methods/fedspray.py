"""FedSpray (Fu et al., KDD 2024): class-wise structure proxies against biased neighbourhoods.

The paper is not in ``../shared/papers``; this follows the O-pFGL paper's description (App. I:
"optimizes the structure proxy along with the local model on each client. FedSpray uploads and
aggregates the structure proxy, which is used in local model training to prevent overfitting and
ensure the generalization to the minor classes") and, for the details, the authors' public code
(xbfu/FedSpray: ``client.py``, ``server.py``, ``utils.py``).

Each client keeps a personal GNN ``f_k`` (the tested model; never sent, so clients may have different
architectures) and learnable structure proxies ``s_v in R^d'`` for its nodes; the federation shares a
feature-structure model: encoder ``E`` (``x -> relu(W x + b)``, ``[F] -> [d']``), a proxy classifier
``g(E(x) + s)`` and a feature-only classifier ``g2(E(x))`` (``[d'] -> [C]``), and global class proxies
``S [C, d']``. In a round client k

1. receives ``E, g, g2, S`` (its local ``g2`` restarts from the received ``g``, as in the code);
2. soft-assigns proxies to its unlabelled nodes, ``s_v = softmax(g2(E(x_v))) S``, and marks as reliable
   its labelled nodes and the unlabelled ones with ``max softmax(g2(E(x_v))) > tau``;
3. trains ``f_k`` on ``CE(f_k, y)_L + lambda KL(p_teacher || p_f)_R`` (mean over reliable nodes ``R``)
   with the teacher ``g(E(x) + s)``;
4. trains ``E, g, g2`` and its proxies ``s`` on ``CE(g2(E(x)), y)_L + KL(p_f || p_g(E(x)+s))_L``: the
   proxies learn the structure information the GNN sees;
5. uploads ``E, g, g2`` and its class proxies ``s_k^c`` (mean of ``s_v`` over its labelled nodes of
   class c) with its label fractions ``q_k^c``.

The server averages the modules with weights = labelled-node counts and the proxies as
``S^c = sum_k q_k^c s_k^c / sum_k q_k^c``. With ``lambda = 0`` the GNN trains as Local's (up to float
rounding).

Fast path: step 3 runs on the vectorised engine where the GNNs allow it (else client by client);
step 4 does not depend on the GNN's architecture and always runs for all participants at once on
the disjoint union of their graphs, with client-stacked module weights (:class:`SharedStacks`) and
one Adam state per client; each client's loss is its own, so its gradient is the one it would
compute alone (``tests/test_fedspray.py`` checks it against one client at a time).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fglrepro.config import ConfigError
from fglrepro.fl.aggregation import weighted_average
from fglrepro.fl.clients import ClientData
from fglrepro.fl.communication import module_bytes, tensor_bytes
from fglrepro.fl.engine import ClientBatch, StackedOptimizer, train_rows
from fglrepro.fl.method import FederatedMethod, Federation, Objective, Upload
from fglrepro.methods import register
from fglrepro.sparse import SparseRows, sparse_matmul

#: features with a smaller share of non-zero entries are multiplied as sparse rows
SPARSE_BELOW = 0.1


@dataclass(frozen=True)
class FedSprayHparams:
    """Defaults of the authors' code (``main.py``) unless noted.

    Attributes:
        proxy_dim: d', the width of the encoder and the proxies (64).
        distill_weight: lambda, the weight of the teacher's KL in the GNN's loss (1.0).
        confidence: tau, the confidence above which an unlabelled node is reliable (0.7).
        proxy_lr: Adam learning rate of the node proxies (0.02).
        proxy_init: initial value of every node proxy (0.1).
        global_proxy_scale: initial global proxy of class c is ``scale * c`` in every entry (0.01).
        mlp_lr: learning rate of the shared modules (``None``: the study's ``train.lr``; the
            code uses one rate, 0.003, for the GNN and the modules).
    """

    proxy_dim: int = 64
    distill_weight: float = 1.0
    confidence: float = 0.7
    proxy_lr: float = 0.02
    proxy_init: float = 0.1
    global_proxy_scale: float = 0.01
    mlp_lr: float | None = None

    def __post_init__(self) -> None:
        if self.proxy_dim < 1:
            raise ConfigError(f"hparams of fedspray.proxy_dim must be >= 1, got {self.proxy_dim}")
        if self.distill_weight < 0:
            raise ConfigError(f"hparams of fedspray.distill_weight must be >= 0, got {self.distill_weight}")


class FeatureStructureModel(nn.Module):
    """The shared modules: ``encoder [F -> d']`` (ReLU), ``classifier`` on ``E(x) + s`` and
    ``classifier2`` on ``E(x)`` (``[d'] -> [C]`` each)."""

    def __init__(self, num_features: int, proxy_dim: int, num_classes: int) -> None:
        super().__init__()
        self.encoder = nn.Linear(num_features, proxy_dim)
        self.classifier = nn.Linear(proxy_dim, num_classes)
        self.classifier2 = nn.Linear(proxy_dim, num_classes)

    def forward(self, x: Tensor | SparseRows, proxies: Tensor) -> tuple[Tensor, Tensor]:
        """Logits ``[n, C]`` of the proxy classifier and of the feature-only classifier; ``x``
        dense ``[n, F]`` or its non-zero entries (:class:`~fglrepro.sparse.SparseRows`, the same
        product without the zeros)."""
        if isinstance(x, SparseRows):
            embedding = F.relu(sparse_matmul(x, self.encoder.weight.t().contiguous()) + self.encoder.bias)
        else:
            embedding = F.relu(self.encoder(x))
        return self.classifier(embedding + proxies), self.classifier2(embedding)


def soft_proxies(probabilities: Tensor, global_proxies: Tensor) -> Tensor:
    """``[n, d']`` proxies ``p_v S`` of nodes with class probabilities ``[n, C]``."""
    return probabilities @ global_proxies


def class_proxies(proxies: Tensor, labels: Tensor, num_classes: int) -> Tensor:
    """``[C, d']`` mean proxy of the labelled nodes of each class (zero for an absent class)."""
    sums = proxies.new_zeros(num_classes, proxies.size(1)).index_add_(0, labels, proxies)
    counts = torch.bincount(labels, minlength=num_classes).clamp_min(1).unsqueeze(1)
    return sums / counts


def pool_proxies(proxies: list[Tensor], fractions: list[Tensor]) -> Tensor:
    """``S^c = sum_k q_k^c s_k^c / sum_k q_k^c`` (``[C, d']``; a class no client has stays 0)."""
    q = torch.stack(fractions).unsqueeze(2)  # [K, C, 1]
    return (q * torch.stack(proxies)).sum(dim=0) / q.sum(dim=0).clamp_min(1e-12)


def teacher_kl(student_logits: Tensor, teacher_log_probs: Tensor) -> Tensor:
    """``[n]`` ``KL(p_teacher || p_student)`` of each node."""
    return F.kl_div(F.log_softmax(student_logits, dim=-1), teacher_log_probs, reduction="none",
                    log_target=True).sum(dim=-1)


class SharedStacks:
    """Every client's copy of the shared modules and its node proxies, stacked over the K clients.

    Attributes:
        names: parameter names of :class:`FeatureStructureModel`, in the order of ``stacks[:6]``.
        stacks: ``[K, F, d'], [K, d'], [K, d', C], [K, C], [K, d', C], [K, C]`` (weights as
            ``x @ W``) and the node proxies ``[K, n_max, d']`` (client k's in rows ``0..n_k-1``).
        optimizers: one stacked Adam for the modules (study's lr or ``mlp_lr``), one for the
            proxies (``proxy_lr``), each client with its own state, kept across rounds.
    """

    names = ("encoder.weight", "encoder.bias", "classifier.weight", "classifier.bias",
             "classifier2.weight", "classifier2.bias")

    def __init__(self, template: FeatureStructureModel, clients: list[ClientData], hparams: FedSprayHparams,
                 train) -> None:
        num = len(clients)
        weights = self.layout(template)
        n_max = max(c.num_nodes for c in clients)
        proxies = weights[0].new_zeros(num, n_max, hparams.proxy_dim)
        for k, client in enumerate(clients):
            proxies[k, :client.num_nodes] = hparams.proxy_init
        self.stacks = [w.unsqueeze(0).repeat(num, *([1] * w.dim())) for w in weights] + [proxies]
        module_train = train if hparams.mlp_lr is None else replace(train, lr=hparams.mlp_lr)
        self.modules_optimizer = StackedOptimizer(self.stacks[:6], num, module_train)
        self.proxy_optimizer = StackedOptimizer(self.stacks[6:], num, replace(train, lr=hparams.proxy_lr,
                                                                               weight_decay=0.0))

    @classmethod
    def layout(cls, model: FeatureStructureModel) -> list[Tensor]:
        """The module's parameters in the stacked layout (weights transposed), detached."""
        values = dict(model.named_parameters())
        return [values[n].detach().t().contiguous() if n.endswith("weight") else values[n].detach().clone()
                for n in cls.names]

    def load(self, k: int, model: FeatureStructureModel) -> None:
        """Client ``k``'s modules := ``model``'s parameters."""
        with torch.no_grad():
            for stack, value in zip(self.stacks, self.layout(model)):
                stack[k] = value

    def parameters(self, k: int) -> dict[str, Tensor]:
        """Client ``k``'s modules as named parameters of :class:`FeatureStructureModel`."""
        return {n: (s[k].t() if n.endswith("weight") else s[k]).clone() for n, s in zip(self.names, self.stacks)}

    def proxies(self, k: int, num_nodes: int) -> Tensor:
        """``[n_k, d']`` client ``k``'s node proxies (a view)."""
        return self.stacks[6][k, :num_nodes]

    def step(self, ks: list[int], params: list[Tensor], grads: list[Tensor]) -> None:
        """One Adam step of participants ``ks`` (their rows ``params``, ``grads``)."""
        self.modules_optimizer.step(ks, params[:6], grads[:6])
        self.proxy_optimizer.step(ks, params[6:], grads[6:])


def stacked_shared_forward(params: list[Tensor], batch: ClientBatch, rows: Tensor) -> tuple[Tensor, Tensor]:
    """Logits ``[N, C]`` of every participant's proxy classifier and feature-only classifier on
    its own nodes; ``params`` the participants' rows of :attr:`SharedStacks.stacks`, ``rows [N]``
    each node's row in the flattened ``[m * n_max, d']`` proxies."""
    enc_w, enc_b, cls_w, cls_b, cls2_w, cls2_b, proxies = params
    if batch.x_pad is not None:
        hidden = batch.unpad(torch.bmm(batch.x_pad, enc_w))
    else:
        hidden = sparse_matmul(batch.stacked, enc_w.reshape(-1, enc_w.size(-1)))
    hidden = F.relu(hidden + enc_b[batch.batch])
    node_proxies = proxies.reshape(-1, proxies.size(-1)).index_select(0, rows)
    with_proxies = batch.unpad(torch.bmm(batch.pad(hidden + node_proxies), cls_w)) + cls_b[batch.batch]
    features_only = batch.unpad(torch.bmm(batch.pad(hidden), cls2_w)) + cls2_b[batch.batch]
    return with_proxies, features_only


@register("fedspray")
class FedSpray(FederatedMethod):
    """Personal GNNs distilled from a shared proxy-aided model; ``eval_model`` is the personal GNN.
    ``client_updates``: step 3 for every participant (engine or client by client), then step 4
    for all of them at once, then the uploads."""

    label = "FedSpray"
    Hparams = FedSprayHparams
    has_global_model = False
    heterogeneous_models = True
    vectorised = True

    def __init__(self, federation: Federation, hparams: FedSprayHparams) -> None:
        super().__init__(federation, hparams)
        first = self.clients[0]
        num_classes, num_features = first.num_classes, first.x.size(1)
        self.global_model = FeatureStructureModel(num_features, hparams.proxy_dim, num_classes).to(first.x.device)
        steps = torch.arange(num_classes, dtype=first.x.dtype, device=first.x.device)
        self.global_proxies = (hparams.global_proxy_scale * steps).unsqueeze(1).expand(-1, hparams.proxy_dim).clone()
        self.shared = SharedStacks(self.global_model, self.clients, hparams, federation.train)
        self.features = [SparseRows.of(c.x) if c.x.count_nonzero() < SPARSE_BELOW * c.x.numel() else c.x
                         for c in self.clients]
        self.batches: dict[tuple[int, ...], ClientBatch] = {}
        #: per client, set by :meth:`receive`: the teacher's log-probabilities and the reliable nodes;
        #: by :meth:`upload`: the trained GNN's log-probabilities on the labelled nodes
        self.teacher: dict[int, Tensor] = {}
        self.reliable: dict[int, Tensor] = {}
        self.gnn_targets: dict[int, Tensor] = {}

    def proxies(self, k: int) -> Tensor:
        """``[n_k, d']`` client ``k``'s node proxies."""
        return self.shared.proxies(k, self.clients[k].num_nodes)

    def receive(self, k: int, round_: int) -> None:
        """Steps 1-2: load the shared modules, assign proxies to unlabelled nodes, and compute the
        teacher and the reliable nodes."""
        client, proxies = self.clients[k], self.proxies(k)
        self.shared.load(k, self.global_model)
        with torch.no_grad():
            self.shared.stacks[4][k] = self.shared.stacks[2][k]  # classifier2 := received classifier
            self.shared.stacks[5][k] = self.shared.stacks[3][k]
            _, feature_logits = self.global_model(self.features[k], proxies)
            probabilities = F.softmax(feature_logits, dim=-1)
            unlabelled = ~client.train_mask
            proxies[unlabelled] = soft_proxies(probabilities[unlabelled], self.global_proxies)
            teacher_logits, _ = self.global_model(self.features[k], proxies)
        self.teacher[k] = F.log_softmax(teacher_logits, dim=-1)
        confident = probabilities.max(dim=-1).values > self.hparams.confidence
        self.reliable[k] = client.train_mask | (unlabelled & confident)

    def local_objective(self, k: int, round_: int) -> Objective:
        """Step 3 on the sequential path."""
        model, client = self.states[k].model, self.clients[k]
        teacher, reliable, weight = self.teacher[k], self.reliable[k], self.hparams.distill_weight
        mask = client.train_mask

        def objective() -> Tensor:
            logits = model(client.x, client.adj)
            loss = F.cross_entropy(logits[mask], client.y[mask])
            return loss + weight * teacher_kl(logits[reliable], teacher[reliable]).mean()

        return objective

    def batched_extra_loss(self, ks: list[int], round_: int, engine):
        """Step 3's distillation term on the vectorised engine: ``[m]`` lambda times each
        client's mean KL over its reliable nodes."""
        teacher = torch.cat([self.teacher[k] for k in ks])
        reliable = torch.cat([self.reliable[k] for k in ks])
        weight = self.hparams.distill_weight

        def terms(out, params) -> Tensor:
            batch = out.batch
            kl = teacher_kl(out.logits[reliable], teacher[reliable])
            counts = torch.bincount(batch.batch[reliable], minlength=batch.num_clients).clamp_min(1)
            return weight * batch.per_client_sum(kl, reliable) / counts

        return terms

    def upload(self, k: int, round_: int, loss: float) -> Upload:
        """After step 3: keep the trained GNN's log-probabilities on the labelled nodes (the
        target of step 4); the upload is completed in :meth:`client_updates`."""
        client, model = self.clients[k], self.states[k].model
        model.eval()
        with torch.no_grad():
            self.gnn_targets[k] = F.log_softmax(model(client.x, client.adj)[client.train_mask], dim=-1)
        return Upload(params={}, weight=float(client.train_mask.sum()), loss=loss)

    def client_updates(self, ks: list[int], round_: int) -> dict[int, Upload]:
        uploads = super().client_updates(ks, round_)
        done = list(uploads)
        if done:
            self.train_shared(done)
        for k, upload in uploads.items():
            client = self.clients[k]
            labels = client.y[client.train_mask]
            counts = torch.bincount(labels, minlength=client.num_classes).to(self.global_proxies.dtype)
            upload.params = self.shared.parameters(k)
            upload.extras = {
                "proxies": class_proxies(self.proxies(k).detach()[client.train_mask], labels, client.num_classes),
                "label_fraction": counts / counts.sum().clamp_min(1),
            }
        return uploads

    def batch(self, ks: list[int]) -> ClientBatch:
        """The disjoint union of clients ``ks`` (cached per participant set)."""
        key = tuple(ks)
        if key not in self.batches:
            self.batches = {key: ClientBatch.of([self.clients[k] for k in ks], ks)}
        return self.batches[key]

    def train_shared(self, ks: list[int]) -> None:
        """Step 4 for the participants ``ks`` at once: ``train.local_epochs`` steps of each
        client's ``CE(g2(E(x)), y)_L + KL(p_f || p_g(E(x)+s))_L`` on its modules and proxies."""
        batch = self.batch(ks)
        width = self.shared.stacks[6].size(1)
        rows = batch.batch * width + torch.cat([torch.arange(n, device=batch.y.device) for n in batch.sizes.tolist()])
        train = batch.train_mask
        labels, target = batch.y[train], torch.cat([self.gnn_targets[k] for k in ks])
        counts = torch.bincount(batch.batch[train], minlength=batch.num_clients).clamp_min(1)

        def loss(params: list[Tensor], epoch: int) -> Tensor:
            with_proxies, features_only = stacked_shared_forward(params, batch, rows)
            per_node = (F.cross_entropy(features_only[train], labels, reduction="none")
                        + teacher_kl(with_proxies[train], target))
            return batch.per_client_sum(per_node, train) / counts

        train_rows(self.shared.stacks, ks, self.federation.train.local_epochs, loss, self.shared)

    def server_update(self, round_: int, uploads: dict[int, Upload]) -> None:
        ups = list(uploads.values())
        averaged = weighted_average([u.params for u in ups], [u.weight for u in ups])
        with torch.no_grad():
            for name, param in self.global_model.named_parameters():
                param.copy_(averaged[name])
        self.global_proxies = pool_proxies([u.extras["proxies"] for u in ups],
                                           [u.extras["label_fraction"] for u in ups])

    def download_bytes(self, k: int) -> int:
        """The shared modules and the global class proxies."""
        return module_bytes(self.global_model) + tensor_bytes([self.global_proxies])
