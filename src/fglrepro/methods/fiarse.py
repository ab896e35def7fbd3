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
threshold, one step for all).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field

import torch
from torch import Tensor, nn
from torch.func import functional_call

from fglrepro.config import ConfigError
from fglrepro.fl.aggregation import load_parameters, parameters_of
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


def importance_threshold(params: list[Tensor], size: float) -> Tensor:
    """``tau``: the ``max(1, floor(size * P))``-th largest magnitude of all ``params`` (P entries)."""
    magnitude = torch.cat([p.detach().abs().flatten() for p in params])
    keep = max(1, int(magnitude.numel() * size))
    return torch.topk(magnitude, keep).values[-1]


class MaskedSubmodel(nn.Module):
    """``model`` computed with ``theta * m(|theta|)`` for every parameter, ``m`` the
    importance mask at ``threshold``; parameters are those of ``model`` (``model.*``)."""

    def __init__(self, model: nn.Module, threshold: Tensor) -> None:
        super().__init__()
        self.model = model
        self.threshold = threshold

    def masks(self) -> dict[str, Tensor]:
        """``{name: 1[|theta| >= tau]}`` of ``model``'s parameters (no gradient)."""
        return {name: p.detach().abs() >= self.threshold for name, p in self.model.named_parameters()}

    def forward(self, x: Tensor, adj: Tensor, return_hidden: bool = False):
        params = {name: p * _ImportanceMask.apply(p.abs(), self.threshold) for name, p in self.model.named_parameters()}
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
        #: per client: the submodel masks the server extracted this round ``{name: bool}``
        self.masks: dict[int, dict[str, Tensor]] = {}
        #: per client: the parameters it started local training from
        self.starts: dict[int, dict[str, Tensor]] = {}
        self.refresh_received()

    @classmethod
    def check_protocol(cls, hparams, setup: RunSetup) -> None:
        archs = sorted({c.arch for c in setup.model.variants()} - set(SCALE_ARCHS))
        if archs:
            raise ConfigError(f"method 'fiarse' extracts submodels of one model of varying scale (FedGKC Table 2: "
                              f"{list(SCALE_ARCHS)}); model.clients has architectures {archs}")

    def threshold(self, k: int) -> Tensor:
        """``tau_k`` of client ``k`` on the current global model."""
        return importance_threshold(list(self.global_model.parameters()), self.sizes[k])

    def refresh_received(self) -> None:
        """Every client's submodel of the current global model (what it receives)."""
        for k, state in enumerate(self.states):
            state.received = MaskedSubmodel(self.global_model, self.threshold(k))

    def receive(self, k: int, round_: int) -> None:
        """Load the global model into the client's submodel and fix its threshold."""
        submodel = self.states[k].model
        load_parameters(submodel.model, dict(self.global_model.named_parameters()))
        submodel.threshold = self.states[k].received.threshold
        self.masks[k] = self.states[k].received.masks()
        self.starts[k] = parameters_of(submodel.model)

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
        start, masks = self.starts.pop(k), self.masks[k]
        trained = parameters_of(self.states[k].model.model)
        return Upload(params={name: (trained[name] - start[name])[masks[name]] for name in trained},
                      weight=float(self.clients[k].num_nodes), loss=loss)

    def server_update(self, round_: int, uploads: dict[int, Upload]) -> None:
        """``theta += server_lr * sum_k w_k M_k delta_k / sum_k w_k M_k`` entry by entry
        (``M_k`` client k's submodel mask; entries no client holds stay)."""
        with torch.no_grad():
            for name, p in self.global_model.named_parameters():
                total, weight = torch.zeros_like(p), torch.zeros_like(p)
                for k, upload in uploads.items():
                    held = self.masks[k][name]
                    w = upload.weight if self.hparams.sample_weighted else 1.0
                    total[held] += w * upload.params[name]
                    weight[held] += w
                covered = weight > 0
                p[covered] += self.hparams.server_lr * total[covered] / weight[covered]
        self.refresh_received()

    def download_bytes(self, k: int) -> int:
        """Bytes of the entries of client ``k``'s submodel."""
        submodel = self.states[k].received
        return sum(int(m.sum()) * p.element_size() for m, p in zip(submodel.masks().values(),
                                                                    self.global_model.parameters()))
