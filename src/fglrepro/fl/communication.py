"""Communication cost: the bytes of what clients and server exchange (one source for every method)."""

from __future__ import annotations

from typing import Iterable

from torch import Tensor, nn


def tensor_bytes(tensors: Iterable[Tensor]) -> int:
    """Bytes of ``tensors`` as sent: ``numel * element_size`` summed. A sparse tensor counts at its
    dense size (``numel`` of its shape): the message it holds is the dense one, kept sparse in memory."""
    return sum(t.numel() * t.element_size() for t in tensors)


def module_bytes(module: nn.Module | None) -> int:
    """Bytes of a module's parameters (what sending the model costs); 0 for ``None``."""
    return 0 if module is None else tensor_bytes(module.parameters())
