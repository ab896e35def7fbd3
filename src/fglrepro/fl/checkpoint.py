"""Resumable runs: the round loop's whole state, saved every so often and restored after a kill.

A checkpoint is one pickle (``torch.save``) of everything the loop carries from one round to
the next: the method (its models, optimiser states, server state and federation, with the
engine if any), the evaluator, the history, the early-stopping counter and every random
number generator in use (torch's CPU and CUDA ones, NumPy's and Python's global ones; the
federation's own generator travels inside the method). Pickled together, objects shared
between them stay shared. Restored, the loop goes on from the next round and gives the numbers
an uninterrupted run gives, bit for bit on the same machine (with one thread, as ``fgl-train`` runs).

The clients' data is not saved again: their tensors as built from the run's input files
(:class:`InputTensors`), while unchanged, are stored as keys and taken from the resuming process's
own clients, and the unions of clients (:class:`~fglrepro.fl.engine.ClientBatch`, the grouped path's
views) are stored as the calls that made them (:class:`~fglrepro.fl.engine.Remade`). FedGKC on CS with
20 clients (grouped path, after round 1 of 100): 2356 MiB (four copies of the features) -> 269 MiB, and
4.3-6.4 s -> 0.7-0.9 s of wall per save.

A checkpoint belongs to one run: its ``identity`` (a digest of the run's spec, input files and
package sources) must match, else it is discarded, so a changed spec or edited code starts over.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import hashlib
import json
import logging
import pickle
import random
import time
import weakref
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any, Iterator

import numpy as np
import torch

from fglrepro.io import atomic_torch_save

log = logging.getLogger(__name__)

#: the package's sources, whose digest is part of every checkpoint's identity
PACKAGE_DIR = Path(__file__).resolve().parents[1]


def run_identity(spec: dict, inputs: list[str | Path]) -> str:
    """Digest of a run: its ``spec``, the size and modification time of each input file and
    the contents of the package's Python sources (an edit to the code starts the run over)."""
    digest = hashlib.sha256(json.dumps(spec, sort_keys=True).encode())
    for path in inputs:
        stat = Path(path).stat()
        digest.update(f"{Path(path).resolve()}:{stat.st_size}:{stat.st_mtime_ns}".encode())
    for source in sorted(PACKAGE_DIR.rglob("*.py")):
        digest.update(source.relative_to(PACKAGE_DIR).as_posix().encode())
        digest.update(source.read_bytes())
    return digest.hexdigest()


def random_states() -> dict[str, Any]:
    """The global random number generators' states."""
    states = {"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        states["cuda"] = torch.cuda.get_rng_state_all()
    return states


def set_random_states(states: dict[str, Any]) -> None:
    """Restore what :func:`random_states` returned."""
    torch.set_rng_state(states["torch"])
    np.random.set_state(states["numpy"])
    random.setstate(states["python"])
    if "cuda" in states:
        torch.cuda.set_rng_state_all(states["cuda"])


class InputTensors:
    """The tensor fields of the clients as a run builds them from its input files, by key
    ``(client position, field)``, held by weak references (a method that replaces a client's
    data frees the original as before).

    :meth:`key_of` gives a tensor's key while it is unchanged: the same object at the version it
    had when registered (an in-place change raises the version: the tensor is then saved in full).
    """

    def __init__(self, clients: list) -> None:
        self._refs: dict[tuple[int, str], weakref.ref] = {}
        self._keys: dict[int, tuple[tuple[int, str], weakref.ref, int]] = {}
        for k, client in enumerate(clients):
            for field in dataclasses.fields(client):
                value = getattr(client, field.name)
                if isinstance(value, torch.Tensor):
                    ref = weakref.ref(value)
                    self._refs[(k, field.name)] = ref
                    self._keys[id(value)] = ((k, field.name), ref, value._version)

    def key_of(self, tensor: torch.Tensor) -> tuple[int, str] | None:
        entry = self._keys.get(id(tensor))
        if entry is None or entry[1]() is not tensor or tensor._version != entry[2]:
            return None
        return entry[0]

    def get(self, key: tuple[int, str], shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        """The tensor of ``key``; raises ``LookupError`` when it is gone or of another shape or dtype."""
        ref = self._refs.get(tuple(key))
        tensor = ref() if ref is not None else None
        if tensor is None or tuple(tensor.shape) != tuple(shape) or tensor.dtype != dtype:
            raise LookupError(f"the checkpoint refers to client input {key}, which this run's clients lack")
        return tensor


#: the inputs of the run whose checkpoint is being loaded (:meth:`Checkpoint.load`)
_loading_inputs: contextvars.ContextVar[InputTensors | None] = contextvars.ContextVar("loading_inputs", default=None)


def input_tensor(key: tuple[int, str], shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """Unpickles an input tensor saved as its key: the loading run's own (:class:`InputTensors`)."""
    inputs = _loading_inputs.get()
    if inputs is None:
        raise LookupError(f"the checkpoint refers to client input {key}: load it with its run's clients")
    return inputs.get(key, shape, dtype)


def pickle_module(inputs: InputTensors | None) -> Any:
    """A ``pickle_module`` for ``torch.save`` that stores the unchanged ``inputs`` as their keys (plain
    ``pickle`` without inputs)."""
    if inputs is None:
        return pickle

    class StatePickler(pickle.Pickler):
        def reducer_override(self, obj: Any) -> Any:
            if isinstance(obj, torch.Tensor):
                key = inputs.key_of(obj)
                if key is not None:
                    return input_tensor, (key, tuple(obj.shape), obj.dtype)
            return NotImplemented

    module = ModuleType("pickle")
    module.__dict__.update(vars(pickle))
    module.Pickler = StatePickler
    return module


@contextlib.contextmanager
def loading_inputs(inputs: InputTensors | None) -> Iterator[None]:
    """Resolve input keys against ``inputs`` while a checkpoint is loaded in the block."""
    token = _loading_inputs.set(inputs)
    try:
        yield
    finally:
        _loading_inputs.reset(token)


@dataclass
class LoopState:
    """What the round loop carries into round ``round_ + 1``."""

    round_: int
    method: Any
    evaluator: Any
    history: Any
    stopper: Any
    random: dict[str, Any]


class Checkpoint:
    """The checkpoint file of one run at ``path``.

    :meth:`maybe_save` writes the loop's state when ``every_s`` seconds have passed since the
    last save, and never sooner than ten times the last save's duration after it, so that
    saving costs at most about a tenth of the run; ``every_s = 0``: after every round. A state that cannot be
    pickled or written switches checkpoints off for the run, with a warning (it never stops
    the run). :attr:`inputs` (set by :meth:`track_inputs`): the clients' tensors stored as keys.
    """

    def __init__(self, path: str | Path, identity: str, every_s: float = 60.0) -> None:
        self.path, self.identity, self.every_s = Path(path), identity, every_s
        self.inputs: InputTensors | None = None
        self.enabled = True
        self.last_save = time.perf_counter()
        self.save_cost = 0.0
        #: the last round saved to or restored from the file; the round a run resumed after
        self.saved_round: int | None = None
        self.resumed_round: int | None = None

    def track_inputs(self, clients: list) -> None:
        """Register ``clients``, built from the run's input files (which :func:`run_identity` covers) before
        any method touched them: their unchanged tensors are saved as keys, and a load takes them from
        the ``clients`` of the resuming process (held weakly: the caller keeps them until the load)."""
        self.inputs = InputTensors(clients)

    def load(self) -> LoopState | None:
        """The saved state of this run, or None (no file; one of another run or unreadable:
        discarded, with a log line)."""
        if not self.path.exists():
            return None
        try:
            with loading_inputs(self.inputs):
                saved = torch.load(self.path, weights_only=False)
        except Exception as err:  # noqa: BLE001 - any unreadable file is discarded, never used
            log.warning("checkpoint %s is unreadable (%s): starting over", self.path, err)
            self.discard()
            return None
        if not isinstance(saved, dict) or saved.get("identity") != self.identity:
            log.info("checkpoint %s belongs to another spec, input or code version: starting over", self.path)
            self.discard()
            return None
        state = saved["state"]
        log.info("resuming from checkpoint %s after round %d", self.path, state.round_)
        self.saved_round = self.resumed_round = state.round_
        return state

    def maybe_save(self, state: LoopState) -> None:
        """Save ``state`` if it is time (see the class)."""
        now = time.perf_counter()
        if not self.enabled or (self.every_s > 0 and now - self.last_save < max(self.every_s, 10 * self.save_cost)):
            return
        try:
            atomic_torch_save({"identity": self.identity, "state": state}, self.path, pickle_module(self.inputs))
        except (pickle.PicklingError, TypeError, AttributeError, RuntimeError, OSError) as err:
            log.warning("checkpoints off for this run: its state cannot be saved to %s (%s)", self.path, err)
            self.enabled = False
            return
        self.last_save = time.perf_counter()
        self.save_cost = self.last_save - now
        self.saved_round = state.round_

    def discard(self) -> None:
        """Remove the file (after the run's result is written)."""
        self.path.unlink(missing_ok=True)
