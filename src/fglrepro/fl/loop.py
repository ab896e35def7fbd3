"""The shared federated round loop and its bookkeeping."""

from __future__ import annotations

import logging
import sys
import time
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from fglrepro.config import EvalConfig
from fglrepro.fl.checkpoint import Checkpoint, LoopState, random_states, set_random_states
from fglrepro.fl.evaluation import Evaluator, evaluate_each
from fglrepro.fl.method import FederatedMethod
from fglrepro.fl.training import Diverged

log = logging.getLogger(__name__)

METRIC_KEYS = ("val_acc", "val_f1_macro", "test_acc", "test_f1_macro")


def average_client_metrics(per_client: list[dict[str, float]], weights: list[float]) -> dict:
    """Weighted (by ``weights``) and unweighted means of each metric over clients."""
    w = np.asarray(weights, dtype=float) / np.sum(weights)
    return {
        "weighted": {m: float(np.dot(w, [c[m] for c in per_client])) for m in METRIC_KEYS},
        "unweighted": {m: float(np.mean([c[m] for c in per_client])) for m in METRIC_KEYS},
    }


@dataclass
class History:
    """Per-round record of a run and the selected (best-validation) round.

    ``rounds[i]`` holds ``{"round", "train_loss", "upload_bytes" [K], "download_bytes" [K],
    "weighted": {...}, "unweighted": {...}, "clients": [per-client metrics]}``; the byte
    lists count what each client sent and received that round (0 when not sampled).
    """

    rounds: list[dict] = field(default_factory=list)
    best_index: int = -1
    stopped_early: bool = False

    @property
    def best(self) -> dict:
        return self.rounds[self.best_index]

    @property
    def final(self) -> dict:
        return self.rounds[-1]


def run_federation(
    method: FederatedMethod, rounds: int, evaluation: EvalConfig,
    on_round: Callable[[dict], None] | None = None, evaluator: Evaluator = evaluate_each,
    checkpoint: Checkpoint | None = None,
) -> History:
    """Run up to ``rounds`` communication rounds of ``method``.

    Each round: participants train locally and upload; if ``evaluation.model`` is
    ``local`` the clients' freshly trained models are tested; the server updates; if it
    is ``global`` the models clients receive are tested. The best round is the one with
    the highest validation accuracy under ``evaluation.average``; with
    ``evaluation.patience`` the run stops early by ``evaluation.stop_rule``. When the run
    ends, :meth:`~FederatedMethod.on_run_end` may change the clients' models (e.g. local
    fine-tuning); they are then tested again and replace the last round's metrics.

    With a ``checkpoint``, the loop starts from its saved state when there is one (``method``
    and ``evaluator`` are then replaced by the saved ones) and saves its state as the
    checkpoint says (:meth:`~fglrepro.fl.checkpoint.Checkpoint.maybe_save`).

    Raises :class:`~fglrepro.fl.training.Diverged` when a local loss is not finite.
    """
    history = History()
    stopper = EarlyStopping(evaluation)
    first = 1
    saved = checkpoint.load() if checkpoint is not None else None
    if saved is not None:
        method, evaluator, history, stopper = saved.method, saved.evaluator, saved.history, saved.stopper
        set_random_states(saved.random)
        first = saved.round_ + 1
    weights = [float(c.num_nodes) for c in method.clients]

    def test(stage: str) -> list[dict[str, float]]:
        clients = method.clients
        return evaluator([method.eval_model(k, stage) for k in range(len(clients))], clients)

    for round_ in range(first, rounds + 1):
        uploads = method.client_updates(method.participants(round_), round_)
        if evaluation.model == "local":
            per_client = test("local")
        method.server_update(round_, uploads)
        for k in uploads:
            method.on_download(k, round_)
        if evaluation.model == "global":
            per_client = test("global")
        losses = [u.loss for u in uploads.values()]
        num_clients = len(method.clients)
        record = {
            "round": round_,
            "train_loss": float(np.mean(losses)) if losses else float("nan"),
            "upload_bytes": [uploads[k].num_bytes if k in uploads else 0 for k in range(num_clients)],
            "download_bytes": [method.download_bytes(k) if k in uploads else 0 for k in range(num_clients)],
            **average_client_metrics(per_client, weights),
            "clients": per_client,
        }
        if losses and not np.isfinite(record["train_loss"]):
            raise Diverged(f"mean training loss is {record['train_loss']} in round {round_}")
        history.rounds.append(record)
        if on_round is not None:
            on_round(record)
        if stopper.should_stop(record[evaluation.average]["val_acc"]):
            history.stopped_early = True
            break
        if checkpoint is not None and round_ < rounds:
            checkpoint.maybe_save(LoopState(round_, method, evaluator, history, stopper, random_states()))
    if method.on_run_end(history.rounds[-1]["round"]):
        per_client = test(evaluation.model)
        history.rounds[-1].update(**average_client_metrics(per_client, weights), clients=per_client)
    history.best_index = max(
        range(len(history.rounds)), key=lambda i: (history.rounds[i][evaluation.average]["val_acc"], -i)
    )
    return history


class EarlyStopping:
    """Counts rounds without a new best (``no_improvement``) or consecutive decreases
    (``consecutive_decrease``) of the validation score; never stops without ``patience``."""

    def __init__(self, evaluation: EvalConfig) -> None:
        self.patience = evaluation.patience
        self.rule = evaluation.stop_rule
        self.best = self.previous = float("-inf")
        self.count = 0

    def should_stop(self, score: float) -> bool:
        if self.rule == "no_improvement":
            self.count = 0 if score > self.best else self.count + 1
        else:
            self.count = self.count + 1 if score < self.previous else 0
        self.best = max(self.best, score)
        self.previous = score
        return self.patience is not None and self.count >= self.patience


class RoundProgress:
    """Per-round progress: a tqdm bar on a terminal, else a log line every ~10 % of the rounds
    and whenever ``every_s`` seconds passed since the last one (slow rounds, e.g. FedSage+'s)."""

    def __init__(self, rounds: int, average: str, every_s: float = 30.0) -> None:
        self.rounds = rounds
        self.average = average
        self.every = max(1, rounds // 10)
        self.every_s = every_s
        self.last = time.monotonic()
        self.bar = None
        if sys.stderr.isatty():
            from tqdm import tqdm

            self.bar = tqdm(total=rounds, unit="round", dynamic_ncols=True)

    def __call__(self, record: dict) -> None:
        m = record[self.average]
        text = f"loss {record['train_loss']:.4f} val {m['val_acc']:.4f} test {m['test_acc']:.4f}"
        if self.bar is not None:
            self.bar.set_postfix_str(text, refresh=False)
            self.bar.update(1)
        elif (record["round"] % self.every == 0 or record["round"] == self.rounds
              or time.monotonic() - self.last >= self.every_s):
            log.info("round %d/%d %s", record["round"], self.rounds, text)
            self.last = time.monotonic()

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
