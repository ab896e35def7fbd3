"""Classification metrics on label tensors (match scikit-learn's definitions)."""

from __future__ import annotations

import torch
from torch import Tensor


def accuracy(pred: Tensor, target: Tensor) -> float:
    """Fraction of correct predictions; 0.0 for an empty set."""
    if target.numel() == 0:
        return 0.0
    return float((pred == target).float().mean())


def macro_f1(pred: Tensor, target: Tensor, num_classes: int, all_classes: bool = False) -> float:
    """Unweighted mean of per-class F1 over the classes present in ``target`` or ``pred``
    (``sklearn.metrics.f1_score(average="macro")``, zero_division=0), or with ``all_classes``
    over all ``num_classes`` (``labels=range(num_classes)``: absent classes score 0)."""
    if target.numel() == 0:
        return 0.0
    tp = torch.bincount(target[pred == target], minlength=num_classes).double()
    n_pred = torch.bincount(pred, minlength=num_classes).double()
    n_true = torch.bincount(target, minlength=num_classes).double()
    present = (n_pred + n_true) > 0
    f1 = 2 * tp / (n_pred + n_true).clamp(min=1)
    return float(f1.mean() if all_classes else f1[present].mean())
