"""Pairwise-mask secure aggregation of real vectors (Bonawitz et al., 2017; O-pFGL App. B, Alg. 1).

Each pair of participating clients ``(k, j)`` shares a seed; both expand it into the same
mask ``r_kj``, which the lower-numbered client adds and the other subtracts, so the masks
cancel in the sum over all participants. Each client also adds a personal mask ``b_k``
whose seed it reveals to the server (Alg. 1 lines 7, 24-26); the server therefore learns
only the sum of the clients' vectors, never one of them.

Arithmetic: the real vectors are encoded in fixed point with :data:`FRACTION_BITS`
fractional bits as integers of the ring Z_M, M = 2^62, and masks are uniform in Z_M. All
masking and summation is integer addition modulo M, so the masks cancel *exactly*
(floating-point masks would not: ``(u + r) - r != u`` in general). The only error is the
fixed-point rounding of each client's vector, at most 2^-(FRACTION_BITS+1) per entry.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

#: Ring size M; masked values lie in [0, M).
MODULUS = 2**62
#: Fixed-point resolution 2^-24 (about 6e-8).
FRACTION_BITS = 24
#: Largest absolute value a sum of client vectors may reach (the signed half of the ring).
MAX_ABS_SUM = 2.0 ** (61 - FRACTION_BITS)


def encode(values: Tensor, num_clients: int) -> Tensor:
    """Fixed-point encoding of a real vector ``[L]`` into Z_M (int64 ``[L]``, on the CPU).

    Raises ValueError when a sum over ``num_clients`` such vectors could overflow the ring.
    """
    values = values.detach().to("cpu", torch.float64).flatten()
    largest = float(values.abs().max()) if values.numel() else 0.0
    if largest * num_clients >= MAX_ABS_SUM:
        raise ValueError(
            f"value {largest:g} is too large for secure aggregation over {num_clients} clients; "
            f"the sum must stay below {MAX_ABS_SUM:g}"
        )
    scaled = torch.round(values * 2.0**FRACTION_BITS).to(torch.int64)
    return torch.remainder(scaled, MODULUS)


def decode(ring: Tensor) -> Tensor:
    """Inverse of :func:`encode` for an element of Z_M (int64 ``[L]``) -> float64 ``[L]``."""
    signed = torch.where(ring >= MODULUS // 2, ring - MODULUS, ring)
    return signed.to(torch.float64) / 2.0**FRACTION_BITS


def pair_seed(session_seed: int, k: int, j: int) -> int:
    """The seed clients ``k`` and ``j`` share (stands in for a Diffie-Hellman key
    agreement); symmetric in ``k`` and ``j``."""
    low, high = sorted((k, j))
    state = np.random.SeedSequence([session_seed, low, high]).generate_state(1, dtype=np.uint64)
    return int(state[0]) & (2**63 - 1)


def ring_mask(seed: int, length: int) -> Tensor:
    """Uniform mask in Z_M (int64 ``[length]``) expanded from ``seed``."""
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, MODULUS, (length,), generator=generator, dtype=torch.int64)


def mask_vector(
    values: Tensor, k: int, participants: list[int], session_seed: int, self_seed: int,
) -> Tensor:
    """What client ``k`` sends: ``encode(values) + b_k + sum_{j>k} r_kj - sum_{j<k} r_kj``
    modulo M (int64 ``[L]``), with ``b_k`` expanded from ``self_seed`` and ``r_kj`` from
    :func:`pair_seed` over the other ``participants``."""
    masked = encode(values, len(participants))
    length = masked.numel()
    masked = torch.remainder(masked + ring_mask(self_seed, length), MODULUS)
    for j in participants:
        if j == k:
            continue
        mask = ring_mask(pair_seed(session_seed, k, j), length)
        masked = torch.remainder(masked + mask if k < j else masked - mask, MODULUS)
    return masked


def unmask_sum(masked: list[Tensor], self_seeds: list[int]) -> Tensor:
    """The server's result: the sum of all clients' vectors (float64 ``[L]``) from their
    masked vectors and revealed personal-mask seeds (all participants must report)."""
    total = torch.zeros_like(masked[0])
    for vector, seed in zip(masked, self_seeds):
        total = torch.remainder(total + vector - ring_mask(seed, vector.numel()), MODULUS)
    return decode(total)
