"""Testing the clients' models each round: the evaluator interface and its reference."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from torch import nn

from fglrepro.fl.clients import ClientData
from fglrepro.fl.training import evaluate

#: Tests a list of models, one per client, on their clients: per-client metric dicts.
Evaluator = Callable[[list[nn.Module], list[ClientData]], list[dict[str, float]]]


@dataclass(frozen=True)
class EvaluateEach:
    """The reference evaluator: :func:`~fglrepro.fl.training.evaluate` per client, with the
    study's ``evaluation.dropout`` and ``evaluation.f1_classes``."""

    dropout: bool = False
    all_classes: bool = False

    def __call__(self, models: list[nn.Module], clients: list[ClientData]) -> list[dict[str, float]]:
        return [evaluate(m, c, self.dropout, self.all_classes) for m, c in zip(models, clients)]


evaluate_each = EvaluateEach()
