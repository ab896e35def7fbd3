"""Control-variate bookkeeping shared by SCAFFOLD and FedDC.

Each client k keeps a variate ``c_k`` and the server a variate ``c`` (dicts parameter
name -> tensor shaped like the parameter). During local training the client's gradient
is corrected by ``c - c_k``; :func:`linear_correction` expresses that as a loss term,
so the correction passes through whatever optimiser the study uses (Adam included),
exactly as a gradient added before the optimiser step would.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from fglrepro.config import ConfigError


def zeros_like_parameters(model: nn.Module) -> dict[str, Tensor]:
    """A zero tensor for every trainable parameter of ``model``."""
    return {name: p.detach().new_zeros(p.shape) for name, p in model.named_parameters()}


def linear_correction(model: nn.Module, direction: dict[str, Tensor]) -> Tensor:
    """``sum_p <p - sg(p), direction_p>`` (``sg``: stop-gradient): a scalar whose value is
    0, so the reported loss stays the task loss, and whose gradient w.r.t. each parameter
    ``p`` is ``direction_p`` (parameters not named in ``direction`` are left out)."""
    total = next(model.parameters()).new_zeros(())
    for name, p in model.named_parameters():
        if name in direction:
            total = total + ((p - p.detach()) * direction[name]).sum()
    return total


class _LinearCorrection(torch.autograd.Function):
    """Value ``[m]`` zeros; the gradient of row i of every parameter stack is row i of its
    direction (times the incoming gradient of client i's term)."""

    @staticmethod
    def forward(ctx, directions: tuple[Tensor, ...], *params: Tensor) -> Tensor:
        ctx.directions = directions
        return params[0].new_zeros(params[0].size(0))

    @staticmethod
    def backward(ctx, grad: Tensor):
        return (None, *(d * grad.view(-1, *([1] * (d.dim() - 1))) for d in ctx.directions))


def stacked_linear_correction(params: list[Tensor], directions: list[Tensor]) -> Tensor:
    """``[m]``: :func:`linear_correction` of each of m client-stacked models (value 0, the
    gradient of row i is row i of ``directions``), without forward arithmetic."""
    return _LinearCorrection.apply(tuple(directions), *params)


def check_local_steps(method: str, local_epochs: int) -> None:
    """Option II divides by the number of local steps: refuse ``local_epochs < 1``."""
    if local_epochs < 1:
        raise ConfigError(f"{method} needs train.local_epochs >= 1 (got {local_epochs})")


class ControlVariates:
    """Server variate ``c`` and client variates ``c_k``, all starting at zero.

    Args:
        model: the shared architecture (gives parameter names and shapes).
        num_clients: K.
    """

    def __init__(self, model: nn.Module, num_clients: int) -> None:
        self.server = zeros_like_parameters(model)
        self.clients = [zeros_like_parameters(model) for _ in range(num_clients)]

    def correction(self, k: int) -> dict[str, Tensor]:
        """``c - c_k``: the direction added to client ``k``'s local gradient."""
        return {n: self.server[n] - c_k for n, c_k in self.clients[k].items()}

    def update_client(
        self, k: int, start: dict[str, Tensor], end: dict[str, Tensor], steps: int, lr: float,
    ) -> dict[str, Tensor]:
        """SCAFFOLD option II: ``c_k <- c_k - c + (start - end) / (steps * lr)``, with
        ``start`` the received model and ``end`` the locally trained one.

        Returns the increment ``Δc_k`` (new minus old ``c_k``) that the client uploads.
        """
        scale = 1.0 / (steps * lr)
        delta = {}
        for n, c_k in self.clients[k].items():
            new = c_k - self.server[n] + (start[n] - end[n]) * scale
            delta[n] = new - c_k
            self.clients[k][n] = new
        return delta

    def update_server(self, deltas: dict[int, dict[str, Tensor]], shares: dict[int, float]) -> None:
        """``c <- c + sum_k shares[k] * Δc_k`` over the uploading clients ``k``
        (SCAFFOLD: ``shares[k] = 1 / K``; FedDC's code: ``n_k / N``)."""
        for n in self.server:
            self.server[n] = self.server[n] + sum(shares[k] * d[n] for k, d in deltas.items())
