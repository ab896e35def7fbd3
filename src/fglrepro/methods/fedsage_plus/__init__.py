"""FedSage+ (Zhang et al., NeurIPS 2021): federated missing-neighbour generation, then
FedAvg of the classifier on the mended client graphs (code: zkhku/fedsage, OpenFGL).

Its own part: :mod:`.neighbor_generation` (NeighGen, the missing-neighbour generator).
"""

from __future__ import annotations

import copy
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from fglrepro.config import ConfigError
from fglrepro.fl.clients import ClientData, normalized_adjacency
from fglrepro.fl.communication import tensor_bytes
from fglrepro.fl.method import Federation, ParameterAveraging, RunSetup, Upload
from fglrepro.fl.ticker import Ticker
from fglrepro.fl.training import make_optimizer
from fglrepro.methods import register
from fglrepro.methods.fedsage_plus.neighbor_generation import (
    NeighborSampler,
    NeighGen,
    greedy_feature_loss,
    impair_graph,
    mend_graph,
    mended_client,
    used_slots,
)

#: What a client's phase-1 upload relays to its peers: generated features ``[n_train, P, F]``
#: of its training nodes, their predicted and their true missing-neighbour counts ``[n_train]``.
PEER_PAYLOAD = ("features", "pred_counts", "true_counts")


@dataclass(frozen=True)
class FedSagePlusHparams:
    """FedSage+ hyperparameters (defaults of the FedTAD authors' OpenFGL ``fedsage_plus``
    config, which FedTAD's baselines use; equal to zkhku/fedsage ``config.py`` where both set one).

    generator_rounds: the first rounds of ``train.rounds`` train NeighGen; the rest train
        the classifier (OpenFGL ``gen_rounds`` = 50 of 100 rounds).
    hidden_portion: fraction of the nodes outside the training and test sets hidden to
        build the impaired graph (0.5 in both codes).
    num_pred: most neighbours generated per node (5 in both codes).
    latent_dim: NeighGen encoding size (128 in both codes).
    count_weight, feature_weight, class_weight: weights of the dGen smooth-L1, fGen
        greedy-matching (local and cross-client) and auxiliary classification losses
        (1, 1, 1 in both codes).
        client_major: run phase 1 client by client (same numbers, one client's Adam moments in
        memory at a time, but all of it inside round 1, so a checkpoint cannot resume within it);
        False: round by round (every client's NeighGen and moments held; checkpoints between
        generator rounds, for runs of hours that may be stopped). Partial participation always runs
        round by round. Not a parameter of the method: no paper states it.
    """

    generator_rounds: int = 50
    hidden_portion: float = 0.5
    num_pred: int = 5
    latent_dim: int = 128
    count_weight: float = 1.0
    feature_weight: float = 1.0
    class_weight: float = 1.0
    client_major: bool = True

    def __post_init__(self) -> None:
        if self.generator_rounds < 0 or self.num_pred < 0 or self.latent_dim < 1:
            raise ConfigError(
                f"fedsage_plus needs generator_rounds >= 0, num_pred >= 0, latent_dim >= 1; got "
                f"{self.generator_rounds}, {self.num_pred}, {self.latent_dim}"
            )
        if not 0.0 <= self.hidden_portion < 1.0:
            raise ConfigError(f"fedsage_plus hidden_portion must be in [0, 1), got {self.hidden_portion}")


def draw_seed(generator: torch.Generator) -> int:
    """A seed for :func:`seeded_rng`, drawn from ``generator``."""
    return int(torch.randint(0, 2**62, (1,), generator=generator))


@contextmanager
def seeded_rng(seed: int, device: torch.device):
    """Run the block on torch's global RNG seeded with ``seed`` and restored after, so
    NeighGen's noise, dropout and initialisation leave the classifier's draws as in FedAvg."""
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        torch.manual_seed(seed)
        yield


@dataclass
class SentUpload(Upload):
    """A phase-1 upload of the client-major path, already relayed: its loss and its size in bytes
    (``sent``, what :attr:`Upload.num_bytes` counted for the tensors it held), plus any tensor a
    wrapping method adds to it (FedTAD's reliability)."""

    sent: int = 0

    @property
    def num_bytes(self) -> int:
        return self.sent + super().num_bytes


@dataclass
class GeneratorPhase:
    """Phase 1 run client by client (:meth:`FedSagePlus.generator_phase`): per round, the uploads
    the round loop records and each client's download in bytes; the mended graphs, installed
    after the last generator round."""

    uploads: list[dict[int, SentUpload]] = field(default_factory=list)
    download_bytes: list[list[int]] = field(default_factory=list)
    mended: list[ClientData] = field(default_factory=list)


@register("fedsage_plus")
class FedSagePlus(ParameterAveraging):
    """Two phases on the shared round loop.

    Rounds ``1..generator_rounds`` (phase 1): every client trains its own NeighGen on its
    impaired graph (``train.local_epochs`` Adam steps of the ``train`` optimiser per
    round) with loss ``(count_weight * L_d + feature_weight * (L_f + sum_j L_f^j) +
    class_weight * L_c) / K``: dGen smooth-L1 to the hidden-neighbour counts, greedy
    feature matching to the hidden neighbours, cross-entropy of an auxiliary local GCN
    on the impaired graph mended with the generated neighbours, and the cross-client
    terms ``L_f^j``. ``L_f^j`` matches client k's generated features (for its training
    nodes) to neighbour features of random nodes of client j, as in the authors' code;
    instead of reading j's features, k uploads its generated features, j returns the
    gradient of ``L_f^j`` with respect to them, and k backpropagates it through fGen
    (gradient sharing as in the paper, but of the generated features, not of fGen's
    parameters: K uploads instead of K^2 fGen passes). The gradient k applies in round t
    was computed by the other clients in round t-1 on the features k uploaded in round t-2.
    fGen runs only on nodes whose generated neighbours can reach a training node's logits.

    Client-major order (``hparams.client_major``, every client in every round): no NeighGen
    reads another's, so phase 1 runs client by client (:meth:`generator_phase`, in the first
    round's client update): every generator round of client 0, then of client 1, ..., each
    NeighGen dropped with its optimiser state once its graph is mended, so that one client's Adam
    moments exist at a time instead of K. Its random draws are those of the round-major order,
    drawn first in that order from the run's generator (the seed of each client round, the
    peers' neighbour samples, the mending seeds); the rounds then report the recorded losses and
    bytes, and the mended graphs replace the clients' after the last generator round: the same
    run record bit for bit. Checkpoints are written between rounds, so phase 1 then resumes only
    from its start. With partial participation the rounds run round-major.

    fGen's output layer (``2048 x P*F``) dominates the cost, and only each node's first
    ``min(P, predicted count)`` slots are ever read. Unless ``train.engine`` is
    ``sequential`` (the dense reference), it is evaluated only at the (row, slot) pairs
    that are read (:meth:`NeighGen.generate`), the same numbers up to float rounding:
    in a local step, the slots below the predicted count of every node of the region
    (the mended graph; the greedy loss reads a subset of them) and the slots where the
    peer gradient is non-zero (it comes from counts of an earlier round); in the upload,
    the slots below the uploaded predicted counts (the only ones peers' losses read);
    when mending, the slots below each node's count. On every path the greedy loss measures
    only the distances it reads (:func:`greedy_feature_loss`) and a local step's mended graph
    takes fGen's region rows as they are (:func:`mend_graph` with ``rows``): the same numbers.
    With few rows per slot (about 8 on Cora-10) the layer is memory-bound, not compute-bound:
    on that path, with fused Adam, a local step's backward pass steps the layer's weight
    itself, tile by tile while its gradient is in cache (:class:`SlotLinear` with an
    optimizer), the same update bit for bit without writing and rereading a gradient of the
    weight's size.

    Memory: a client's NeighGen output layer is ``P * F * 2048`` floats (59 MB on Cora, 152 MB
    on CiteSeer), and Adam adds two moments of that size once it trains. Adam's weight decay
    moves every weight at every step, read or not, so a slot's weights and moments are needed
    as long as a later step or the mending may read that slot (in a Cora-10 run 40 of the 50
    client slots are read at some step). Round-major, phase 1 holds all K NeighGens with their
    moments; client-major, one client's moments at a time, each NeighGen dropped once its graph
    is mended, so that the K NeighGens' initial weights (built at once, from one stream of
    draws) are most of what is left: the seed-0 runs of FedTAD Table 2 peak at 1074 MB on
    Cora-10 and 3809 MB on CiteSeer-20, against 2242 and 9777 MB round-major. The peer
    gradients, K - 1 per upload and all K uploads of a round held until the server relays them,
    are non-zero only at the (node, slot) pairs the peers' losses read, and travel as sparse
    tensors of those pairs (:func:`sparse_slots`; counted as sent dense, as before); the server
    sums them densely in the same order.

    After round ``generator_rounds`` every client runs its NeighGen (eval mode) on its
    whole local graph and attaches the generated neighbours (:func:`mended_client`); the
    NeighGens and their optimisers are then dropped.

    Later rounds (phase 2): FedAvg of the study's model on the mended graphs, starting
    from the same initial model as FedAvg, weighted by the original node counts.
    Evaluation then runs on the mended graphs, as trained (and as OpenFGL evaluates):
    the generated neighbours are part of each node's input, while the masks select only
    original nodes. During phase 1 the untrained global model is evaluated.
    """

    label = "FedSage+"
    Hparams = FedSagePlusHparams

    def __init__(self, federation: Federation, hparams: FedSagePlusHparams) -> None:
        super().__init__(federation, hparams)
        self.clients = list(federation.clients)
        self.node_counts = [c.num_nodes for c in self.clients]
        self.device = self.clients[0].x.device
        gen = federation.generator
        self.impaired = [impair_graph(c, hparams.hidden_portion, hparams.num_pred, gen) for c in self.clients]
        with seeded_rng(draw_seed(gen), self.device):
            self.neighgens = [
                NeighGen(c.x.size(1), _hidden_width(federation.model), hparams.latent_dim, hparams.num_pred,
                         _dropout(federation.model)).to(self.device)
                for c in self.clients
            ]
        self.aux_classifiers = [copy.deepcopy(federation.model) for _ in self.clients]
        #: per impaired graph: training nodes, and the nodes whose generated features can
        #: reach a training node's logits (within ``layers - 1`` hops; fGen runs only there)
        self.train_nodes = [g.train_mask.nonzero().flatten() for g in self.impaired]
        self.regions = [
            _within_hops(g.edge_index, g.train_mask, len(federation.model.convs) - 1) for g in self.impaired
        ]
        self.gen_optimizers = [
            make_optimizer(torch.nn.ModuleList([g, c]), federation.train, fused=True)
            for g, c in zip(self.neighgens, self.aux_classifiers)
        ]
        #: phase-1 mailboxes: peer_features[k][j] = (features, pred counts, true counts) of
        #: client j's training nodes; peer_grads[k] = summed gradient for k's features.
        self.peer_features: list[dict[int, tuple[Tensor, Tensor, Tensor]]] = [{} for _ in self.clients]
        self.peer_grads: list[Tensor | None] = [None] * len(self.clients)
        #: peer_slots[k] = ``[n_train, P]`` slots where peer_grads[k] is non-zero (fast path only)
        self.peer_slots: list[Tensor | None] = [None] * len(self.clients)
        self.received_bytes = [0] * len(self.clients)
        #: per client: the targets of its peers' cross-client losses (its original graph)
        self.samplers = [NeighborSampler(c) for c in self.clients]
        #: evaluate fGen's output layer only at the slots that are read (see the class docstring)
        self.only_used_slots = federation.train.engine != "sequential"
        self.last_round = 0
        #: run phase 1 client by client (see the class docstring); its record while it is replayed
        self.client_major = hparams.client_major and federation.train.participation >= 1.0
        self.phase_one: GeneratorPhase | None = None
        if hparams.generator_rounds == 0:
            self.mend_all()

    @classmethod
    def check_protocol(cls, hparams: FedSagePlusHparams, setup: RunSetup) -> None:
        if hparams.generator_rounds >= setup.train.rounds:
            raise ConfigError(
                f"fedsage_plus generator_rounds={hparams.generator_rounds} leaves no classifier "
                f"round of train.rounds={setup.train.rounds}; choose fewer generator rounds"
            )

    def in_generator_phase(self, round_: int) -> bool:
        return round_ <= self.hparams.generator_rounds

    def client_updates(self, ks: list[int], round_: int) -> dict[int, Upload]:
        if not (self.client_major and self.in_generator_phase(round_)):
            return super().client_updates(ks, round_)
        if self.phase_one is None:
            self.phase_one = self.generator_phase()
        return self.phase_one.uploads[round_ - 1]

    def client_update(self, k: int, round_: int) -> Upload:
        if self.in_generator_phase(round_):
            return self.generator_update(k)
        upload = super().client_update(k, round_)
        upload.weight = float(self.node_counts[k])
        return upload

    def generator_update(self, k: int) -> Upload:
        """One phase-1 round of client k in round-major order: local NeighGen steps
        (:meth:`local_round`), then the gradients of its cross-client loss for its peers."""
        gen = self.federation.generator
        with seeded_rng(draw_seed(gen), self.device):
            extras, loss = self.local_round(k)
        peer = {}
        for j, (peer_feat, peer_count, peer_true) in self.peer_features[k].items():
            ids = self.samplers[k].draw(peer_feat.size(0), self.hparams.num_pred, gen)
            if ids is not None:
                peer[j] = {"grad": self.cross_client_gradient(k, ids, peer_feat, peer_count, peer_true)}
        return Upload(params={}, extras=extras, peer=peer, weight=float(self.node_counts[k]), loss=loss)

    def local_round(self, k: int) -> tuple[dict[str, Tensor], float]:
        """Client k's local NeighGen steps of one round, on the current RNG: returns its upload's
        :data:`PEER_PAYLOAD` (generated features ``[n_train, P, F]`` of its training nodes, their
        predicted and true counts) and the last step's loss."""
        hp, graph = self.hparams, self.impaired[k]
        model, classifier, optimizer = self.neighgens[k], self.aux_classifiers[k], self.gen_optimizers[k]
        mask, train, region = graph.train_mask, self.train_nodes[k], self.regions[k]
        in_train = torch.searchsorted(region, train)
        loss_value = float("nan")
        model.train()
        classifier.train()
        for _ in range(self.federation.train.local_epochs):
            optimizer.zero_grad(set_to_none=True)
            z, count = model.encode(graph.x, graph.adj)
            region_feat = model.generate(z[region], self.step_slots(k, count[region].detach(), in_train),
                                         optimizer if optimizer.can_step_tiles else None)
            x, edges = mend_graph(graph.x, graph.edge_index, count.detach(), region_feat, region)
            logits = classifier(x, normalized_adjacency(edges, x.size(0)))[: graph.x.size(0)]
            train_feat = region_feat[in_train]
            loss = (
                hp.count_weight * F.smooth_l1_loss(count[mask], graph.missing_count[mask].float())
                + hp.feature_weight * greedy_feature_loss(
                    train_feat, graph.train_missing_feat, count[mask], graph.missing_count[mask])
                + hp.class_weight * F.cross_entropy(logits[mask], graph.y[mask])
            )
            if self.peer_grads[k] is not None:
                loss = loss + hp.feature_weight * (train_feat * self.peer_grads[k]).sum()
            loss = loss / len(self.clients)
            loss.backward()
            optimizer.step()
            loss_value = loss.item()
        optimizer.zero_grad(set_to_none=True)
        with torch.no_grad():
            count, train_feat = model(graph.x, graph.adj, train, only_used=self.only_used_slots)
        return dict(zip(PEER_PAYLOAD, (train_feat, count[mask].long(), graph.missing_count[mask]))), loss_value

    def generator_phase(self) -> GeneratorPhase:
        """Phase 1 client by client (see the class docstring): the round-major order's draws of
        the run's generator first, in that order; then every generator round of each client in
        turn, with the peer gradients it receives (the peers' samples of their own graphs, summed
        in client order) and its mending; the rounds' losses and bytes as the round-major rounds
        count them."""
        rounds, num_clients = self.hparams.generator_rounds, len(self.clients)
        seeds, ids, mend_seeds = self.round_major_draws()
        losses = [[float("nan")] * num_clients for _ in range(rounds)]
        sent, relayed, summed = ([[0] * num_clients for _ in range(rounds)] for _ in range(3))
        phase, ticker = GeneratorPhase(), Ticker("FedSage+ phase 1, clients done", num_clients)
        for k in range(num_clients):
            waiting: dict[int, tuple[Tensor, Tensor | None]] = {}  # round -> k's summed peer gradient, slots
            for t in range(1, rounds + 1):
                self.peer_grads[k], self.peer_slots[k] = waiting.pop(t, (None, None))
                with seeded_rng(seeds[t - 1][k], self.device):
                    extras, losses[t - 1][k] = self.local_round(k)
                relayed[t - 1][k] = tensor_bytes(extras.values())
                sent[t - 1][k] += relayed[t - 1][k]
                if t == rounds:
                    break
                grads = []
                for j in range(num_clients):
                    if j != k and ids[t + 1, j, k] is not None:
                        grads.append(self.cross_client_gradient(j, ids[t + 1, j, k], *extras.values()))
                        sent[t][j] += tensor_bytes(grads[-1:])
                if grads:
                    total = summed_gradients(grads)
                    summed[t][k] = tensor_bytes([total])
                    waiting[t + 2] = (total, total.ne(0).any(-1) if self.only_used_slots else None)
            self.peer_grads[k], self.peer_slots[k] = waiting.pop(rounds + 1, (None, None))
            phase.mended.append(self.mend(k, mend_seeds[k]))
            ticker.tick()
        for t in range(rounds):
            phase.uploads.append({k: SentUpload(params={}, weight=float(self.node_counts[k]), loss=losses[t][k],
                                                sent=sent[t][k]) for k in range(num_clients)})
            phase.download_bytes.append([sum(relayed[t]) - relayed[t][k] + summed[t][k] for k in range(num_clients)])
        return phase

    def step_slots(self, k: int, region_count: Tensor, in_train: Tensor) -> Tensor | None:
        """``[r, P]`` (row, slot) pairs of client k's region whose generated features a local
        step reads: slots below the predicted count ``region_count [r]`` (mended graph,
        greedy loss) and, for training rows (positions ``in_train``), slots where the peer
        gradient is non-zero; None (all pairs) on the sequential reference path."""
        if not self.only_used_slots:
            return None
        used = used_slots(region_count, self.hparams.num_pred)
        if self.peer_slots[k] is not None:
            used[in_train] |= self.peer_slots[k]
        return used

    def round_major_draws(self) -> tuple[list[list[int]], dict[tuple[int, int, int], Tensor | None], list[int]]:
        """What the run's generator gives phase 1 in round-major order, drawn in that order: the seed
        of each client round (``seeds[t - 1][k]``), client j's neighbour draw for client k's uploaded
        features in round t (``ids[t, j, k]`` ``[n_train_k, P]``, from round 2; None when j's graph has
        no edge) and each client's mending seed."""
        gen, num_clients = self.federation.generator, len(self.clients)
        sizes = [t.numel() for t in self.train_nodes]
        seeds, ids = [], {}
        for t in range(1, self.hparams.generator_rounds + 1):
            seeds.append([])
            for j in range(num_clients):
                seeds[-1].append(draw_seed(gen))
                for k in (range(num_clients) if t > 1 else ()):
                    if k != j:
                        ids[t, j, k] = self.samplers[j].draw(sizes[k], self.hparams.num_pred, gen)
        return seeds, ids, [draw_seed(gen) for _ in range(num_clients)]

    def cross_client_gradient(self, k: int, ids: Tensor, feat: Tensor, pred_count: Tensor,
                              true_count: Tensor) -> Tensor:
        """Gradient ``[n_j, P, F]`` of a peer's cross-client loss on client k's graph with
        respect to the peer's generated features ``feat``, against the neighbours ``ids
        [n_j, P]`` drawn from k's graph (:meth:`NeighborSampler.draw`), sparse (:func:`sparse_slots`)."""
        targets = self.samplers[k].features(ids)
        feat = feat.detach().requires_grad_(True)
        (grad,) = torch.autograd.grad(greedy_feature_loss(feat, targets, pred_count, true_count), feat)
        return sparse_slots(grad)

    def server_update(self, round_: int, uploads: dict[int, Upload]) -> None:
        self.last_round = round_
        if not self.in_generator_phase(round_):
            super().server_update(round_, uploads)
            return
        if self.phase_one is not None:
            self.received_bytes = self.phase_one.download_bytes[round_ - 1]
            if round_ == self.hparams.generator_rounds:
                self.clients[:] = self.phase_one.mended
                self.phase_one = None
                self.drop_generator_state()
            return
        for k in uploads:
            self.peer_features[k] = {
                j: tuple(u.extras[name] for name in PEER_PAYLOAD)
                for j, u in uploads.items() if j != k
            }
            grads = [u.peer[k]["grad"] for u in uploads.values() if k in u.peer]
            self.peer_grads[k] = summed_gradients(grads) if grads else None
            self.peer_slots[k] = self.peer_grads[k].ne(0).any(-1) if self.only_used_slots and grads else None
            relayed = [u.extras[name] for j, u in uploads.items() if j != k for name in PEER_PAYLOAD]
            summed = [self.peer_grads[k]] if grads else []
            self.received_bytes[k] = tensor_bytes(relayed + summed)
        if round_ == self.hparams.generator_rounds:
            self.mend_all()

    def server_models(self) -> list[nn.Module]:
        """No classifier is sent to clients while NeighGen trains (phase 1)."""
        return [] if self.in_generator_phase(self.last_round) else [self.global_model]

    def download_bytes(self, k: int) -> int:
        if self.in_generator_phase(self.last_round):
            return self.received_bytes[k]
        return super().download_bytes(k)

    def mend_all(self) -> None:
        """Replace every client's graph by its NeighGen-mended version (:meth:`mend`; in place in
        ``self.clients``, the list the round loop evaluates on, one client after the other so that
        the mended graphs do not add to all the NeighGens at once), then drop what only phase 1 uses."""
        for k in range(len(self.clients)):
            self.clients[k] = self.mend(k, draw_seed(self.federation.generator))
        self.drop_generator_state()

    @torch.no_grad()
    def mend(self, k: int, seed: int) -> ClientData:
        """Client k's graph with the neighbours its NeighGen (eval mode, on the RNG seeded with
        ``seed``) generates attached (:func:`mended_client`); its NeighGen, optimiser state and
        auxiliary classifier are dropped."""
        client, model = self.clients[k], self.neighgens[k]
        model.eval()
        with seeded_rng(seed, self.device):
            count, feat = model(client.x, client.adj, only_used=self.only_used_slots)
        self.neighgens[k] = self.gen_optimizers[k] = self.aux_classifiers[k] = None
        return mended_client(client, count.long(), feat)

    def drop_generator_state(self) -> None:
        """Drop what only phase 1 uses: the NeighGens, auxiliary classifiers and optimisers (most
        of a run's memory and checkpoint size), the relayed peer features and the neighbour samplers."""
        self.neighgens, self.aux_classifiers, self.gen_optimizers, self.samplers = [], [], [], []
        self.peer_features = [{} for _ in self.clients]


def sparse_slots(grad: Tensor) -> Tensor:
    """``grad [n, P, F]`` as a sparse tensor of the same shape holding its (node, slot) pairs
    with a non-zero entry, values ``[nnz, F]``: a peer's cross-client loss reads only the
    slots below the predicted counts, so most pairs are zero (dense, a round's K (K - 1) peer
    gradients held about 4.5 GB on CS with 10 clients)."""
    keep = grad.ne(0).any(dim=-1)
    return torch.sparse_coo_tensor(keep.nonzero().t(), grad[keep], grad.shape).coalesce()


def summed_gradients(grads: list[Tensor]) -> Tensor:
    """``[n, P, F]``: the sum of the sparse ``grads`` (:func:`sparse_slots`), dense, as
    ``torch.stack`` of their dense forms summed over the first dimension (the same float order)."""
    dense = torch.zeros(len(grads), *grads[0].shape, dtype=grads[0].dtype, device=grads[0].device)
    for out, grad in zip(dense, grads):
        nodes, slots = grad.indices()
        out[nodes, slots] = grad.values()
    return dense.sum(0)


def _within_hops(edge_index: Tensor, seeds: Tensor, hops: int) -> Tensor:
    """Ascending ids of the nodes within ``hops`` hops of the ``seeds`` mask ``[n]``."""
    reached = seeds.clone()
    for _ in range(hops):
        reached[edge_index[1, reached[edge_index[0]]]] = True
    return reached.nonzero().flatten()


def _hidden_width(model: torch.nn.Module) -> int:
    """Hidden width of the study's GCN (NeighGen's encoder uses the same)."""
    return model.convs[0].out_channels


def _dropout(model: torch.nn.Module) -> float:
    return float(getattr(model, "dropout", 0.5))
