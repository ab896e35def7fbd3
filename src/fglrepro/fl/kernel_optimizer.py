"""A torch optimiser without ``torch.optim.Optimizer``: Adam, AdamW and SGD through torch's
functional kernels."""

from __future__ import annotations

from typing import Iterable

import torch
from torch import Tensor
from torch.optim.adam import adam
from torch.optim.sgd import sgd

from fglrepro.config import TrainConfig


class KernelOptimizer:
    """``torch.optim.Adam`` (``momentum`` None), ``torch.optim.AdamW`` (``momentum`` None and
    ``decoupled``) or ``torch.optim.SGD`` with ``momentum`` on
    ``params``, stepping through torch's functional kernels (``torch.optim.adam.adam``,
    ``torch.optim.sgd.sgd``) with the state those classes keep, created at a parameter's first
    gradient as they create it: the same updates bit for bit (``tests/test_kernel_optimizer.py``).
    It exists because constructing a ``torch.optim.Optimizer`` imports ``torch._dynamo``, about
    1 s of CPU in every training process that builds one, as long as FedAvg's whole round loop.

    Args:
        params: the parameters, updated in place by :meth:`step`.
        lr, weight_decay: as in torch: L2 decay added to the gradient (coupled), or with
            ``decoupled`` AdamW's ``p <- p * (1 - lr * weight_decay)`` before the Adam step.
        momentum: SGD's momentum; ``None`` for Adam (betas 0.9, 0.999, eps 1e-8).
        fused: torch's fused kernel (``None``: its default single-tensor one).
        decoupled: AdamW's decoupled weight decay (Adam only).
    """

    def __init__(self, params: Iterable[Tensor], lr: float, weight_decay: float = 0.0,
                 momentum: float | None = None, fused: bool | None = None, decoupled: bool = False) -> None:
        if decoupled and momentum is not None:
            raise ValueError("decoupled weight decay is AdamW's: momentum must be None (Adam), got "
                             f"momentum={momentum}")
        self.params = list(params)
        self.lr, self.weight_decay, self.momentum, self.fused = lr, weight_decay, momentum, fused
        self.decoupled = decoupled
        #: per parameter (by position) its Adam step, first and second moments, or its SGD momentum buffer
        self.state: dict[int, list[Tensor | None]] = {}

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Drop the gradients (the only mode this optimiser's callers use)."""
        for p in self.params:
            p.grad = None

    @classmethod
    def of(cls, params: Iterable[Tensor], config: TrainConfig, fused: bool | None = None) -> "KernelOptimizer":
        """The study's optimiser (``config.optimizer``: Adam, AdamW, or SGD without momentum) with
        its learning rate and weight decay: :func:`~fglrepro.fl.training.make_optimizer`'s."""
        momentum = 0.0 if config.optimizer == "sgd" else None
        return cls(params, config.lr, config.weight_decay, momentum, fused, decoupled=config.optimizer == "adamw")

    def select_rows(self, rows: Tensor) -> list[Tensor]:
        """For parameters stacked over clients (``[m, ...]``, every row stepped together, so
        one step count serves all): keep only the rows ``rows`` of each parameter and of its
        state. Returns the new parameters (leaves requiring gradient), which replace the old."""
        self.params = [p.detach()[rows].requires_grad_(True) for p in self.params]
        for state in self.state.values():
            state[:] = [t if t is None or t.dim() == 0 else t[rows] for t in state]
        return self.params

    @torch.no_grad()
    def step(self) -> None:
        """One update of every parameter that has a gradient."""
        live = [i for i, p in enumerate(self.params) if p.grad is not None]
        params, grads = [self.params[i] for i in live], [self.params[i].grad for i in live]
        if self.momentum is not None:
            buffers = [self.state.get(i, [None])[0] for i in live]
            sgd(params, grads, buffers, weight_decay=self.weight_decay, momentum=self.momentum, lr=self.lr,
                dampening=0.0, nesterov=False, maximize=False, fused=self.fused)
            self.state.update((i, [b]) for i, b in zip(live, buffers))
            return
        for i in live:
            self._adam_state(i)
        steps, exp_avgs, exp_avg_sqs = zip(*(self.state[i] for i in live)) if live else ((), (), ())
        adam(params, grads, list(exp_avgs), list(exp_avg_sqs), [], list(steps), fused=self.fused, amsgrad=False,
             beta1=0.9, beta2=0.999, lr=self.lr, weight_decay=self.weight_decay, eps=1e-8, maximize=False,
             decoupled_weight_decay=self.decoupled)

    def _adam_state(self, i: int) -> list[Tensor]:
        """Parameter i's Adam step, first and second moments, created as torch creates them."""
        if i not in self.state:
            p = self.params[i]
            step = (torch.zeros((), dtype=torch.float32, device=p.device) if self.fused
                    else torch.tensor(0.0, dtype=torch.float32))
            self.state[i] = [step, torch.zeros_like(p), torch.zeros_like(p)]
        return self.state[i]

    @property
    def can_step_tiles(self) -> bool:
        """Whether :meth:`step_tiles` is available: fused Adam or AdamW (elementwise kernels)."""
        return self.momentum is None and bool(self.fused)

    @torch.no_grad()
    def step_tiles(self, param: Tensor, tiles: Iterable[tuple[slice, Tensor]]) -> None:
        """One update of ``param`` alone from its gradient given tile by tile, bit for bit the
        update :meth:`step` makes from the whole gradient (the fused kernels are elementwise),
        without the whole gradient ever existing: ``tiles`` yields ``(rows, grad)``, ``grad``
        the gradient of ``param[rows]`` (rows as a slice of the first dimension), covering every
        row once; each tile is stepped as soon as it is yielded, while it is in cache. For a
        large parameter with a cheap gradient (FedSage+'s fGen output layer, where writing the
        gradient and reading it back cost as much as computing it). Fused Adam or AdamW only
        (:attr:`can_step_tiles`); ``param.grad`` is neither read nor set."""
        if not self.can_step_tiles:
            raise ValueError("step_tiles needs fused Adam or AdamW")
        index = next((i for i, p in enumerate(self.params) if p is param), None)
        if index is None:
            raise ValueError(f"step_tiles: the parameter of shape {tuple(param.shape)} is not one this optimiser steps")
        step, exp_avg, exp_avg_sq = self._adam_state(index)
        step += 1
        kernel = torch._fused_adamw_ if self.decoupled else torch._fused_adam_
        for rows, grad in tiles:
            kernel([param[rows]], [grad], [exp_avg[rows]], [exp_avg_sq[rows]], [], [step], amsgrad=False,
                   lr=self.lr, beta1=0.9, beta2=0.999, weight_decay=self.weight_decay, eps=1e-8, maximize=False,
                   grad_scale=None, found_inf=None)
