"""Local fine-tuning after the last download ("+ft" rows of the one-shot setting).

Wraps any method: after the final round each client fine-tunes a copy of the model it
received (or, for a method without one, its own model) on its labelled nodes, keeping the
epoch with the best local validation accuracy. O-pFGL (2025) gives FedAvg, FedTAD, FedGM,
GHOST, DENSE and Co-Boost this step in its one-shot comparison.
"""

from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass, field

from torch import nn

from fglrepro.config import ConfigError
from fglrepro.fl.method import Federation
from fglrepro.fl.training import make_optimizer, train_best_validation
from fglrepro.fl.wrapper import MethodWrapper
from fglrepro.methods import register


@dataclass(frozen=True)
class FineTuneHparams:
    """base, base_hparams: the wrapped method and its hparams.
    epochs: most fine-tuning epochs (full-batch steps).
    patience: stop after this many epochs without a better local validation accuracy.
    lr: fine-tuning learning rate (``None``: the study's ``train.lr``); the optimiser and
        weight decay are the study's.
    """

    base: str = "fedavg"
    base_hparams: dict = field(default_factory=dict)
    epochs: int = 100
    patience: int = 20
    lr: float | None = None

    def __post_init__(self) -> None:
        if self.epochs < 1 or self.patience < 1:
            raise ConfigError(f"hparams.epochs and patience must be >= 1, got {self.epochs}, {self.patience}")


@register("finetune")
class FineTune(MethodWrapper):
    """``<base>+ft``: the base method, then local fine-tuning after the final download."""

    label = "+ft"
    Hparams = FineTuneHparams
    heterogeneous_models = True  # as far as its base method is

    def __init__(self, federation: Federation, hparams: FineTuneHparams) -> None:
        super().__init__(federation, hparams)
        self.has_global_model = True  # after the last download every client holds its tuned model
        self.tuned: dict[int, nn.Module] = {}

    def on_download(self, k: int, round_: int) -> None:
        self.base.on_download(k, round_)
        if round_ < self.federation.train.rounds:
            return
        stage = "global" if self.base.has_global_model else "local"
        model = copy.deepcopy(self.base.eval_model(k, stage))
        train = self.federation.train
        if self.hparams.lr is not None:
            train = dataclasses.replace(train, lr=self.hparams.lr)
        train_best_validation(model, make_optimizer(model, train), self.clients[k], self.hparams.epochs,
                              self.hparams.patience, start_is_candidate=True)
        self.tuned[k] = model

    def eval_model(self, k: int, stage: str) -> nn.Module:
        return self.tuned[k] if k in self.tuned else self.base.eval_model(k, stage)
