"""FedKD (Wu et al., Nature Communications 2022, "Communication-efficient federated learning
via knowledge distillation") on heterogeneous client models.

Each client trains its private mentor (any architecture, tested) and a copy of the shared
mentee; they distil into each other with losses scaled by the inverse of the summed task
losses, and a linear map ``W_h`` aligns the mentee's hidden embedding with the mentor's. Only
the mentee travels, compressed: every weight matrix is sent as its truncated SVD keeping the
fraction ``energy`` of its squared singular values, ``energy`` growing linearly from
``energy_start`` to ``energy_end`` over the rounds (HtFLlib ``clientkd`` / ``serverkd``;
FedPPN's graph version ``FedKD_node_trainer``). On the training nodes, with
``s = CE_mentor + CE_mentee``:

    L_mentor = CE_mentor + KL(p_mentee || p_mentor) / s + MSE(h_mentor, W_h h_mentee) / s,
    L_mentee = CE_mentee + KL(p_mentor || p_mentee) / s + MSE(h_mentor, W_h h_mentee) / s,

KL teachers detached, ``s`` not (as in both codes); the client descends ``L_mentor + L_mentee``
(the codes' two backward passes accumulate the same gradients).

With ``train.engine: auto`` the clients train on the grouped path (:mod:`fglrepro.fl.grouped`:
the mentors of one architecture, all mentees and all hidden maps each as one stacked model,
one step for all); :func:`distillation_loss` is the loss of both paths.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from fglrepro.config import ConfigError
from fglrepro.fl.aggregation import load_parameters, parameters_of, weighted_average
from fglrepro.fl.clients import ClientData
from fglrepro.fl.communication import tensor_bytes
from fglrepro.fl.engine import ClientBatch
from fglrepro.fl.grouped import WHOLE_GRAPH, GroupedRole, GroupedUpdates, PerClient, WholeGraph
from fglrepro.fl.method import FederatedMethod, Federation, Objective, Upload
from fglrepro.methods import register

#: Suffixes of the three factors of a compressed matrix ``U diag(s) V^T``.
FACTORS = (".svd_u", ".svd_s", ".svd_vh")


@dataclass(frozen=True)
class FedKDHparams:
    """energy_start, energy_end: share of the squared singular values a compressed matrix
        keeps in the first and the last round, linear in between (HtFLlib ``T_start`` 0.95,
        ``T_end`` 0.98; FedKD's code uses the same schedule).
    compress: send the mentee as truncated SVDs both ways (False: full parameters, as
        FedPPN's graph configs run it with ``use_SVD: False``).

    The mentee is the study's ``model`` block (FedPPN's graph configs: a 2-layer GCN with a
    64-wide head input), initialised once and shared by all clients; ``W_h`` maps its
    hidden embedding to the mentor's width (no bias).
    """

    energy_start: float = 0.95
    energy_end: float = 0.98
    compress: bool = True

    def __post_init__(self) -> None:
        for key in ("energy_start", "energy_end"):
            if not 0.0 < getattr(self, key) <= 1.0:
                raise ConfigError(f"hparams.{key} must be in (0, 1], got {getattr(self, key)}")


def svd_rank(singular: Tensor, energy: float) -> int:
    """Smallest ``r`` whose leading singular values ``singular [m]`` (descending) hold at
    least ``energy`` of ``sum s_i^2``."""
    share = singular.pow(2).cumsum(0) / singular.pow(2).sum()
    return min(int((share < energy).sum()) + 1, singular.numel())


def thin_svd(p: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """``torch.linalg.svd(p, full_matrices=False)`` of a matrix ``p [m, n]``: ``U [m, k]``, ``s [k]``,
    ``V^T [k, n]``, ``k = min(m, n)``. A wide matrix (a linear layer's ``[out, in]`` weight on
    bag-of-words input) is factored as its transpose, ``p^T = U' S V'^T`` -> ``U = V'``, ``V^T = U'^T``:
    LAPACK's path for tall matrices is about 4.5x faster on ``[64, 3703]`` (11.4 -> 2.5 ms, one
    thread); the factors agree with the direct ones up to float rounding and column signs."""
    if p.size(0) >= p.size(1):
        return torch.linalg.svd(p, full_matrices=False)
    u, s, vh = torch.linalg.svd(p.T, full_matrices=False)
    return vh.T, s, u.T


def compress(params: dict[str, Tensor], energy: float) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
    """Split ``params`` into tensors sent as they are and truncated SVD factors.

    A matrix ``[m, n]`` (both sides > 1, not all zero) of rank budget ``r`` =
    :func:`svd_rank` is sent as ``U [m, r]``, ``s [r]``, ``V^T [r, n]`` (names ``name`` +
    :data:`FACTORS`) when ``r (m + n + 1) < m n``; everything else is sent in full.
    Returns ``(full, factors)``.
    """
    full, factors = {}, {}
    for name, p in params.items():
        if p.dim() == 2 and min(p.shape) > 1 and bool(p.any()):
            u, s, vh = thin_svd(p)
            r = svd_rank(s, energy)
            if r * (sum(p.shape) + 1) < p.numel():
                factors.update(zip((name + f for f in FACTORS), (u[:, :r], s[:r], vh[:r])))
                continue
        full[name] = p
    return full, factors


def decompress(full: dict[str, Tensor], factors: dict[str, Tensor]) -> dict[str, Tensor]:
    """Inverse of :func:`compress`: ``full`` plus ``U diag(s) V^T`` of every factored matrix."""
    out = dict(full)
    for key in factors:
        if key.endswith(FACTORS[0]):
            name = key.removesuffix(FACTORS[0])
            u, s, vh = (factors[name + f] for f in FACTORS)
            out[name] = (u * s) @ vh
    return out


def distillation_loss(mentor: tuple[Tensor, Tensor], mentee: tuple[Tensor, Tensor], mapped: Tensor, labels: Tensor,
                      terms: WholeGraph | PerClient = WHOLE_GRAPH) -> Tensor:
    """``L_mentor + L_mentee`` from the mentor's and the mentee's ``(hidden, logits)`` on the
    training nodes, the mentee's hidden mapped by ``W_h`` (``mapped``) and the labels; a
    scalar, or per client ``[K]`` with ``terms`` :class:`~fglrepro.fl.grouped.PerClient`."""
    (h_mentor, z_mentor), (_, z_mentee) = mentor, mentee
    ce_mentor, ce_mentee = terms.cross_entropy(z_mentor, labels), terms.cross_entropy(z_mentee, labels)
    scale = ce_mentor + ce_mentee
    hidden = terms.mse(h_mentor, mapped) / scale
    mentor_loss = ce_mentor + terms.kl(z_mentee.detach(), z_mentor) / scale + hidden
    mentee_loss = ce_mentee + terms.kl(z_mentor.detach(), z_mentee) / scale + hidden
    return mentor_loss + mentee_loss


@register("fedkd")
class FedKD(GroupedUpdates, FederatedMethod):
    """Mentor ``states[k].model`` (tested), mentee ``modules["mentee"]`` and hidden map
    ``modules["hidden_map"]`` trained on :meth:`local_objective`; the server averages the
    decompressed mentees with weights n_k and sends the average back compressed."""

    label = "FedKD"
    Hparams = FedKDHparams
    has_global_model = False
    heterogeneous_models = True

    def __init__(self, federation: Federation, hparams: FedKDHparams) -> None:
        super().__init__(federation, hparams)
        self.global_mentee = copy.deepcopy(federation.model)
        mentee_width = hidden_width(self.global_mentee, self.clients[0])
        for k, state in enumerate(self.states):
            state.modules["mentee"] = copy.deepcopy(federation.model)
            state.modules["hidden_map"] = nn.Linear(mentee_width, hidden_width(state.model, self.clients[k]),
                                                    bias=False).to(self.clients[k].x.device)
        #: what clients receive after the server step: (sent in full, SVD factors)
        self.download: tuple[dict[str, Tensor], dict[str, Tensor]] | None = None

    def energy(self, round_: int) -> float:
        """The energy threshold of ``round_`` (1-based), linear from start to end."""
        start, end = self.hparams.energy_start, self.hparams.energy_end
        return start + (end - start) * (round_ - 1) / max(self.federation.train.rounds - 1, 1)

    def pack(self, params: dict[str, Tensor], round_: int) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
        """``params`` as sent in ``round_``: compressed, or in full without compression."""
        return compress(params, self.energy(round_)) if self.hparams.compress else (params, {})

    def receive(self, k: int, round_: int) -> None:
        if self.download is not None:
            load_parameters(self.states[k].modules["mentee"], decompress(*self.download))

    def local_objective(self, k: int, round_: int) -> Objective:
        state, client = self.states[k], self.clients[k]
        mentor, mentee, hidden_map = state.model, state.modules["mentee"], state.modules["hidden_map"]
        mask, labels = client.train_mask, client.y[client.train_mask]

        def loss() -> Tensor:
            outputs_mentor = tuple(t[mask] for t in mentor(client.x, client.adj, return_hidden=True))
            outputs_mentee = tuple(t[mask] for t in mentee(client.x, client.adj, return_hidden=True))
            return distillation_loss(outputs_mentor, outputs_mentee, hidden_map(outputs_mentee[0]), labels)

        return loss

    def grouped_roles(self) -> dict[str, list[nn.Module]]:
        return {"mentor": [s.model for s in self.states], "mentee": [s.modules["mentee"] for s in self.states],
                "hidden_map": [s.modules["hidden_map"] for s in self.states]}

    def grouped_loss(self, union: ClientBatch, roles: dict[str, GroupedRole], round_: int) -> Tensor:
        """:meth:`local_objective` of every participant, ``[m]``."""
        mask = union.train_mask
        mentee = roles["mentee"].forward()
        mapped = roles["hidden_map"].map(mentee[0])[mask]
        outputs_mentor = tuple(t[mask] for t in roles["mentor"].forward())
        return distillation_loss(outputs_mentor, tuple(t[mask] for t in mentee), mapped, union.y[mask],
                                 PerClient(union.batch[mask], union.num_clients))

    def upload(self, k: int, round_: int, loss: float) -> Upload:
        """The mentee: small tensors in ``params``, SVD factors of the matrices in ``extras``."""
        full, factors = self.pack(parameters_of(self.states[k].modules["mentee"]), round_)
        return Upload(params=full, extras=factors, weight=float(self.clients[k].num_nodes), loss=loss)

    def server_update(self, round_: int, uploads: dict[int, Upload]) -> None:
        ups = list(uploads.values())
        mentees = [decompress(u.params, u.extras) for u in ups]
        average = weighted_average(mentees, [u.weight for u in ups])
        load_parameters(self.global_mentee, average)
        self.download = self.pack(average, round_)

    def download_bytes(self, k: int) -> int:
        return tensor_bytes([*self.download[0].values(), *self.download[1].values()])


@torch.no_grad()
def hidden_width(model: nn.Module, client: ClientData) -> int:
    """Width of ``model``'s hidden embedding (``return_hidden``) on ``client``'s graph
    (one forward pass in evaluation mode)."""
    model.eval()
    return model(client.x, client.adj, return_hidden=True)[0].size(1)
