"""Reusable large buffers (the engine's gradients, the server's float64 stacks)."""

from __future__ import annotations

import torch
from torch import Tensor


class BufferPool:
    """Large tensors reused once nothing outside the pool holds them.

    A fresh multi-megabyte tensor per step costs page faults on every touch (glibc maps large
    blocks anew each time); reusing one keeps the per-step cost linear in the number of
    clients. The pool hands out views, so every holder (autograd's buffers, the gradients a
    caller keeps, ``.grad`` of bound models) counts as a user of the storage; a buffer is
    taken again only when the pool's own reference is the last one. It keeps at most
    ``keep`` buffers, each of at least ``min_bytes`` (smaller ones are cheap to allocate).
    """

    def __init__(self, keep: int = 4, min_bytes: int = 1 << 20) -> None:
        self.keep, self.min_bytes = keep, min_bytes
        self.buffers: list[tuple[Tensor, int]] = []

    @staticmethod
    def _uses(buffer: Tensor) -> int:
        return torch._C._storage_Use_Count(buffer.untyped_storage()._cdata)

    def empty(self, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> Tensor:
        """An uninitialised ``shape`` tensor (a view of a pooled buffer)."""
        for buffer, idle in self.buffers:
            if buffer.shape == shape and buffer.dtype == dtype and buffer.device == device \
                    and self._uses(buffer) == idle:
                return buffer.view(shape)
        buffer = torch.empty(shape, dtype=dtype, device=device)
        if len(self.buffers) < self.keep and buffer.numel() * buffer.element_size() >= self.min_bytes:
            self.buffers.append((buffer, self._uses(buffer)))
        return buffer.view(shape)

    def zeros(self, shape: tuple[int, ...], like: Tensor) -> Tensor:
        """A zero ``shape`` tensor of ``like``'s dtype and device (a view of a pooled buffer)."""
        return self.empty(shape, like.dtype, like.device).zero_()
