"""FIARSE (Wu et al., NeurIPS 2024, "Model-Heterogeneous Federated Learning via
Importance-Aware Submodel Extraction"; code: HarliWu/FIARSE ``fiarse/``).

The server keeps one global model. A client of capacity ``s_k`` (a fraction of its
parameters) trains the submodel of the ``floor(s_k P)`` parameters of largest magnitude
(importance = ``|theta|``, ranked over the whole model): with ``tau_k`` the magnitude of the
last kept one, it computes with ``theta * m(|theta|)``, ``m(a) = 1[a >= tau_k]`` (recomputed
every step, so a parameter that shrinks below ``tau_k`` leaves the submodel), and the
gradient passes the mask by the code's surrogate ``dm/da = 2 tau / (a + tau)^2`` on kept
entries ("threshold-controlled biased gradient descent"). The client uploads its update on
the entries of its submodel; the server adds to each entry the average update of the
clients whose submodel holds it.

In FedGKC's model-scale setting (Table 2: SGC-2, GCN-2/4/6/8) the global model is the
largest client architecture and client k's capacity is its own architecture's parameter
count over the global model's (or ``sizes``), so every client trains an importance-aware
submodel of the deepest GCN with the parameter budget of its assigned architecture. Clients
are tested on their trained submodel (``evaluation.model: local``) or on the submodel of the
updated global model (``global``, FIARSE's own evaluation).

With ``train.engine: auto`` the clients train on the grouped path (:mod:`fglrepro.fl.grouped`:
all copies of the global model as one stacked model, each client's rows masked at its own
threshold, one step for all). The server ranks the global model's magnitudes once per round for
all capacities and handles every model as one flat vector of its ``P`` entries (parameter order).
Cost: every client computes with the whole global model (FedGKC Table 2: an 8-layer GCN), so a run
costs about what FedAvg on that model costs (0.86x on Cora-10), 3.6x FedAvg on a 2-layer GCN
(benchmarks/METHOD_COSTS.md).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import Tensor, nn
from torch.func import functional_call

from fglrepro.config import ConfigError
from fglrepro.fl.aggregation import load_parameters
from fglrepro.fl.engine import ClientBatch
from fglrepro.fl.grouped import GroupedRole, GroupedUpdates, PerClient
from fglrepro.fl.method import FederatedMethod, Federation, RunSetup, Upload
from fglrepro.methods import register

#: Architectures a submodel budget can stand for: FedGKC Table 2's model scales.
SCALE_ARCHS = ("gcn", "sgc")


@dataclass(frozen=True)
class FIARSEHparams:
    """sizes: capacities ``s`` (fractions of the global model's parameters in (0, 1]); client
        k takes ``sizes[k % len]`` (the FIARSE paper: e.g. [1, 1/4, 1/16, 1/64]). Empty:
        each client's architecture's parameter count over the largest one's.
    server_lr: global learning rate of the averaged update (code ``--lr-global`` 1.0).
    sample_weighted: average each entry's updates with weights n_k (False: the plain mean of
        the code).
    """

    sizes: list = field(default_factory=list)
    server_lr: float = 1.0
    sample_weighted: bool = True

    def __post_init__(self) -> None:
        bad = [s for s in self.sizes if isinstance(s, bool) or not isinstance(s, (int, float)) or not 0 < s <= 1]
        if bad:
            raise ConfigError(f"hparams.sizes must hold numbers in (0, 1], got {bad}")


class _ImportanceMask(torch.autograd.Function):
    """``1[a >= tau]`` of magnitudes ``a``; backward: ``2 tau / (a + tau)^2`` on kept entries."""

    @staticmethod
    def forward(ctx, magnitude: Tensor, threshold: Tensor) -> Tensor:
        kept = magnitude >= threshold
        ctx.save_for_backward(magnitude, threshold, kept)
        return kept.to(magnitude.dtype)

    @staticmethod
    def backward(ctx, grad: Tensor):
        magnitude, threshold, kept = ctx.saved_tensors
        slope = torch.nan_to_num(2 * threshold / (magnitude + threshold).pow(2), nan=0.0, posinf=0.0, neginf=0.0)
        return grad * slope * kept, None


def _flat(params: list[Tensor]) -> Tensor:
    """``[P]``: the entries of ``params`` one after another (a detached copy)."""
    return torch.cat([p.detach().flatten() for p in params])


def importance_thresholds(params: list[Tensor], sizes: list[float]) -> Tensor:
    """``[len(sizes)]``: for each ``size`` the ``max(1, floor(size * P))``-th largest magnitude
    of all ``params`` (P entries), from one partial sort for all sizes."""
    magnitude = _flat(params).abs()
    total = magnitude.numel()
    ranks = [total - max(1, int(total * size)) for size in sizes]  # positions in ascending order
    ordered = np.partition(magnitude.cpu().numpy(), sorted(set(ranks)))
    return torch.from_numpy(ordered[ranks]).to(magnitude.device)


def importance_threshold(params: list[Tensor], size: float) -> Tensor:
    """``tau``: the ``max(1, floor(size * P))``-th largest magnitude of all ``params`` (P entries)."""
    return importance_thresholds(params, [size])[0]


def _kept(magnitude: Tensor, threshold: Tensor) -> Tensor:
    """``1[a >= tau]`` as floats (written as floats directly: several times faster on CPU than a
    boolean mask and its conversion)."""
    return torch.ge(magnitude, threshold, out=torch.empty_like(magnitude))


@dataclass
class _Extraction:
    """The submodel of the global model at one threshold: ``held [P]`` its entries (bool),
    ``positions [S]`` their flat indices, ``counts`` its entries per parameter."""

    threshold: Tensor
    held: Tensor
    positions: Tensor
    counts: list[int]


class MaskedSubmodel(nn.Module):
    """``model`` computed with ``theta * m(|theta|)`` for every parameter, ``m`` the
    importance mask at ``threshold``; parameters are those of ``model`` (``model.*``)."""

    def __init__(self, model: nn.Module, threshold: Tensor) -> None:
        super().__init__()
        self.model = model
        self.threshold = threshold

    def forward(self, x: Tensor, adj: Tensor, return_hidden: bool = False):
        if torch.is_grad_enabled():
            params = {name: p * _ImportanceMask.apply(p.abs(), self.threshold)
                      for name, p in self.model.named_parameters()}
        else:  # the same values without the autograd function (evaluation)
            params = {name: p * _kept(p.abs(), self.threshold) for name, p in self.model.named_parameters()}
        kwargs = {"return_hidden": True} if return_hidden else {}
        return functional_call(self.model, params, (x, adj), kwargs)


def parameter_count(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


@register("fiarse")
class FIARSE(GroupedUpdates, FederatedMethod):
    """One global model; client k trains its importance-aware submodel of capacity ``s_k``."""

    label = "FIARSE"
    Hparams = FIARSEHparams
    heterogeneous_models = True

    def __init__(self, federation: Federation, hparams: FIARSEHparams) -> None:
        super().__init__(federation, hparams)
        candidates = federation.client_models or [federation.model]
        self.global_model = copy.deepcopy(max(candidates, key=parameter_count))
        total = parameter_count(self.global_model)
        num_clients = len(self.clients)
        self.sizes = ([hparams.sizes[k % len(hparams.sizes)] for k in range(num_clients)] if hparams.sizes
                      else [parameter_count(federation.client_model(k)) / total for k in range(num_clients)])
        for state in self.states:
            state.model = MaskedSubmodel(copy.deepcopy(self.global_model), torch.zeros(()))
            state.received = MaskedSubmodel(self.global_model, torch.zeros(()))
        #: the global model's parameters (named) and their entry counts, in parameter order
        self.params = dict(self.global_model.named_parameters())
        self.numels = [p.numel() for p in self.params.values()]
        #: per client: the submodel masks the server extracted this round ``{name: bool}``
        self.masks: dict[int, dict[str, Tensor]] = {}
        #: per client: the submodel it trains this round
        self.extractions: dict[int, _Extraction] = {}
        #: per client: its submodel of the current global model (what it receives next)
        self.received_extractions: list[_Extraction] = []
        #: the global model's entries ``[P]`` the clients started local training from
        self.start = torch.empty(0)
        self.refresh_received()

    @classmethod
    def check_protocol(cls, hparams, setup: RunSetup) -> None:
        archs = sorted({c.arch for c in setup.model.variants()} - set(SCALE_ARCHS))
        if archs:
            raise ConfigError(f"method 'fiarse' extracts submodels of one model of varying scale (FedGKC Table 2: "
                              f"{list(SCALE_ARCHS)}); model.clients has architectures {archs}")

    def extract(self, threshold: Tensor, magnitude: Tensor) -> _Extraction:
        """The submodel of the global model whose flat entries have ``magnitude [P]``."""
        held = magnitude >= threshold
        positions = np.flatnonzero(held.cpu().numpy())  # several times faster than torch.nonzero on CPU
        counts = np.diff(np.searchsorted(positions, np.cumsum(self.numels)), prepend=0).tolist()
        return _Extraction(threshold, held, torch.from_numpy(positions).to(held.device), counts)

    def refresh_received(self) -> None:
        """Every client's submodel of the current global model (what it receives): one ranking
        of the magnitudes for all capacities, one extraction per distinct threshold."""
        self.start = _flat(list(self.params.values()))
        magnitude = self.start.abs()
        thresholds = importance_thresholds(list(self.params.values()), self.sizes)
        by_size: dict[float, _Extraction] = {}
        self.received_extractions = []
        for k, state in enumerate(self.states):
            size = self.sizes[k]
            if size not in by_size:
                by_size[size] = self.extract(thresholds[k], magnitude)
            state.received.threshold = by_size[size].threshold
            self.received_extractions.append(by_size[size])

    def receive(self, k: int, round_: int) -> None:
        """Load the global model into the client's submodel and fix its threshold."""
        submodel = self.states[k].model
        load_parameters(submodel.model, self.params)
        extraction = self.extractions[k] = self.received_extractions[k]
        submodel.threshold = extraction.threshold
        self.masks[k] = {name: m.view_as(p) for (name, p), m in zip(self.params.items(),
                                                                     extraction.held.split(self.numels))}

    def grouped_roles(self) -> dict[str, list[nn.Module]]:
        """The submodels' parameters (each client's copy of the global model)."""
        return {"model": [s.model.model for s in self.states]}

    def masked(self, ks: list[int], stacks: list[Tensor]) -> list[Tensor]:
        """:class:`MaskedSubmodel`'s ``theta * m(|theta|)`` of client-stacked parameters
        (``[m, ...]`` each, the rows of clients ``ks``), each row at its client's threshold."""
        threshold = torch.stack([self.states[k].model.threshold for k in ks])
        return [p * _ImportanceMask.apply(p.abs(), threshold.view(-1, *[1] * (p.dim() - 1))) for p in stacks]

    def grouped_loss(self, union: ClientBatch, roles: dict[str, GroupedRole], round_: int) -> Tensor:
        """Each participant's cross-entropy of its submodel on its training nodes, ``[m]``."""
        mask = union.train_mask
        logits = roles["model"].forward(weights=self.masked)[1][mask]
        return PerClient(union.batch[mask], union.num_clients).cross_entropy(logits, union.y[mask])

    def upload(self, k: int, round_: int, loss: float) -> Upload:
        """The update ``theta_local - theta_start`` on the submodel's entries (values only)."""
        extraction = self.extractions[k]
        trained = _flat(list(self.states[k].model.model.parameters()))
        update = (trained - self.start).index_select(0, extraction.positions)
        return Upload(params=dict(zip(self.params, update.split(extraction.counts))),
                      weight=float(self.clients[k].num_nodes), loss=loss)

    def server_update(self, round_: int, uploads: dict[int, Upload]) -> None:
        """``theta += server_lr * sum_k w_k M_k delta_k / sum_k w_k M_k`` entry by entry
        (``M_k`` client k's submodel mask; entries no client holds stay)."""
        with torch.no_grad():
            theta = _flat(list(self.params.values()))
            total, weight = torch.zeros_like(theta), torch.zeros_like(theta)
            for k, upload in uploads.items():
                positions = self.extractions[k].positions
                w = upload.weight if self.hparams.sample_weighted else 1.0
                total.index_add_(0, positions, w * torch.cat([upload.params[name] for name in self.params]))
                weight.index_add_(0, positions, torch.full_like(positions, w, dtype=weight.dtype))
            theta = torch.where(weight > 0, theta + self.hparams.server_lr * total / weight, theta)
            for p, value in zip(self.params.values(), theta.split(self.numels)):
                p.copy_(value.view_as(p))
        self.refresh_received()

    def download_bytes(self, k: int) -> int:
        """Bytes of the entries of client ``k``'s submodel."""
        counts = self.received_extractions[k].counts
        return sum(count * p.element_size() for count, p in zip(counts, self.params.values()))
