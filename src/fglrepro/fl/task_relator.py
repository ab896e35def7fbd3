"""FedGKD's server-side task relator (Pan et al., NeurIPS 2023 GLFrontiers, section 5.3):
feature-wise Pearson relatedness of the clients' task features (eq. 10), a kernel over the
collaboration network (eq. 11) and the personalised aggregation weights ``q`` (eq. 8-9)."""

from __future__ import annotations

import torch
from torch import Tensor

from fglrepro.config import ConfigError

#: S of eq. 11: ``global`` = matrix exponential of tau R, ``local`` = R (softmax kernel),
#: ``square`` = R^2 (two hops), as Figure 5 compares them.
KERNELS = ("global", "local", "square")


def pearson_relatedness(features: Tensor) -> Tensor:
    r"""Eq. 10: ``r_ij = (1/F) sum_k corr(M_i[:, k], M_j[:, k])`` for task features
    ``features [n, r, F]`` (n clients, r aligned rows, F columns), in float64.

    The Pearson correlation of a pair in which a column is constant is defined as 0 (it is
    0/0); the diagonal is set to 1 (a task is fully related to itself). Returns ``R [n, n]``,
    symmetric with entries in [-1, 1].
    """
    m = features.double()
    centred = m - m.mean(dim=1, keepdim=True)
    norms = centred.pow(2).sum(dim=1, keepdim=True).sqrt()
    unit = torch.where(norms > 0, centred / norms.clamp(min=torch.finfo(m.dtype).tiny), torch.zeros_like(centred))
    relatedness = torch.einsum("irk,jrk->ij", unit, unit) / m.size(2)
    relatedness = (relatedness + relatedness.T) / 2
    return relatedness.fill_diagonal_(1.0)


def kernel_matrix(relatedness: Tensor, kernel: str, tau: float, series_start: int) -> Tensor:
    r"""``S`` of eq. 11 for ``R [n, n]``.

    ``global``: :math:`\sum_{\kappa \ge s} (\tau R)^\kappa / \kappa!` with ``s = series_start``:
    0 is the matrix exponential :math:`e^{\tau R}` (Proposition G.1's kernel), 1 the series as
    eq. 11 prints it, :math:`e^{\tau R} - I` (the form for which tau -> 0 gives FedAvg).
    ``local``: ``R``. ``square``: ``R @ R``.
    """
    if kernel == "global":
        s = torch.linalg.matrix_exp(tau * relatedness)
        if series_start == 1:
            s = s - torch.eye(s.size(0), dtype=s.dtype, device=s.device)
        elif series_start != 0:
            raise ConfigError(f"hparams.series_start = {series_start!r} is not valid; choose one of [0, 1]")
        return s
    if kernel == "local":
        return relatedness
    if kernel == "square":
        return relatedness @ relatedness
    raise ConfigError(f"hparams.kernel = {kernel!r} is not valid; choose one of {list(KERNELS)}")


def aggregation_weights(kernel: Tensor, tau_s: float) -> Tensor:
    """Eq. 9: ``q_i[j] = exp(tau_s s_ij) / sum_j' exp(tau_s s_ij')`` (a row-wise softmax);
    ``[n, n]`` row-stochastic with positive entries."""
    return torch.softmax(tau_s * kernel, dim=1)


def relator_weights(features: Tensor, kernel: str, tau: float, tau_s: float, series_start: int) -> Tensor:
    """``q [n, n]`` of n clients' task features ``[n, r, F]``: eq. 10, 11 and 9 in turn."""
    return aggregation_weights(kernel_matrix(pearson_relatedness(features), kernel, tau, series_start), tau_s)
