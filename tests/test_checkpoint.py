"""Resumable runs (:mod:`fglrepro.fl.checkpoint`): a run killed after a saved round and resumed
gives the uninterrupted run's numbers bit for bit; a checkpoint of another run is never used."""

from __future__ import annotations

import dataclasses
import json
import pickle
import signal
import subprocess
import sys
import time

import pytest
import torch
from helpers import make_method

from fglrepro.config import ConfigError, EvalConfig, ModelConfig
from fglrepro.fl.checkpoint import Checkpoint, LoopState, run_identity
from fglrepro.fl.engine import BatchedEvaluator, ClientBatch, VectorisedEngine
from fglrepro.fl.evaluation import evaluate_each
from fglrepro.fl.loop import run_federation
from fglrepro.methods import METHOD_MODULES
from fglrepro.sparse import SparseRows

ROUNDS = 5
EVAL = EvalConfig(model="local", average="weighted")
ZOO = ModelConfig(hidden=16, readout=True, clients=[{"arch": "gcn"}, {"arch": "sage"}, {"arch": "sgc", "hops": 2}])


class Killed(Exception):
    """Stands for a kill between two rounds."""


def build(sbm, name, hparams=None, engine=False, **kwargs):
    method = make_method(sbm, name, hparams, rounds=ROUNDS, **kwargs)
    evaluator = evaluate_each
    if engine:
        method.federation.engine = VectorisedEngine(method.federation)
        evaluator = BatchedEvaluator(method.federation.engine)
    return method, evaluator


def kill_after(round_):
    def on_round(record):
        if record["round"] == round_:
            raise Killed

    return on_round


CASES = [
    ("fedavg", None, {}),
    ("fedavg", None, {"engine": True}),
    ("scaffold", None, {"engine": True}),
    ("fedgkc", None, {"model": ZOO}),
    ("fml", None, {"model": ZOO}),
    ("fedproto", None, {"model": ModelConfig(hidden=16, readout=True)}),
    ("fedtad", {"distill_epochs": 1}, {}),
    ("gcfl_plus", None, {}),
]


@pytest.mark.parametrize("name,hparams,options", CASES, ids=[f"{c[0]}{'-engine' if c[2].get('engine') else ''}"
                                                               for c in CASES])
def test_a_killed_run_resumes_from_its_checkpoint_with_the_uninterrupted_numbers(sbm, tmp_path, name, hparams,
                                                                                 options):
    method, evaluator = build(sbm, name, hparams, **options)
    expected = run_federation(method, ROUNDS, EVAL, evaluator=evaluator)

    path = tmp_path / "run.json.ckpt"
    method, evaluator = build(sbm, name, hparams, **options)
    checkpoint = tracking(Checkpoint(path, "id", every_s=0), method)
    with pytest.raises(Killed):
        run_federation(method, ROUNDS, EVAL, evaluator=evaluator, on_round=kill_after(3), checkpoint=checkpoint)
    assert path.exists()  # holds rounds 1-2: round 3 was killed before its save

    torch.manual_seed(123)  # the resumed process's own draws must not matter
    method, evaluator = build(sbm, name, hparams, **options)
    checkpoint = tracking(Checkpoint(path, "id", every_s=0), method)
    resumed = run_federation(method, ROUNDS, EVAL, evaluator=evaluator, checkpoint=checkpoint)
    assert checkpoint.resumed_round == 2
    assert resumed.rounds == expected.rounds
    assert resumed.best_index == expected.best_index


def tracking(checkpoint, method):
    """``checkpoint`` with ``method``'s clients as its inputs, as ``fgl-train`` registers the built clients."""
    checkpoint.track_inputs(method.federation.clients)
    return checkpoint


def saved_after_one_round(sbm, path, track, engine=True):
    method, evaluator = build(sbm, "fedavg", engine=engine)
    run_federation(method, 1, EVAL, evaluator=evaluator)
    checkpoint = Checkpoint(path, "id", every_s=0)
    if track:
        checkpoint.track_inputs(method.federation.clients)
    checkpoint.maybe_save(LoopState(1, method, evaluator, None, None, {}))
    assert checkpoint.saved_round == 1
    return method


def storages(value) -> dict[int, int]:
    """Bytes of each storage behind ``value`` (a tensor, sparse or not, or SparseRows), by address."""
    if isinstance(value, SparseRows):
        parts = (value.rows, value.columns, value.values, value.offsets)
    elif isinstance(value, torch.Tensor) and value.layout == torch.sparse_csr:
        parts = (value.crow_indices(), value.col_indices(), value.values())
    elif isinstance(value, torch.Tensor):
        return {value.untyped_storage().data_ptr(): value.untyped_storage().nbytes()}
    else:
        return {}
    return {k: v for t in parts for k, v in storages(t).items()}


def test_the_clients_inputs_and_their_unions_are_saved_as_references(sbm, tmp_path):
    """Tracked, the clients' tensors leave the file (the engine's union of them pickles as
    ``ClientBatch.of`` either way); a load takes the tensors of the loading run's own clients and
    makes the union again from them."""
    method = saved_after_one_round(sbm, tmp_path / "whole.ckpt", track=False)
    saved_after_one_round(sbm, tmp_path / "tracked.ckpt", track=True)
    held = {}
    for client in method.federation.clients:
        for f in dataclasses.fields(client):
            held.update(storages(getattr(client, f.name)))
    whole, tracked = (tmp_path / "whole.ckpt").stat().st_size, (tmp_path / "tracked.ckpt").stat().st_size
    assert whole - tracked >= sum(held.values())

    fresh, _ = build(sbm, "fedavg", engine=True)
    checkpoint = tracking(Checkpoint(tmp_path / "tracked.ckpt", "id", every_s=0), fresh)
    loaded = checkpoint.load().method
    for client, own in zip(loaded.federation.clients, fresh.federation.clients):
        assert client.x is own.x and client.adj is own.adj and client.train_mask is own.train_mask
    (batch,) = method.federation.engine._batches.values()
    (remade,) = loaded.federation.engine._batches.values()
    assert remade.x is not batch.x and torch.equal(remade.x, batch.x) and torch.equal(remade.flat, batch.flat)


def test_an_input_changed_in_place_is_saved_whole(sbm, tmp_path):
    method, evaluator = build(sbm, "fedavg")
    checkpoint = tracking(Checkpoint(tmp_path / "run.ckpt", "id", every_s=0), method)
    method.federation.clients[0].x.mul_(2)
    checkpoint.maybe_save(LoopState(1, method, evaluator, None, None, {}))
    fresh, _ = build(sbm, "fedavg")
    loaded = tracking(Checkpoint(tmp_path / "run.ckpt", "id", every_s=0), fresh).load().method
    changed, kept = loaded.federation.clients[0], loaded.federation.clients[1]
    assert changed.x is not fresh.federation.clients[0].x
    assert torch.equal(changed.x, 2 * fresh.federation.clients[0].x)
    assert kept.x is fresh.federation.clients[1].x


def test_a_checkpoint_whose_inputs_the_loading_run_lacks_is_discarded(sbm, tmp_path):
    path = tmp_path / "run.ckpt"
    saved_after_one_round(sbm, path, track=True)
    assert Checkpoint(path, "id", every_s=0).load() is None  # no inputs registered
    assert not path.exists()
    saved_after_one_round(sbm, path, track=True)
    other, _ = build(sbm, "fedavg", num_clients=2)  # other clients: other shapes under the same keys
    assert tracking(Checkpoint(path, "id", every_s=0), other).load() is None


def test_a_checkpoint_of_another_run_or_an_unreadable_one_is_discarded(sbm, tmp_path):
    method, _ = build(sbm, "fedavg")
    expected = run_federation(method, ROUNDS, EVAL)
    path = tmp_path / "run.json.ckpt"
    method, _ = build(sbm, "fedavg", seed=1)
    with pytest.raises(Killed):
        run_federation(method, ROUNDS, EVAL, on_round=kill_after(4), checkpoint=Checkpoint(path, "seed 1", 0))
    for content in (None, b"not a checkpoint"):
        if content is not None:
            path.write_bytes(content)
        method, _ = build(sbm, "fedavg")
        checkpoint = Checkpoint(path, "seed 0", every_s=0)
        assert run_federation(method, ROUNDS, EVAL, checkpoint=checkpoint).rounds == expected.rounds
        assert checkpoint.resumed_round is None


def test_saves_wait_for_the_interval(sbm, tmp_path):
    path = tmp_path / "run.json.ckpt"
    method, _ = build(sbm, "fedavg")
    run_federation(method, ROUNDS, EVAL, checkpoint=Checkpoint(path, "id", every_s=3600))
    assert not path.exists()


def test_the_identity_changes_with_the_spec_and_the_inputs(tmp_path):
    data = tmp_path / "g.pt"
    data.write_bytes(b"graph")
    base = run_identity({"seed": 0}, [data])
    assert run_identity({"seed": 0}, [data]) == base
    assert run_identity({"seed": 1}, [data]) != base
    time.sleep(0.01)
    data.write_bytes(b"graph, rebuilt")
    assert run_identity({"seed": 0}, [data]) != base


SPEC = {"method": "fedavg", "seed": 0, "study": "s", "run": "fedavg", "dataset": "SBM",
        "train": {"rounds": 400, "local_epochs": 1}, "model": {"hidden": 8}}
TIMING = ("wall_s", "cpu_s", "peak_memory_mb", "resumed_after_round")


def fgl_train(cli_inputs, out, *extra):
    return [sys.executable, "-m", "fglrepro.cli.train", "--spec", json.dumps(SPEC), "--data", str(cli_inputs / "g.pt"),
            "--partition", str(cli_inputs / "p.pt"), "--out", str(out), "--threads", "1", *extra]


def stop_after_first_checkpoint(command, checkpoint, sig):
    """Start ``command`` and send it ``sig`` once ``checkpoint`` exists.

    On a loaded machine the 4 s run can end before this process sees the file; the caller then retries.
    """
    proc = subprocess.Popen(command, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not checkpoint.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    proc.send_signal(sig)
    return proc


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL], ids=["sigterm", "sigkill"])
def test_the_cli_resumes_a_stopped_run_and_writes_the_uninterrupted_json(cli_inputs, tmp_path, sig):
    reference = tmp_path / "reference.json"
    subprocess.run(fgl_train(cli_inputs, reference, "--checkpoint-every", "-1"), check=True, capture_output=True)
    out = tmp_path / "run.json"
    checkpoint = tmp_path / "run.json.ckpt"
    for _attempt in range(3):
        proc = stop_after_first_checkpoint(fgl_train(cli_inputs, out, "--checkpoint-every", "0"), checkpoint, sig)
        _, stderr = proc.communicate(timeout=120)
        if proc.returncode != 0:
            break
        out.unlink()
    assert proc.returncode == (128 + sig if sig == signal.SIGTERM else -sig), stderr
    if sig == signal.SIGTERM:
        assert "stopped by SIGTERM" in stderr and "to resume from it" in stderr
    assert checkpoint.exists() and not out.exists()

    done = subprocess.run(fgl_train(cli_inputs, out, "--checkpoint-every", "0"), capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert "resuming from checkpoint" in done.stderr
    assert not checkpoint.exists()
    run, expected = json.loads(out.read_text()), json.loads(reference.read_text())
    assert run["resumed_after_round"] >= 1
    assert {k: v for k, v in run.items() if k not in TIMING} == {k: v for k, v in expected.items() if k not in TIMING}


#: hparams and round count a method needs to build on a 2-round (O-pFGL: one-shot) schedule
NEEDS = {"adafgl": ({"fedavg_rounds": 1}, 2), "fedsage_plus": ({"generator_rounds": 1}, 2), "opfgl": (None, 1),
         "fedgm": ({"outer_epochs": 5, "server_steps": 5}, 1), "ghost": (None, 1)}
MODELS = (None, ModelConfig(hidden=16, readout=True), ZOO)


@pytest.mark.parametrize("name", sorted(METHOD_MODULES))
def test_every_method_can_be_checkpointed_after_a_round(sbm, tmp_path, name):
    """Its state pickles (no lambdas, weak references or open handles), with its clients' inputs as
    references, and loads back in a fresh build of the run."""
    hparams, rounds = NEEDS.get(name, (None, 2))

    def build_once():
        for model in MODELS:
            try:
                return make_method(sbm, name, hparams, rounds=rounds, local_epochs=1, model=model,
                                   evaluation=EvalConfig(model="global" if name == "fedavg_by_arch" else "local"))
            except ConfigError:
                continue
        pytest.fail(f"no test configuration builds {name}")

    method = build_once()
    checkpoint = tracking(Checkpoint(tmp_path / "run.json.ckpt", "id", every_s=0), method)
    run_federation(method, 1, EVAL if name != "fedavg_by_arch" else EvalConfig(model="global"))
    checkpoint.maybe_save(LoopState(1, method, evaluate_each, None, None, {}))
    assert checkpoint.enabled and checkpoint.saved_round == 1
    fresh = build_once()  # held: the checkpoint refers to its clients weakly
    state = tracking(Checkpoint(checkpoint.path, "id", every_s=0), fresh).load()
    assert state is not None and type(state.method) is type(method)


def test_a_stop_signal_is_not_swallowed_by_library_code_catching_exception():
    """PyG imports its optional packages inside ``except Exception``, just after the start line: a Ctrl-C
    landing there must still stop the run (it ran on for 100,000 rounds when Stopped was an Exception)."""
    from fglrepro.cli.train import Stopped, raise_on_stop_signals

    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    raise_on_stop_signals()
    try:
        with pytest.raises(Stopped):
            try:
                signal.raise_signal(signal.SIGINT)
            except Exception:  # noqa: BLE001 - what the library does
                pass
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def test_a_stop_signal_inside_an_import_waits_for_the_import_to_finish(tmp_path, monkeypatch):
    """A Ctrl-C that lands while a module is being imported (the training CLI imports torch after its
    start line) lets the import finish, then stops the run: raising inside a C extension's import
    breaks it for the process (a fresh-clone CI run ended in numpy's ImportError instead of a stop)."""
    from fglrepro.cli.train import Stopped, raise_on_stop_signals

    (tmp_path / "slow_module_under_a_signal.py").write_text(
        "import os, signal, time\n"
        "os.kill(os.getpid(), signal.SIGINT)\n"
        "time.sleep(0.3)\n"
        "finished = True\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    raise_on_stop_signals()
    imported = False
    try:
        with pytest.raises(Stopped):
            import slow_module_under_a_signal

            imported = slow_module_under_a_signal.finished
            time.sleep(5)  # the signal, delivered again after the import, stops this
        assert imported, "the stop interrupted the import"
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        sys.modules.pop("slow_module_under_a_signal", None)


def test_a_client_batch_pickles_as_the_call_that_made_it_unless_made_otherwise(sbm):
    """``ClientBatch.of`` pickles as its clients (not the union's features); a batch changed by
    ``dataclasses.replace`` (FedGLS swaps the adjacency) pickles whole, the change kept."""
    clients = build(sbm, "fedavg")[0].federation.clients
    batch = ClientBatch.of(clients, [0, 1, 2])
    features = batch.x.numel() * batch.x.element_size()
    assert len(pickle.dumps((clients, batch))) - len(pickle.dumps(clients)) < features / 4
    remade = pickle.loads(pickle.dumps(batch))
    assert all(torch.equal(getattr(remade, f), getattr(batch, f)) for f in ("x", "y", "flat", "batch", "sizes"))
    assert torch.equal(remade.adj.to_dense(), batch.adj.to_dense())

    identity = torch.eye(batch.x.size(0)).to_sparse_csr()
    swapped = dataclasses.replace(batch, adj=identity)
    assert len(pickle.dumps(swapped)) > features
    assert torch.equal(pickle.loads(pickle.dumps(swapped)).adj.to_dense(), identity.to_dense())
