"""``fgl-train``: one federated training run -> one run JSON.

Example (the workflow writes these commands; see its logs):

    fgl-train --data data/prepared/Cora/plain.pt --partition part.pt --out run.json \\
        --spec '{"method": "fedavg", "seed": 0, "train": {"rounds": 10}, "model": {"hidden": 64}}'

The spec's ``method``, ``hparams``, ``model``, ``train``, ``evaluation`` and ``seed`` drive
the run (keys of ``model``, ``train``, ``evaluation``: ``ModelConfig``, ``TrainConfig``,
``EvalConfig`` in ``src/fglrepro/config.py``; ``hparams``: the method's ``Hparams`` class);
any other keys (study, dataset, clients, ...) are copied into the JSON.
A run that diverges (NaN loss) or runs out of memory is written with status
``diverged`` / ``oom``; a configuration error exits with status 2.

Long runs are resumable: every ``--checkpoint-every`` seconds (default 60) the round loop's
state goes to ``<out>.ckpt``; after a kill, the same command resumes from it and gives the
numbers of an uninterrupted run (:mod:`fglrepro.fl.checkpoint`). SIGTERM / SIGINT stop the
run with a message saying which round the checkpoint holds (exit status 128 + signal).
"""

from __future__ import annotations

import argparse
import json
import logging
import platform
import resource
import signal
import sys
import time

from fglrepro.allocator import keeps_freed_memory, restart_keeping_freed_memory
from fglrepro.cli.common import run_cli

log = logging.getLogger("fgl-train")


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="fgl-train", description=__doc__.split("\n\n", 1)[0],
                                     epilog=__doc__.split("\n\n", 1)[1],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    import dataclasses

    from fglrepro.config import EvalConfig, ModelConfig, TrainConfig

    keys = "; ".join(f"{name}: {', '.join(f.name for f in dataclasses.fields(cls))}"
                     for name, cls in (("model", ModelConfig), ("train", TrainConfig), ("evaluation", EvalConfig)))
    parser.add_argument("--spec", required=True,
                        help="run spec as JSON: method and seed (required), hparams (the method's), model, train, "
                             f"evaluation (keys of each: {keys}); other keys (study, dataset, clients, ...) are "
                             "copied into the run JSON")
    parser.add_argument("--data", required=True, help="prepared graph (.pt)")
    parser.add_argument("--partition", required=True, help="partition (.pt)")
    parser.add_argument("--out", required=True, help="run JSON output")
    parser.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"))
    parser.add_argument("--threads", type=int, default=None, help="CPU threads for torch")
    parser.add_argument("--malloc", default="reuse", choices=("reuse", "default"),
                        help="reuse: restart with glibc settings that keep freed memory for the next step's "
                             "tensors, far fewer page faults (fglrepro/allocator.py); default: the C library's own")
    parser.add_argument("--checkpoint-every", type=float, default=60.0, metavar="SECONDS",
                        help="save the loop's state to <out>.ckpt this often (0: every round; < 0: never); "
                             "a rerun resumes from it")
    return parser.parse_args(argv)


class Stopped(BaseException):
    """SIGTERM or SIGINT reached the training process; ``signum`` is the signal. A ``BaseException``
    (as ``KeyboardInterrupt``), so that library code's ``except Exception`` cannot swallow a stop: PyG's
    import of optional packages runs in one, just after the start line."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


#: set by the workflow (workflow/rules/common.smk) to Snakemake's process id.
WORKFLOW_PID = "FGLREPRO_WORKFLOW_PID"


def stop_with_workflow(interval_s: float = 1.0) -> None:
    """Started by the workflow (:data:`WORKFLOW_PID` set): once Snakemake is gone (SIGKILL leaves its
    jobs running on, their shell included, so the kernel's parent-death signal never comes), send this
    process SIGTERM, which stops the run as a deliberate stop does (checkpoint kept, no run JSON)."""
    import os
    import threading

    from fglrepro.processes import process_alive

    pid = os.environ.get(WORKFLOW_PID, "")
    if not pid.isdigit():
        return

    def watch() -> None:
        while process_alive(int(pid)):
            time.sleep(interval_s)
        log.warning("the workflow (Snakemake, pid %s) is gone: stopping this job", pid)
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=watch, name="workflow-watch", daemon=True).start()


def importing(frame) -> bool:
    """Whether ``frame`` runs inside an import (a frame of Python's import machinery below it)."""
    while frame is not None:
        if frame.f_code.co_filename.startswith("<frozen importlib"):
            return True
        frame = frame.f_back
    return False


def raise_on_stop_signals(retry_s: float = 0.05) -> None:
    """SIGTERM and SIGINT raise :class:`Stopped` (instead of dying without a word). A signal that
    lands inside an import is delivered again ``retry_s`` later: an exception raised halfway through
    a C extension's import (numpy's, under torch) breaks that module for the process, and the run
    would end in an ``ImportError`` instead of a stop."""
    import os
    import threading

    def handler(signum, frame):
        if importing(frame):
            threading.Timer(retry_s, os.kill, (os.getpid(), signum)).start()
            return
        raise Stopped(signum)

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, handler)


def resolve_device(name: str):
    import torch

    from fglrepro.config import ConfigError

    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda" and not torch.cuda.is_available():
        raise ConfigError("--device cuda requested but no CUDA device is available; use auto or cpu")
    return torch.device(name)


def peak_memory_mb(device) -> float:
    import torch

    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def summarize(history, evaluation) -> dict:
    """Metrics of the best-validation round and of the final round."""
    def pick(record: dict) -> dict:
        chosen = record[evaluation.average]
        return {
            "round": record["round"], **chosen,
            "weighted": record["weighted"], "unweighted": record["unweighted"],
            "clients": record["clients"],
        }

    return {"best": pick(history.best), "final": pick(history.final)}


def curves(history) -> dict:
    """Per-round series (both averages) for figures."""
    out = {"round": [r["round"] for r in history.rounds],
           "train_loss": [r["train_loss"] for r in history.rounds],
           "upload_bytes": [sum(r["upload_bytes"]) for r in history.rounds],
           "download_bytes": [sum(r["download_bytes"]) for r in history.rounds]}
    for average in ("weighted", "unweighted"):
        for key in ("val_acc", "test_acc", "test_f1_macro"):
            out[f"{average}_{key}"] = [r[average][key] for r in history.rounds]
    return out


def communication(history) -> dict:
    """Total bytes each client uploaded and downloaded over the run (lists of length K)."""
    return {
        direction: [int(sum(col)) for col in zip(*(r[direction] for r in history.rounds))]
        for direction in ("upload_bytes", "download_bytes")
    }


def execute(spec: dict, data_path: str, partition_path: str, device_name: str, checkpoint=None) -> dict:
    """Run the spec; returns the run record (status, metrics, curves, provenance). With a
    :class:`~fglrepro.fl.checkpoint.Checkpoint` the loop resumes from it and saves to it."""
    import torch

    import fglrepro
    from fglrepro.config import ConfigError, EvalConfig, ModelConfig, TrainConfig, as_dict, from_dict
    from fglrepro.data.graph import load_graph
    from fglrepro.fl.clients import build_clients
    from fglrepro.fl.evaluation import EvaluateEach, learning_problem
    from fglrepro.fl.loop import RoundProgress, run_federation
    from fglrepro.fl.method import Federation, RunSetup, vectorised_obstacle
    from fglrepro.fl.training import Diverged
    from fglrepro.methods import build_method, check_method, resolve_method
    from fglrepro.models import build_model, fast_dropout, fast_kernels
    from fglrepro.partition.data import Partition
    from fglrepro.provenance import provenance

    method_spec = resolve_method(spec["method"], spec.get("hparams"))
    model_cfg = from_dict(ModelConfig, spec.get("model"), "model")
    train_cfg = from_dict(TrainConfig, spec.get("train"), "train")
    eval_cfg = from_dict(EvalConfig, spec.get("evaluation"), "evaluation")
    problems = check_method(method_spec, RunSetup(train_cfg, model_cfg, eval_cfg))
    if problems:
        raise ConfigError("; ".join(problems))
    seed = int(spec["seed"])
    device = resolve_device(device_name)

    torch.manual_seed(seed)
    graph = load_graph(data_path)
    partition = Partition.load(partition_path)
    clients = build_clients(graph, partition, device)
    if checkpoint is not None:
        checkpoint.track_inputs(clients)  # saved as references, taken from these on a resume
    model = build_model(model_cfg, graph.num_features, graph.num_classes).to(device)
    client_models = [
        build_model(model_cfg.for_client(k, client.graphless), graph.num_features, graph.num_classes).to(device)
        for k, client in enumerate(clients)
    ] if model_cfg.heterogeneous else None
    del graph  # the clients hold copies of their rows: the whole graph's features would only take memory
    federation = Federation(clients=clients, model=model, train=train_cfg,
                            generator=torch.Generator().manual_seed(seed), client_models=client_models)
    test_options = {"dropout": eval_cfg.dropout, "all_classes": eval_cfg.f1_classes == "all"}
    engine = "sequential" if train_cfg.engine == "sequential" else "per-client"
    evaluator = EvaluateEach(**test_options)
    obstacle = vectorised_obstacle(method_spec.capabilities, model_cfg)
    fast = train_cfg.engine != "sequential"
    with fast_kernels(fast), fast_dropout(fast):  # sparse first layers, cached propagation, fast masks
        if fast and obstacle is None:
            from fglrepro.fl.engine import BatchedEvaluator, VectorisedEngine

            federation.engine = VectorisedEngine(federation)
            engine, evaluator = "vectorised", BatchedEvaluator(federation.engine, **test_options)
        elif train_cfg.engine == "auto":
            log.info("engine auto: per-client loop with fast kernels, %s", obstacle)
        method = build_method(method_spec, federation)

        record = {
            **spec,
            "hparams": as_dict(method_spec.hparams), "model": as_dict(model_cfg), "train": as_dict(train_cfg),
            "evaluation": as_dict(eval_cfg), "engine": engine,
            "device": str(device), "host": platform.node(), "torch_version": torch.__version__,
            "malloc": "reuse" if keeps_freed_memory() else "default",
            "package_version": fglrepro.__version__, **provenance(),  # git commit and dirty flag, machine
        }
        progress = RoundProgress(train_cfg.rounds, eval_cfg.average)
        start, start_cpu = time.perf_counter(), time.process_time()
        try:
            history = run_federation(method, train_cfg.rounds, eval_cfg, on_round=progress, evaluator=evaluator,
                                     checkpoint=checkpoint)
            if getattr(method, "on_grouped_path", False):
                record["engine"] = "grouped"
            record.update(status="ok", stopped_early=history.stopped_early,
                          metrics=summarize(history, eval_cfg), curves=curves(history),
                          communication=communication(history))
            record["learning"] = learning_problem(record["curves"][f"{eval_cfg.average}_val_acc"],
                                                  record["curves"]["train_loss"])
        except Diverged as err:
            record.update(status="diverged", message=str(err))
        except torch.OutOfMemoryError as err:
            record.update(status="oom", message=str(err).splitlines()[0])
        finally:
            progress.close()
        record.update(wall_s=time.perf_counter() - start, cpu_s=time.process_time() - start_cpu,
                      peak_memory_mb=peak_memory_mb(device))
        if checkpoint is not None and checkpoint.resumed_round is not None:
            record["resumed_after_round"] = checkpoint.resumed_round  # wall_s and cpu_s: this process only
        return record


def main(argv=None) -> None:
    args = parse_args(argv)
    if args.malloc == "reuse" and argv is None:  # the process's own command line, which it restarts with
        restart_keeping_freed_memory()

    def body() -> None:
        from fglrepro.config import ConfigError
        from fglrepro.io import atomic_write_json

        try:
            spec = json.loads(args.spec)
        except json.JSONDecodeError as err:
            raise ConfigError(f"--spec is not valid JSON: {err}") from err
        missing = [k for k in ("method", "seed") if k not in spec]
        if missing:
            raise ConfigError(f"--spec lacks required key(s) {missing}")
        raise_on_stop_signals()  # before the start line: a stop during the set-up is a stop too
        stop_with_workflow()
        log.info("start: %s", ", ".join(f"{k} {spec[k]}" for k in ("study", "run", "dataset", "clients", "seed")
                                        if k in spec))
        checkpoint = None
        try:
            if args.threads:
                import torch

                torch.set_num_threads(args.threads)
            if args.checkpoint_every >= 0:
                from fglrepro.fl.checkpoint import Checkpoint, run_identity

                identity = run_identity({**spec, "device": args.device}, [args.data, args.partition])
                checkpoint = Checkpoint(f"{args.out}.ckpt", identity, args.checkpoint_every)
            record = execute(spec, args.data, args.partition, args.device, checkpoint)
        except Stopped as stop:
            saved = checkpoint.saved_round if checkpoint is not None else None
            resume = (f"the checkpoint {checkpoint.path} holds rounds 1-{saved}: run the same command (or "
                      f"snakemake) again to resume from it" if saved
                      else "no checkpoint was saved: a rerun starts over")
            log.warning("stopped by %s; %s", stop, resume)
            sys.exit(128 + stop.signum)
        atomic_write_json(record, args.out)
        if checkpoint is not None:
            checkpoint.discard()
        if record["status"] == "ok":
            best = record["metrics"]["best"]
            log.info("done in %.1fs: best round %d, test acc %.4f, macro-F1 %.4f", record["wall_s"],
                     best["round"], best["test_acc"], best["test_f1_macro"])
        else:
            log.warning("run ended with status %s: %s", record["status"], record.get("message"))

    run_cli(body)


if __name__ == "__main__":
    main()
