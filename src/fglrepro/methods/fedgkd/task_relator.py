"""FedGKD's server-side task relator (Pan et al., NeurIPS 2023 GLFrontiers, section 5.3):
feature-wise Pearson relatedness of the clients' task features (eq. 10), a kernel over the
collaboration network (eq. 11) and the personalised aggregation weights ``q`` (eq. 8-9).

Everything is computed in float64, and R and q are rounded to fixed grids (:func:`snap`,
:data:`RELATEDNESS_BITS`, :data:`WEIGHT_BITS`): the float64 reductions, matrix exponential and
softmax differ between CPUs' kernels in the last bits (~1e-16), and without the rounding those bits
would reach the personalised models and grow over the rounds. On the grids two machines agree
unless a value falls within ~1e-16 of a grid boundary (odds ~1e-8 per entry), and q's rows sum
exactly (multiples of 2^-30 below 1), so that normalising them is exact too.
"""

from __future__ import annotations

import torch
from torch import Tensor

from fglrepro.config import ConfigError

#: S of eq. 11: ``global`` = matrix exponential of tau R, ``local`` = R (softmax kernel),
#: ``square`` = R^2 (two hops), as Figure 5 compares them.
KERNELS = ("global", "local", "square")
#: R is rounded to multiples of 2^-24 (~6e-8; entries in [-1, 1]).
RELATEDNESS_BITS = 24
#: q is rounded to multiples of 2^-30 (~9e-10; entries in [0, 1]).
WEIGHT_BITS = 30


def snap(values: Tensor, bits: int) -> Tensor:
    """``values`` rounded to the nearest multiple of ``2^-bits`` (exact float64 operations: a
    scaling by a power of two, a rounding to an integer and the scaling back)."""
    scale = float(2 ** bits)
    return torch.round(values * scale) / scale


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
    """``q [n, n]`` (float64) of n clients' task features ``[n, r, F]``: eq. 10, 11 and 9 in turn,
    R and q rounded to their grids (:func:`snap`)."""
    relatedness = snap(pearson_relatedness(features), RELATEDNESS_BITS)
    return snap(aggregation_weights(kernel_matrix(relatedness, kernel, tau, series_start), tau_s), WEIGHT_BITS)


def effective_collaborators(weights: Tensor) -> Tensor:
    """``[n]`` the effective number of clients each row of ``q [n, n]`` draws on, ``1 / sum_j q_ij^2``:
    ``n`` for uniform weights (FedAvg), 1 when one client's weight is 1."""
    return 1.0 / weights.square().sum(dim=1)
